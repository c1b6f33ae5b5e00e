"""Packing: documents + EOS concatenated and cut into exact windows; MDS written atomically."""
import json
import os

import numpy as np
from streaming import StreamingDataset

from data_prep.packing import pack, tokenize_documents, write_mds
from data_prep.train_tokenizer import BOS, EOS, train_bpe


def test_pack_cuts_the_concatenation_and_drops_the_tail():
    windows = list(pack([[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]], window=4))
    assert [w.tolist() for w in windows] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert windows[0].dtype == np.uint32


def test_tokenize_documents_wraps_each_in_bos_and_eos():
    tokenizer = train_bpe(['hello world'] * 20 + ['a b c d'] * 20, vocab_size=300)
    eos, bos = tokenizer.token_to_id(EOS), tokenizer.token_to_id(BOS)
    documents = list(tokenize_documents(['hello world', 'a b'], tokenizer, eos, bos, batch_size=1))
    assert [d[0] for d in documents] == [bos, bos] and [d[-1] for d in documents] == [eos, eos]
    assert tokenizer.decode(documents[0][1:-1]) == 'hello world'


def test_write_mds_round_trip_and_manifest(tmp_path):
    windows = [np.arange(i, i + 8, dtype=np.uint32) for i in range(0, 80, 8)]
    out = str(tmp_path / 'mds')
    manifest = write_mds(out, iter(windows), {'source': 'test', 'window': 8})
    assert (manifest['windows'], manifest['tokens']) == (10, 80)
    assert json.load(open(os.path.join(out, 'manifest.json')))['tokens'] == 80
    assert not os.path.exists(out + '.partial')
    dataset = StreamingDataset(local=out, shuffle=False, batch_size=1)
    assert np.concatenate([dataset[i]['tokens'] for i in range(len(dataset))]).tolist() == list(range(80))
