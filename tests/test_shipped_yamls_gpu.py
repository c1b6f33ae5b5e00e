"""On the GPUs present: every shipped YAML trains as shipped (its model width, sequence, compile, fused kernels,
optimizer, activation checkpointing, data mixture and evaluation), through ``composer -n <GPUs> train.py``, with only
the data root, the batch, the layer count (to fit the GPUs at hand) and the step count reduced; it writes a sharded
checkpoint, and the same command run again finds the run complete."""
import gc
import math
import os
import re
import shutil
import subprocess

import pytest
import torch

from llmfoundry_ext.resumption import SEAL
from tests.conftest import COMPOSER, REPO, write_frontier_data_root

pytestmark = pytest.mark.gpu

STEPS = 4
LLAMA3_VOCAB, MIXTRAL_VOCAB = 128256, 32000


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> str:
    """The six streams' train/val folders with 8,192-token windows of random Llama-3 ids: as many per train stream as
    the largest YAML has canonical nodes (1,024), 64 per val stream (streaming's default count)."""
    root = tmp_path_factory.mktemp('lustre')
    write_frontier_data_root(root, window=8192, vocab=LLAMA3_VOCAB, windows=lambda stream: 1024 if stream < 6 else 64)
    return str(root)


@pytest.fixture(scope='module')
def mixtral_data_root(tmp_path_factory) -> str:
    """The same streams in Mixtral's tokens: 4,096-token windows of ids below 32,000, tokenizer/mixtral with </s>."""
    root = tmp_path_factory.mktemp('lustre-mixtral')
    write_frontier_data_root(root, window=4096, vocab=MIXTRAL_VOCAB, windows=lambda stream: 1024 if stream < 6 else 64,
                             tokenizer='mixtral', special_tokens=('</s>',))
    return str(root)


@pytest.fixture(scope='module')
def long_data_root(tmp_path_factory) -> str:
    """The same streams with 131,072-token windows: 32 per train stream (twice the YAML's canonical nodes), 8 per
    val stream."""
    root = tmp_path_factory.mktemp('lustre-131k')
    write_frontier_data_root(root, window=131072, vocab=LLAMA3_VOCAB, windows=lambda stream: 32 if stream < 6 else 8)
    return str(root)


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def fitting_layers(yaml_name: str) -> list[str]:
    """The layer count that fits the GPUs present: all 16 of the 1B models; 4 of the 8B, 2 of Mixtral-8x7B and 1-2
    of the 70B (their fp32 weights and Adam state alone: 8B 128 GB, Mixtral 747 GB, 70B 1.1 TB)."""
    if yaml_name == 'llama8b.yaml':
        return ['model.n_layers=4']
    if yaml_name == 'llama8b-131k.yaml':  # and from scratch: no Llama-3.1-8B on the GPU machines
        return ['model.n_layers=4', 'variables.init_from=null']
    if yaml_name == 'mixtral8x7b.yaml':
        return ['model.n_layers=2']
    if yaml_name == 'llama70b.yaml':
        return [f'model.n_layers={1 if gpus() == 1 else 2}']
    return []


def train(yaml_name: str, data_root: str, checkpoints: str) -> subprocess.CompletedProcess:
    # two micro-batches of the YAML's (4 or 1): gradient accumulation; 131k: two sequences a context-parallel group
    per_gpu = 8 if '1b' in yaml_name else 1 if '131k' in yaml_name else 2
    command = [COMPOSER, '-n', str(gpus()), 'train.py', f'yamls/{yaml_name}', f'variables.data_root={data_root}',
               f'variables.checkpoint_root={checkpoints}', f'global_batch_size={per_gpu * gpus()}',
               f'max_duration={STEPS}ba', f'checkpoint.save_interval={STEPS}ba', 'log_interval=1ba',
               'eval_subset_num_batches=2', *fitting_layers(yaml_name)]
    print(' '.join(command))
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, 'PYTHONUNBUFFERED': '1'})


@pytest.mark.timeout(1800)
@pytest.mark.parametrize('yaml_name', ['llama1b.yaml', 'mlm1b.yaml', 'llama8b.yaml', 'llama70b.yaml',
                                       'mixtral8x7b.yaml', 'llama8b-131k.yaml'])
def test_shipped_yaml_trains_on_the_gpus_and_checkpoints(yaml_name, request, tmp_path):
    mixtral = yaml_name.startswith('mixtral')
    if '131k' in yaml_name and gpus() < 2:
        pytest.skip('context parallel 2 needs 2 GPUs')
    fixture = 'mixtral_data_root' if mixtral else 'long_data_root' if '131k' in yaml_name else 'data_root'
    data_root = request.getfixturevalue(fixture)
    vocab = MIXTRAL_VOCAB if mixtral else LLAMA3_VOCAB
    gc.collect()
    torch.cuda.empty_cache()  # what earlier tests in this process cached, the training process needs
    checkpoints = tmp_path / 'checkpoints'  # up to 36 GB (70B, one layer): removed at the end
    try:
        run = train(yaml_name, data_root, str(checkpoints))
        print(run.stdout[-6000:])
        assert run.returncode == 0, run.stderr[-4000:]
        losses = [float(value) for value in re.findall(r'^batch \d+/\d+  loss (\S+)', run.stdout, re.MULTILINE)]
        assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses)
        assert abs(losses[0] - math.log(vocab)) < 1.0  # a fresh model predicts about uniformly: ln(vocabulary)
        run_name = re.search(r'^run (\S+): \w+ preset', run.stdout, re.MULTILINE).group(1)
        if gpus() == 1:  # one process trains unsharded: one file, its seal beside it
            assert os.path.isfile(checkpoints / run_name / f'.ep0-ba{STEPS}-rank0.pt{SEAL}')
        else:
            saved = sorted(os.listdir(checkpoints / run_name / f'ep0-ba{STEPS}'))
            assert saved == [SEAL, '.metadata'] + [f'__{rank}_0.distcp' for rank in range(gpus())]
        again = train(yaml_name, data_root, str(checkpoints))
        assert again.returncode == 0, again.stderr[-4000:]
        assert f'run {run_name} is already complete ({STEPS}ba)' in again.stdout
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
