"""Packing: documents + EOS concatenated and cut into exact windows."""
import numpy as np

from data_prep.packing import pack, tokenize_documents
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
