"""Shared fixtures: tiny MDS datasets and YAML files; the ``gpu`` marker skips without a GPU."""
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import yaml

from data_prep.packing import write_mds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPOSER = shutil.which('composer', path=os.path.dirname(sys.executable)) or shutil.which('composer')


def pytest_configure(config):
    config.addinivalue_line('markers', 'gpu: needs a CUDA GPU (skipped without one)')


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='needs a CUDA GPU')
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip)


def random_windows(count: int, window: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, window, dtype=np.uint32) for _ in range(count)]


@pytest.fixture(scope='session')
def tiny_streams(tmp_path_factory) -> dict[str, str]:
    """Two MDS folders of random 32-token windows over a 512-token vocabulary: {'a': path, 'b': path}."""
    root = tmp_path_factory.mktemp('mds')
    streams = {}
    for seed, name in enumerate(('a', 'b')):
        path = str(root / name)
        write_mds(path, random_windows(400, 32, 512, seed), {'source': f'test:{name}', 'window': 32})
        streams[name] = path
    return streams


@pytest.fixture
def tiny_config(tiny_streams, tmp_path) -> dict:
    """A valid run configuration (as YAML data) for a tiny model on the tiny streams."""
    return {
        'run_name': 'tiny',
        'max_seq_len': 32,
        'global_batch_size': 8,
        'max_duration': '20ba',
        'precision': 'fp32',
        'model': {'preset': 'debug', 'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'ffn_dim': 128,
                  'vocab_size': 512, 'max_seq_len': 64},
        'data': {'train': {'streams': {'a': {'local': tiny_streams['a'], 'proportion': 0.75},
                                       'b': {'local': tiny_streams['b'], 'proportion': 0.25}},
                           'shuffle_seed': 3}},
        'optimizer': {'name': 'decoupled_adamw', 'lr': 1.0e-3},
        'scheduler': {'name': 'cosine_with_warmup', 't_warmup': '2ba'},
        'parallelism': {'fsdp': {'state_dict_type': 'sharded'}},
        'checkpoint': {'save_folder': str(tmp_path / 'checkpoints' / '{run_name}'), 'save_interval': '5ba'},
        'callbacks': {'sample_ledger': {'folder': str(tmp_path / 'ledger' / '{run_name}')}},
        'progress_bar': False,
        'log_interval': '5ba',
    }


def write_yaml(data: dict, path) -> str:
    with open(path, 'w') as file:
        yaml.safe_dump(data, file)
    return str(path)
