"""The evaluation set reads the same samples at every evaluation; the training set moves on each epoch; a damaged
shard in the local folder stops the run in one line naming it."""
import json
import shutil

import pytest
import xxhash
from streaming.base.compression import decompress

from llmfoundry_ext.config import LoaderConfig, StreamConfig
from llmfoundry_ext.data.dataloader import build_dataset
from llmfoundry_ext.data.mds import HASH
from llmfoundry_ext.errors import TrainingStopped


def first_samples(dataset, count: int) -> list[int]:
    samples = iter(dataset)
    return [next(samples)['sample_id'] for _ in range(count)]


def test_every_pass_over_the_held_out_set_reads_the_same_samples_and_training_passes_do_not(tiny_streams):
    loader = LoaderConfig(streams={name: StreamConfig(local=path, proportion=share)
                                   for (name, path), share in zip(tiny_streams.items(), (0.7, 0.3))}, shuffle_seed=5)
    held_out = build_dataset(loader, device_batch_size=8, held_out=True)
    passes = [first_samples(held_out, 64) for _ in range(3)]
    assert passes[0] == passes[1] == passes[2]
    assert 0 < sum(sample >= 400 for sample in passes[0]) < 64  # a mix of both streams (b's ids start at 400)
    training = build_dataset(loader, device_batch_size=8)
    assert first_samples(training, 64) == passes[0]  # both start at epoch 0 ...
    assert first_samples(training, 64) != passes[0]  # ... and training's next pass is epoch 1


def damaged_beside(source: str, folder, checksums: bool) -> str:
    """A copy of ``source`` with its first shard decompressed beside its .zstd (as streaming leaves it once read) and
    64 bytes overwritten in place, its size unchanged: in its middle (samples' tokens: its header intact, preflight's
    checks pass), or, ``checksums=False``, its index.json as a conversion before checksums wrote it and the bytes in
    its offsets (a decoding error). The decompressed shard's path."""
    shutil.copytree(source, folder)
    index = json.loads((folder / 'index.json').read_text())
    if not checksums:
        for shard in index['shards']:
            shard['raw_data']['hashes'] = shard['zip_data']['hashes'] = {}
        (folder / 'index.json').write_text(json.dumps(index))
    compressed = folder / index['shards'][0]['zip_data']['basename']
    raw = bytearray(decompress('zstd', compressed.read_bytes()))
    at = len(raw) // 2 if checksums else 12
    raw[at:at + 64] = b'\xff' * 64
    decompressed = folder / index['shards'][0]['raw_data']['basename']
    decompressed.write_bytes(bytes(raw))
    return str(decompressed)


@pytest.mark.parametrize('held_out', [False, True], ids=['train', 'eval'])
@pytest.mark.parametrize('checksums, problem', [
    (True, 'ValueError: its xxh3_64 checksum is {found}, index.json records {recorded}'),
    (False, 'IndexError: Relative sample index 2 is not present in the shard.00000.mds file.')])
def test_a_damaged_decompressed_shard_stops_the_run_in_one_line_naming_it(tiny_streams, tmp_path, held_out,
                                                                           checksums, problem):
    """Checked against the checksum the conversion recorded, before the first read; without one, its decoding
    failure (streaming's IndexError) named."""
    path = damaged_beside(tiny_streams['a'], tmp_path / 'a', checksums)
    loader = LoaderConfig(streams={'a': StreamConfig(local=str(tmp_path / 'a'))}, shuffle=False)
    with pytest.raises(TrainingStopped) as stopped:
        list(build_dataset(loader, device_batch_size=8, held_out=held_out))
    recorded = json.loads((tmp_path / 'a' / 'index.json').read_text())['shards'][0]['raw_data']['hashes']
    found = xxhash.xxh3_64_hexdigest(open(path, 'rb').read())
    assert str(stopped.value) == (
        f'shard {path} cannot be read ({problem.format(found=found, recorded=recorded.get(HASH))}); re-convert its '
        f'stream with data_prep/convert_to_mds.py (or restore the file), then run the same command: it resumes from '
        f'the last checkpoint')
