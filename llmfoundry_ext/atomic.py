"""Folders that appear whole or not at all: shards and checkpoints are never visible half-written."""
import os
import shutil
import uuid
from contextlib import contextmanager, suppress


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
    """Write ``text`` to ``path`` through a temporary file of this writer's own and a rename: readers see the old or
    the new file, and two writers of the same file (nodes finishing a conversion together) never share a temporary."""
    temporary = f'{path}.{uuid.uuid4().hex}.tmp'
    with open(temporary, 'w') as file:
        file.write(text)
    os.replace(temporary, path)


@contextmanager
def atomic_file(path: str, mode: str = 'wb'):
    """Yield ``<path>.<id>.partial`` open for writing; flushed, fsynced and renamed to ``path`` once the block
    completes, removed if it fails (a full disk leaves nothing under either name)."""
    temporary = f'{path}.{uuid.uuid4().hex}.partial'
    try:
        with open(temporary, mode) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        with suppress(FileNotFoundError):
            os.remove(temporary)
