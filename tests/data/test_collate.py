"""Collation: next-token labels, document boundaries against hand-made references, masked-LM masking."""
import pytest
import torch

from llmfoundry_ext.data.collate import Collator, document_positions
from llmfoundry_ext.model.attention import document_mask

EOS, MASK = 1, 99


def windows(*rows):
    return [{'tokens': torch.tensor(row), 'sample_id': i} for i, row in enumerate(rows)]


def test_causal_labels_are_the_next_tokens():
    """A window of max_seq_len + 1 tokens labels every position (torchtitan's samples); one of max_seq_len leaves
    the last position without a label."""
    batch = Collator(max_seq_len=5)(windows([10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24]))
    assert batch['input_ids'].tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    assert batch['labels'].tolist() == [[11, 12, 13, 14, 15], [21, 22, 23, 24, -100]]
    assert batch['sample_ids'].tolist() == [0, 1]
    assert 'position_ids' not in batch


def test_short_sample_names_the_fix():
    with pytest.raises(ValueError, match='a sample has 3 tokens, fewer than max_seq_len 5: convert the data with '
                                         '--concat-tokens >= 5 or lower max_seq_len'):
        Collator(max_seq_len=5)(windows([1, 2, 3]))


@pytest.mark.parametrize('rows, positions, cu_seqlens', [
    # one document per row: positions count from 0, one boundary per row
    ([[5, 6, 7, 8]], [[0, 1, 2, 3]], [0, 4]),
    # EOS inside the row: the next token starts a document; a trailing EOS starts nothing
    ([[5, EOS, 6, 7, EOS, 8, 9, EOS]], [[0, 1, 0, 1, 2, 0, 1, 2]], [0, 2, 5, 8]),
    # two rows: each row starts a document, offsets run over the flattened batch
    ([[EOS, 5, 6, EOS], [7, 8, EOS, 9]], [[0, 0, 1, 2], [0, 1, 2, 0]], [0, 1, 4, 7, 8]),
    # EOS, EOS: an empty-looking document of one token
    ([[5, EOS, EOS, 6]], [[0, 1, 0, 0]], [0, 2, 3, 4]),
])
def test_document_positions_match_hand_computed(rows, positions, cu_seqlens):
    """The collator's positions, and the cu_seqlens the model derives from them for varlen kernels."""
    position_ids = document_positions(torch.tensor(rows), EOS)
    assert position_ids.tolist() == positions
    documents = document_mask('varlen', position_ids, causal=True)
    assert documents.cu_seqlens.tolist() == cu_seqlens and documents.cu_seqlens.dtype == torch.int32


def test_collator_adds_positions_when_asked():
    batch = Collator(max_seq_len=6, eos_id=EOS)(windows([5, EOS, 6, 7, EOS, 8, 9]))
    assert batch['position_ids'].tolist() == [[0, 1, 0, 1, 2, 0]]
    assert set(batch) == {'input_ids', 'labels', 'sample_ids', 'position_ids'}


def test_mlm_masks_at_the_rate_asked_and_labels_only_masked_positions():
    collate = Collator(max_seq_len=1000, objective='mlm', mask_probability=0.3, mask_token_id=MASK, seed=7)
    samples = [{'tokens': torch.randint(2, 90, (1000,)), 'sample_id': i} for i in range(1000)]  # 1M tokens
    batch = collate(samples)
    original = torch.stack([s['tokens'] for s in samples])
    masked = batch['input_ids'] == MASK
    assert abs(masked.float().mean().item() - 0.3) < 0.003  # within 1 % of p
    assert torch.equal(batch['labels'][masked], original[masked])
    assert torch.all(batch['labels'][~masked] == -100)
    assert torch.equal(batch['input_ids'][~masked], original[~masked])


def test_mlm_mask_depends_only_on_seed_and_sample_id():
    collate = Collator(max_seq_len=64, objective='mlm', mask_probability=0.3, mask_token_id=MASK, seed=7)
    tokens = torch.randint(2, 90, (64,))
    alone = collate([{'tokens': tokens, 'sample_id': 42}])
    in_batch = collate([{'tokens': tokens.flip(0), 'sample_id': 3}, {'tokens': tokens, 'sample_id': 42}])
    assert torch.equal(alone['input_ids'][0], in_batch['input_ids'][1])
    other_seed = Collator(max_seq_len=64, objective='mlm', mask_probability=0.3, mask_token_id=MASK, seed=8)
    assert not torch.equal(alone['input_ids'], other_seed([{'tokens': tokens, 'sample_id': 42}])['input_ids'])
