"""What the command-line tools share: argument errors as one line (exit status 2), argument types that check."""
import argparse
import os
import sys


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but an error is one line (argparse prints the usage above it) naming ``--help``."""

    def error(self, message: str):
        print(f'error: {message} (see {self.prog} --help)', file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'must be at least 1, got {value}')
    return value


def fraction(text: str) -> float:
    """A share in [0, 1)."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f'must be in [0, 1), got {value}')
    return value


def unwritable_reason(path: str) -> str | None:
    """Why ``path`` (a folder to create or fill) cannot be written, from its nearest existing ancestor; or None."""
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f'{ancestor} is a file, not a folder'
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f'{ancestor} is not writable'
    return None
