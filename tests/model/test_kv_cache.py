"""The KV cache: a forward of the next tokens after those cached gives the logits of a forward of the whole text."""
from dataclasses import asdict

import pytest
import torch

from llmfoundry_ext.model.kv_cache import KVCache, caching
from llmfoundry_ext.model.llama import Transformer
from llmfoundry_ext.model.mixtral import Mixtral, MixtralConfig
from tests.model.test_llama import TINY


@pytest.mark.parametrize('family', ['llama', 'mixtral'])
def test_tokens_read_after_the_cached_ones_get_the_logits_of_the_whole_text(family):
    torch.manual_seed(0)
    model = (Transformer(TINY) if family == 'llama' else
             Mixtral(MixtralConfig(**{**asdict(TINY), 'n_experts': 4, 'experts_per_token': 2}))).eval()
    model.init_weights()
    text = torch.randint(0, TINY.vocab_size, (2, 12))
    with torch.no_grad():
        whole = model(text)
        pieces = []
        with caching(model, rows=2, length=12):
            for start, end in ((0, 7), (7, 8), (8, 12)):  # a prompt, then one token, then four
                positions = torch.arange(start, end)[None]
                mask = torch.ones(end, end, dtype=torch.bool).tril()[None, None, start:end]
                pieces.append(model(text[:, start:end], positions, attention_mask=mask))
    if family == 'mixtral':
        whole, pieces = whole[0], [logits for logits, _ in pieces]
    assert torch.cat(pieces, dim=1) == pytest.approx(whole, abs=1e-5)
    assert all(layer.self_attn.kv_cache is None for layer in model.layers)  # set only inside caching


def test_a_cache_refuses_more_tokens_than_it_holds():
    cache = KVCache(rows=1, length=4)
    cache.append(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match='^the cache holds 4 tokens a row; 5 asked$'):
        cache.append(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8))
