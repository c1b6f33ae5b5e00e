"""Shared fixtures: tiny MDS datasets and YAML files; the ``gpu`` marker skips without a GPU."""
import copy
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

if not torch.cuda.is_available():
    # Inductor on the CPU, in the suite's processes and those they start (read when its config first imports): it
    # compiles in the compiling process (no pool of compile workers, each importing torch, to start), and takes the
    # C++ compiler's vector instructions to work (its probe of each otherwise builds and loads a program in a
    # subprocess of its own, each compiling process)
    os.environ.setdefault('TORCHINDUCTOR_COMPILE_THREADS', '1')
    os.environ.setdefault('TORCHINDUCTOR_VEC_ISA_OK', '1')

from llmfoundry_ext.data.mds import write_mds  # noqa: E402  (after the environment above)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the ``composer`` command as users run it (the shipped YAMLs on GPUs); the CPU tests of a launch run Composer's
# launcher through llmfoundry_ext.launch (LAUNCHER: the same code, ~4.5 s sooner), the others fork their ranks from
# one import (FORKED: tests/forked_launch.py)
COMPOSER = shutil.which('composer', path=os.path.dirname(sys.executable)) or shutil.which('composer')
FORKED = [sys.executable, os.path.join(REPO, 'tests', 'forked_launch.py')]


def pytest_configure(config):
    config.addinivalue_line('markers', 'gpu: needs a CUDA GPU (skipped without one)')
    config.addinivalue_line('markers', 'slow: runs for tens of seconds (it starts processes): collected first')


def pytest_collection_modifyitems(config, items):
    """The slow tests first: ``make test``'s workers take tests one by one (--maxschedchunk 1), so they start the long
    ones together and the short ones fill in, instead of one worker ending on a long test alone."""
    items.sort(key=lambda item: 'slow' not in item.keywords)  # stable: collection order otherwise
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='needs a CUDA GPU')
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def tf32_as_the_test_found_it():
    """Composer's GPU device turns TF32 matmuls on for the process (``DeviceGPU(allow_tf32=True)``); a training test
    would leave them on for the fp32 comparisons that follow it in the same process."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.fixture(autouse=True, scope='session')
def launch_server(tmp_path_factory):
    """This pytest process's fork server for the launches of FORKED (tests/launch_server.py), named to them by the
    environment they inherit: one import of the trainer for all of them. It ends with this process."""
    import subprocess
    from tests.forked_launch import SERVER
    path = str(tmp_path_factory.mktemp('launch-server') / 'socket')
    server = subprocess.Popen([sys.executable, os.path.join(REPO, 'tests', 'launch_server.py'), path],
                              stdin=subprocess.PIPE, cwd=REPO, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    while not os.path.exists(path):  # bound first thing: a launch before it would have been forked without it
        assert server.poll() is None, f'the launch server ended with exit status {server.returncode}'
        time.sleep(0.01)
    os.environ[SERVER] = path
    yield path
    del os.environ[SERVER]
    server.stdin.close()
    server.wait(timeout=60)


@pytest.fixture(autouse=True, scope='session')
def shared_memory_prefixes_without_races():
    """The suite's two workers (pytest-xdist) start StreamingDatasets in one /dev/shm, as two jobs on a node do: the
    datasets tests make themselves register their prefixes as the trainer's do (``data/shm_prefix.py``)."""
    import streaming.base.dataset as dataset

    from llmfoundry_ext.data.shm_prefix import use_race_free_prefixes

    original = dataset.get_shm_prefix
    use_race_free_prefixes()
    yield
    dataset.get_shm_prefix = original


def train_runs(processes: int, runs: list[str], env: dict | None = None, worker: list[str] | None = None) -> list[str]:
    """Each run (a YAML and its overrides, shell words) trained in turn in one launch of ``processes`` forked ranks
    (tests/training_runs_worker.py, or ``worker``: a script and its first arguments, FORKED); each run's output.
    ``env``: the launch's environment (default: this one's)."""
    import subprocess

    from tests.training_runs_worker import RUN_MARK
    worker = worker or ['tests/training_runs_worker.py']
    launch = subprocess.run([*FORKED, '-n', str(processes), *worker, *runs], cwd=REPO,
                            env={**(env or os.environ), 'OMP_NUM_THREADS': '1'}, capture_output=True, text=True,
                            timeout=900)
    assert launch.returncode == 0, launch.stderr[-3000:]
    outputs = launch.stdout.split(RUN_MARK)[1:]
    assert len(outputs) == len(runs)
    return outputs


TRAINER_IMPORT = """
import builtins, json, os, sys
real_import, allocator = builtins.__import__, []
def spy(name, *args, **kwargs):
    if name == 'torch' and 'torch' not in sys.modules:
        allocator.append(os.environ.get('PYTORCH_ALLOC_CONF'))
    return real_import(name, *args, **kwargs)
builtins.__import__ = spy
import llmfoundry_ext.train
print(json.dumps({'allocator_when_torch_imported': allocator, 'modules': sorted(sys.modules)}))
"""


