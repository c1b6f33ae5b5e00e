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
