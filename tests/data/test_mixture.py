"""The shipped Frontier mixture: its YAMLs validate at their GPU counts, and each stream gets its share."""
import collections
import os
import shutil

import pytest

from llmfoundry_ext.config import read_yaml
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.data.dataloader import build_dataset
from tests.conftest import REPO, write_frontier_data_root


@pytest.fixture(scope='module')
def frontier_data_root(tmp_path_factory) -> str:
    """The shipped YAMLs' train and val stream folders (and a tokenizer), with small random 16-token windows."""
    root = tmp_path_factory.mktemp('lustre')
    write_frontier_data_root(root, window=16, vocab=500, windows=lambda stream: 300 + 100 * stream)
    return str(root)

ON_THE_CPU = ('model.fused_kernels=[]', 'precision=fp32', 'max_seq_len=16')


@pytest.mark.parametrize('yaml_name, world_size', [('llama1b.yaml', 64), ('llama8b.yaml', 256), ('llama70b.yaml', 1024),
                                                   ('mlm1b.yaml', 64)])
def test_shipped_yamls_validate_for_their_cluster(frontier_data_root, monkeypatch, yaml_name, world_size):
    monkeypatch.setenv('WORLD_SIZE', str(world_size))
    # liger's fused cross-entropy and bf16 need a GPU (tests/test_shipped_yamls_gpu.py trains these YAMLs as shipped
    # there); the data here hold 16-token windows, so the shipped sequence length is read from the file
    yaml_path = os.path.join(REPO, 'yamls', yaml_name)
    config = prepare(yaml_path, [f'variables.data_root={frontier_data_root}', *ON_THE_CPU]).config
    tokens_per_step = config.global_batch_size * read_yaml(yaml_path)['max_seq_len']
    assert tokens_per_step * int(config.max_duration.removesuffix('ba')) == pytest.approx(
        {'llama1b.yaml': 100e9, 'llama8b.yaml': 1e12, 'llama70b.yaml': 1.5e12, 'mlm1b.yaml': 100e9}[yaml_name],
        rel=1e-4)
    assert sum(s.proportion for s in config.data.train.streams.values()) == pytest.approx(1.0)
    train, held_out = config.data.train.streams, config.data.eval.streams
    assert {name: (s.local.removesuffix('/val'), s.proportion) for name, s in held_out.items()} == {
        name: (s.local.removesuffix('/train'), s.proportion) for name, s in train.items()}
    assert (config.eval_interval, config.eval_subset_num_batches) == ('1000ba', 20)


def test_without_val_splits_the_eval_section_is_named_and_can_be_dropped(frontier_data_root, tmp_path):
    shutil.copytree(frontier_data_root, tmp_path / 'root')
    shutil.rmtree(tmp_path / 'root' / 'finemath-3plus' / 'val')
    yaml_path, root = os.path.join(REPO, 'yamls', 'llama1b.yaml'), f'variables.data_root={tmp_path / "root"}'
    with pytest.raises(ConfigError) as caught:
        prepare(yaml_path, [root, *ON_THE_CPU])
    assert str(caught.value) == (f'data.eval.streams.finemath.local: no MDS dataset at {tmp_path}/root/finemath-3plus/'
                                 f'val (index.json missing) and no remote set; run data_prep/convert_to_mds.py or fix '
                                 f'the path')
    assert prepare(yaml_path, [root, *ON_THE_CPU, 'data.eval=null']).config.data.eval is None


def test_each_stream_gets_its_proportion_over_20k_samples(frontier_data_root):
    config = prepare(os.path.join(REPO, 'yamls', 'llama1b.yaml'),
                     [f'variables.data_root={frontier_data_root}', *ON_THE_CPU, 'data.train.epoch_size=20000']).config
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
