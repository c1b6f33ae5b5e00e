"""The causal-LM collator: exact labels and a clear error for short samples."""
import pytest
import torch

from llmfoundry_ext.data.dataloader import collate_causal_lm


def test_labels_are_next_tokens_with_ignore_at_the_end():
    samples = [{'tokens': torch.arange(10, 16), 'sample_id': 4}, {'tokens': torch.arange(20, 26), 'sample_id': 9}]
    batch = collate_causal_lm(samples, max_seq_len=5)
    assert batch['input_ids'].tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    assert batch['labels'].tolist() == [[11, 12, 13, 14, -100], [21, 22, 23, 24, -100]]
    assert batch['sample_ids'].tolist() == [4, 9]


def test_short_sample_names_the_fix():
    with pytest.raises(ValueError, match='a sample has 3 tokens, fewer than max_seq_len 5: convert the data with '
                                         '--concat-tokens >= 5 or lower max_seq_len'):
        collate_causal_lm([{'tokens': torch.arange(3), 'sample_id': 0}], max_seq_len=5)
