"""The shipped Frontier mixture: its YAMLs validate at their GPU counts, and each stream gets its share."""
import collections
import os

import pytest
from omegaconf import OmegaConf

from data_prep.packing import write_mds
from data_prep.train_tokenizer import train_bpe
from llmfoundry_ext.config import load
from llmfoundry_ext.data.dataloader import build_dataset
from tests.conftest import REPO, random_windows


@pytest.fixture(scope='module')
def frontier_data_root(tmp_path_factory) -> str:
    """The 1B YAML's stream folders (and a tokenizer) filled with small random token windows."""
    root = tmp_path_factory.mktemp('lustre')
    raw = OmegaConf.load(os.path.join(REPO, 'yamls', 'llama1b.yaml'))
    raw.variables.data_root = str(root)
    for seed, stream in enumerate(OmegaConf.to_container(raw, resolve=True)['data']['train']['streams'].values()):
        write_mds(stream['local'], random_windows(300 + 100 * seed, 16, 500, seed), {'source': 't', 'window': 16})
    os.makedirs(root / 'tokenizer' / 'llama3')
    tokenizer = train_bpe(['some text'] * 10, vocab_size=300)
    tokenizer.add_special_tokens(['<|reserved_special_token_100|>'])
    tokenizer.save(str(root / 'tokenizer' / 'llama3' / 'tokenizer.json'))
    return str(root)


@pytest.mark.parametrize('yaml_name, world_size', [('llama1b.yaml', 64), ('llama8b.yaml', 256), ('llama70b.yaml', 1024),
                                                   ('mlm1b.yaml', 64)])
def test_shipped_yamls_validate_for_their_cluster(frontier_data_root, monkeypatch, yaml_name, world_size):
    monkeypatch.setenv('WORLD_SIZE', str(world_size))
    config = load(os.path.join(REPO, 'yamls', yaml_name), [f'variables.data_root={frontier_data_root}'])
    assert config.tokens_per_step * int(config.max_duration.removesuffix('ba')) == pytest.approx(
        {'llama1b.yaml': 100e9, 'llama8b.yaml': 1e12, 'llama70b.yaml': 1.5e12, 'mlm1b.yaml': 100e9}[yaml_name],
        rel=1e-4)
    assert sum(s.proportion for s in config.data.train.streams.values()) == pytest.approx(1.0)


def test_each_stream_gets_its_proportion_over_20k_samples(frontier_data_root):
    config = load(os.path.join(REPO, 'yamls', 'llama1b.yaml'),
                  [f'variables.data_root={frontier_data_root}', 'max_seq_len=16',
                   'data.train.epoch_size=20000'])
    dataset = build_dataset(config.data.train, device_batch_size=16)
    names = list(config.data.train.streams)
    counts = collections.Counter()
    for position, sample in enumerate(dataset):
        if position == 20_000:
            break
        shard, _ = dataset.spanner[sample['sample_id']]
        counts[names[dataset.stream_per_shard[shard]]] += 1
    assert sum(counts.values()) == 20_000
    for name, stream in config.data.train.streams.items():
        assert abs(counts[name] / 20_000 - stream.proportion) < 0.01, (name, counts[name])
