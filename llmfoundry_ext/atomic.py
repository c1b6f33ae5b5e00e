"""Folders that appear whole or not at all: shards and checkpoints are never visible half-written."""
import os
import shutil
from contextlib import contextmanager


@contextmanager
def atomic_folder(out: str):
    """Yield an empty ``<out>.partial`` folder to fill; it replaces ``out`` only once the block completes."""
    partial = out.rstrip('/') + '.partial'
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    yield partial
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: readers see the old or the new file."""
    with open(path + '.tmp', 'w') as file:
        file.write(text)
    os.replace(path + '.tmp', path)
