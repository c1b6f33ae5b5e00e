"""The token format: MDS windows and their manifest, written atomically."""
import json
import os

import numpy as np
import pytest
from streaming import MDSWriter, StreamingDataset

from llmfoundry_ext.data.mds import COLUMNS, COMPRESSION, HASH, SHARD_SIZE, ShardWriter, write_mds


def test_write_mds_round_trip_and_manifest(tmp_path):
    windows = [np.arange(i, i + 8, dtype=np.uint32) for i in range(0, 80, 8)]
    out = str(tmp_path / 'mds')
    manifest = write_mds(out, iter(windows), {'source': 'test', 'window': 8})
    assert (manifest['windows'], manifest['tokens']) == (10, 80)
    assert json.load(open(os.path.join(out, 'manifest.json')))['tokens'] == 80
    assert not os.path.exists(out + '.partial')
    dataset = StreamingDataset(local=out, shuffle=False, batch_size=1)
    assert np.concatenate([dataset[i]['tokens'] for i in range(len(dataset))]).tolist() == list(range(80))


@pytest.mark.parametrize('window, count', [(8, 30), (300, 30), (70_000, 3), (16_384, 1_100)],
                         ids=['uint8-shape', 'uint16-shape', 'uint32-shape', 'two-shards'])
def test_shard_writer_writes_the_bytes_of_streamings_mds_writer(tmp_path, window, count):
    windows = [np.random.default_rng(i).integers(0, 128_256, window, dtype=np.uint32) for i in range(count)]
    ours, theirs = tmp_path / 'ours', tmp_path / 'theirs'
    ours.mkdir()
    writer = ShardWriter(str(ours))
    for tokens in windows:
        writer.write(tokens)
    writer.finish()
    with MDSWriter(out=str(theirs), columns=COLUMNS, compression=COMPRESSION, hashes=[HASH],
                   size_limit='64mb') as reference:
        assert reference.size_limit == SHARD_SIZE
        for tokens in windows:
            reference.write({'tokens': tokens})
    names = sorted(os.listdir(theirs))
    assert sorted(os.listdir(ours)) == names
    assert len(names) == (3 if count == 1_100 else 2)  # the shards and index.json
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


def test_shard_writer_refuses_a_window_that_is_not_uint32():
    with pytest.raises(ValueError, match='a window is a non-empty 1-D uint32 array, not int64 of shape'):
        ShardWriter('unused').write(np.arange(4))