@pytest.fixture(scope='session')
def trainer_import() -> dict:
    """What ``import llmfoundry_ext.train`` does in a fresh interpreter without allocator settings of the user's (as
    ``train.py`` starts): the allocator setting when torch was first imported, and every module loaded. One process
    for all the tests that read it (an interpreter importing the trainer costs ~6 s of CPU)."""
    import json
    import subprocess
    env = {name: value for name, value in os.environ.items() if not name.endswith('ALLOC_CONF')}
    out = subprocess.run([sys.executable, '-c', TRAINER_IMPORT], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


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


@pytest.fixture(scope='session')
def nodes_of_their_own() -> None:
    """Simulated nodes each get a user and mount namespace with a /dev/shm of their own (streaming keeps one set of
    shared memory a node there; two nodes on one machine would collide): skipped where this machine allows none."""
    probe = subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'true'], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f'simulated nodes need namespaces of their own: unshare --user --map-root-user --mount failed: '
                    f'{probe.stderr.strip()}')


@pytest.fixture
def launched_alone(monkeypatch):
    """The environment Composer's launcher gives the one process of a one-process run; the process group Composer
    starts is ended after the test (a later test in this worker, without that environment, would find it); one
    that was there before (``one_process_group``'s) is left to its owner."""
    for name in ('WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'RANK', 'LOCAL_RANK', 'NODE_RANK'):
        monkeypatch.setenv(name, '1' if 'SIZE' in name else '0')
    started_here = not torch.distributed.is_initialized()
    yield
    if started_here and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def fsdp_on_one_process(monkeypatch):
    """FSDP2 over this one process as over several (its units, mixed precision and sharded checkpoints) without
    launching more: one process alone trains unsharded (the plan's ``run_plan.shards_the_model``)."""
    from llmfoundry_ext.plan import run_plan
    monkeypatch.setattr(run_plan, 'shards_the_model', lambda config, machine: config.parallelism.fsdp is not None)


@pytest.fixture(scope='module')
def one_process_group():
    """A default process group of this one process (gloo, or NCCL on a GPU) for FSDP2 without a launcher; an
    earlier in-process run's group of one is used as it is."""
    import torch.distributed as dist
    if dist.is_initialized():
        assert dist.get_world_size() == 1
        yield
        return
    dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo', rank=0, world_size=1,
                            store=dist.HashStore())
    yield
    dist.destroy_process_group()


def write_frontier_data_root(root, window: int, vocab: int, windows, tokenizer: str = 'llama3',
                             special_tokens: tuple = ('<|end_of_text|>', '<|reserved_special_token_100|>')) -> None:
    """Under ``root``: the train and val folders of the shipped YAMLs' six streams (``windows(i)`` random windows in
    the i-th) and tokenizer/``tokenizer`` (a small BPE with the special tokens the YAMLs name: Llama-3's by
    default)."""
    from data_prep.train_tokenizer import train_bpe
    from llmfoundry_ext.config import read_yaml
    data = read_yaml(os.path.join(REPO, 'yamls', 'llama1b.yaml'), [f'variables.data_root={root}'])['data']
    streams = [*data['train']['streams'].values(), *data['eval']['streams'].values()]
    for seed, stream in enumerate(streams):
        write_mds(stream['local'], random_windows(windows(seed), window, vocab, seed),
                  {'source': 't', 'window': window})
    os.makedirs(os.path.join(root, 'tokenizer', tokenizer))
    bpe = train_bpe(['some text'] * 10, vocab_size=300)
    bpe.add_special_tokens(list(special_tokens))
    bpe.save(os.path.join(root, 'tokenizer', tokenizer, 'tokenizer.json'))


def write_yaml(data: dict, path) -> str:
    with open(path, 'w') as file:
        yaml.safe_dump(data, file)
    return str(path)


def change(path: str, value):
    """A function that sets ``path`` (dotted) in a config dict; value ``DELETE`` removes the key."""
    def apply(config: dict):
        *parents, last = path.split('.')
        for key in parents:
            config = config.setdefault(key, {})
        if value == 'DELETE':
            del config[last]
        else:
            config[last] = value
    return apply


def changes(*pairs):
    def apply(config: dict):
        for path, value in pairs:
            change(path, value)(config)
    return apply


def config_error(read, tiny_config: dict, tmp_path, mutate) -> str:
    """The ConfigError line that ``read`` (config.load or preflight.prepare) raises for ``tiny_config`` as
    ``mutate`` changes it."""
    from llmfoundry_ext.errors import ConfigError
    config = copy.deepcopy(tiny_config)
    mutate(config)
    with pytest.raises(ConfigError) as caught:
        read(write_yaml(config, tmp_path / 'run.yaml'))
    return str(caught.value)


def demo_data(root) -> str:
    """demo.yaml's data layout (code / prose / math MDS folders, train and val, a tokenizer, the downstream task),
    random tokens."""
    for seed, domain in enumerate(('code', 'prose', 'math')):
        for split, windows in (('train', 200), ('val', 40)):
            write_mds(str(root / domain / split), random_windows(windows, 256, 2048, seed), {'source': domain,
                                                                                            'window': 256})
    from data_prep.demo_corpus import write_demo_task
    from data_prep.train_tokenizer import train_bpe
    os.makedirs(root / 'tokenizer')
    train_bpe(['demo text'] * 10, vocab_size=300).save(str(root / 'tokenizer' / 'tokenizer.json'))
    write_demo_task(str(root))  # the downstream task demo.yaml names
    return str(root)


def global_batches(ledgers: dict[int, dict], batches) -> list[list[int]]:
    """Per batch, the sorted sample ids that all ranks' ledgers (rank -> ``read_ledger``'s) read in it."""
    return [sorted(i for ledger in ledgers.values() for i in ledger[b]['sample_ids']) for b in batches]
