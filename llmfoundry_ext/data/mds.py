"""The on-disk token format, owned here: MDS shards of one ``tokens`` column (uint32, zstd), written atomically,
with a manifest.json (what was converted, with which tokenizer) beside them."""
import hashlib
import json
import os
from collections.abc import Iterable

import numpy as np
from streaming import MDSWriter

from llmfoundry_ext.atomic import atomic_folder

TOKENS = 'tokens'
COLUMNS = {TOKENS: 'ndarray:uint32'}  # Llama-3's 128,256 ids do not fit uint16
COMPRESSION = 'zstd'
SHARD_SIZE = '64mb'
MANIFEST = 'manifest.json'


def shard_writer(folder: str) -> MDSWriter:
    """An MDSWriter of token windows into ``folder`` (write ``{TOKENS: window}`` records)."""
    return MDSWriter(out=folder, columns=COLUMNS, compression=COMPRESSION, size_limit=SHARD_SIZE)


def write_mds(out: str, windows: Iterable[np.ndarray], manifest: dict) -> dict:
    """Write windows as MDS into ``out`` with its manifest (``windows`` and ``tokens`` added), atomically: built in
    ``out.partial``, then renamed. Returns the manifest."""
    with atomic_folder(out) as partial:
        count = 0
        with shard_writer(partial) as writer:
            for window in windows:
                writer.write({TOKENS: window})
                count += 1
        manifest = {**manifest, 'windows': count, 'tokens': count * manifest['window']}
        with open(os.path.join(partial, MANIFEST), 'w') as file:
            json.dump(manifest, file, indent=2)
    return manifest


def file_sha256(path: str) -> str:
    with open(path, 'rb') as file:
        return hashlib.sha256(file.read()).hexdigest()


def read_manifest(folder: str) -> dict | None:
    """The folder's manifest, or None where there is none (e.g. shards made by another tool); ValueError naming
    the file if it is not JSON."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        try:
            return json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f'{path}: not JSON ({error})') from None
