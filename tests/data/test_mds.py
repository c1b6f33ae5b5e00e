"""The token format: MDS windows and their manifest, written atomically."""
import json
import os

import numpy as np
from streaming import StreamingDataset

from llmfoundry_ext.data.mds import write_mds


def test_write_mds_round_trip_and_manifest(tmp_path):
    windows = [np.arange(i, i + 8, dtype=np.uint32) for i in range(0, 80, 8)]
    out = str(tmp_path / 'mds')
    manifest = write_mds(out, iter(windows), {'source': 'test', 'window': 8})
    assert (manifest['windows'], manifest['tokens']) == (10, 80)
    assert json.load(open(os.path.join(out, 'manifest.json')))['tokens'] == 80
    assert not os.path.exists(out + '.partial')
    dataset = StreamingDataset(local=out, shuffle=False, batch_size=1)
    assert np.concatenate([dataset[i]['tokens'] for i in range(len(dataset))]).tolist() == list(range(80))
