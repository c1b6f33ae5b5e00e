"""The on-disk token format, owned here: MDS shards of one ``tokens`` column (uint32, zstd), written atomically,
with a manifest.json (what was converted, with which tokenizer) beside them."""
import hashlib
import json
import os
from collections.abc import Iterable

import numpy as np
import xxhash
import zstd

from llmfoundry_ext.atomic import atomic_folder

TOKENS = 'tokens'
COLUMNS = {TOKENS: 'ndarray:uint32'}  # Llama-3's 128,256 ids do not fit uint16
COMPRESSION = 'zstd'
ZSTD_LEVEL = 3  # streaming's default for 'zstd'
SHARD_SIZE = 64 << 20  # bytes; streaming's size_limit '64mb'
HASH = 'xxh3_64'  # each shard file's checksum in index.json, as streaming's MDSWriter(hashes=[HASH]) records it:
#                   streaming checks a compressed shard against it before decompressing (validate_hash), the
#                   loader a decompressed one before its first read (data/dataloader.py)
MANIFEST = 'manifest.json'
SHAPE_DTYPES = ((1 << 8, 'uint8'), (1 << 16, 'uint16'), (1 << 32, 'uint32'))  # MDS's ndarray shape codes 0, 1, 2


class ShardWriter:
    """Token windows -> MDS shards in ``folder``, the bytes streaming's ``MDSWriter(columns=COLUMNS,
    compression=COMPRESSION, hashes=[HASH], size_limit=SHARD_SIZE)`` writes (a test compares them, shards and
    index).

    Our own because importing ``streaming`` imports torch: 3 s in every converting process, as long as tokenizing
    25 MB. Local folders only (the converter's parts); ``write`` takes one window, ``finish`` writes index.json."""

    CONFIG = {'column_encodings': [COLUMNS[TOKENS]], 'column_names': [TOKENS], 'column_sizes': [None],
              'compression': COMPRESSION, 'format': 'mds', 'hashes': [HASH], 'size_limit': SHARD_SIZE, 'version': 2}
    CONFIG_BYTES = json.dumps(CONFIG, sort_keys=True).encode('utf-8')
    EMPTY_SHARD_BYTES = 8 + len(CONFIG_BYTES)  # a shard's sample count and end offset, and its config

    def __init__(self, folder: str):
        self.folder = folder
        self.samples: list[bytes] = []
        self.size = self.EMPTY_SHARD_BYTES
        self.shards: list[dict] = []

    def write(self, window: np.ndarray) -> None:
        sample = encode_window(window)
        if SHARD_SIZE < self.size + len(sample) + 4:  # + its offset
            self.flush()
        self.samples.append(sample)
        self.size += len(sample) + 4

    def flush(self) -> None:
        """One shard of the samples so far: [count][offsets][config][samples], zstd-compressed."""
        count = len(self.samples)
        offsets = np.cumsum([0] + [len(s) for s in self.samples], dtype=np.uint32)
        offsets += 4 + offsets.nbytes + len(self.CONFIG_BYTES)
        raw = np.uint32(count).tobytes() + offsets.tobytes() + self.CONFIG_BYTES + b''.join(self.samples)
        name = f'shard.{len(self.shards):05}.mds'
        compressed = zstd.compress(raw, ZSTD_LEVEL)
        with open(os.path.join(self.folder, f'{name}.zstd'), 'wb') as file:
            file.write(compressed)
        self.shards.append({'samples': count,
                            'raw_data': {'basename': name, 'bytes': len(raw), 'hashes': checksum(raw)},
                            'zip_data': {'basename': f'{name}.zstd', 'bytes': len(compressed),
                                         'hashes': checksum(compressed)},
                            **self.CONFIG})
        self.samples, self.size = [], self.EMPTY_SHARD_BYTES

    def finish(self) -> None:
        if self.samples:
            self.flush()
        with open(os.path.join(self.folder, 'index.json'), 'w') as file:
            json.dump({'version': 2, 'shards': self.shards}, file, sort_keys=True)


def checksum(data: bytes) -> dict[str, str]:
    """A shard file's entry of hashes in index.json ({HASH: hex digest}, as streaming's ``get_hash`` gives it)."""
    return {HASH: xxhash.xxh3_64_hexdigest(data)}


def encode_window(window: np.ndarray) -> bytes:
    """One sample: its column's byte size, then MDS's ndarray encoding ([ndim << 2 | shape code][shape][values])."""
    if window.dtype != np.uint32 or window.ndim != 1 or not window.size:
        raise ValueError(f'a window is a non-empty 1-D uint32 array, not {window.dtype} of shape {window.shape}')
    code, dtype = next((code, dtype) for code, (limit, dtype) in enumerate(SHAPE_DTYPES) if window.size < limit)
    datum = bytes([1 << 2 | code]) + np.array(window.shape, dtype).tobytes() + window.tobytes()
    return np.uint32(len(datum)).tobytes() + datum


def write_mds(out: str, windows: Iterable[np.ndarray], manifest: dict) -> dict:
    """Write windows as MDS into ``out`` with its manifest (``windows`` and ``tokens`` added), atomically: built in
    ``out.partial``, then renamed. Returns the manifest."""
    with atomic_folder(out) as partial:
        writer = ShardWriter(partial)
        count = 0
        for window in windows:
            writer.write(window)
            count += 1
        writer.finish()
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
