"""Bad inputs to the three commands (train.py, convert_to_mds.py, convert_checkpoint.py): each is exactly one line on
stderr naming the problem and the fix, exit status 2, no traceback, and no output that existed before changed."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from data_prep.convert_to_mds import main as convert_main
from llmfoundry_ext.data.mds import write_mds
from data_prep.train_tokenizer import train_bpe
from llmfoundry_ext.data.mds import file_sha256
from llmfoundry_ext.launch import LAUNCHER
from llmfoundry_ext.train import main as train_main
from llmfoundry_ext.train import train
from llmfoundry_ext.preflight import prepare
from scripts.convert_checkpoint import main as checkpoint_main
from tests.data.test_dataloader import damaged_beside
from tests.conftest import FORKED, REPO, write_yaml
from tests.data_prep.test_sources import write_parquet

COMMANDS = {'train': train_main, 'convert': convert_main, 'checkpoint': checkpoint_main}


def tokenizer_folder(folder, words: int) -> str:
    os.makedirs(folder)
    tokenizer = train_bpe([' '.join(f'w{i}' for i in range(words))] * 20, vocab_size=300)
    tokenizer.add_special_tokens(['<|end_of_text|>'])
    tokenizer.save(os.path.join(folder, 'tokenizer.json'))
    return str(folder)


def stream(folder, window: int, tokenizer: str) -> str:
    rng = np.random.default_rng(0)
    write_mds(str(folder), [rng.integers(2, 256, window, dtype=np.uint32) for _ in range(64)],
              {'source': 'test', 'window': window, 'tokenizer_sha256': file_sha256(f'{tokenizer}/tokenizer.json')})
    return str(folder)


@pytest.fixture(scope='module')
def world(tmp_path_factory) -> dict:
    """A tokenizer, streams, a run YAML with a finished run (a checkpoint), its HF export, converter inputs."""
    root = tmp_path_factory.mktemp('world')
    w = {'root': str(root), 'tokenizer': tokenizer_folder(root / 'tokenizer', 40)}
    w['other_tokenizer'] = tokenizer_folder(root / 'other-tokenizer', 30)
    w['stream'] = stream(root / 'data' / 'a', 32, w['tokenizer'])
    config = {'run_name': 'run', 'max_seq_len': 32, 'global_batch_size': 4, 'max_duration': '2ba', 'precision': 'fp32',
              'model': {'preset': 'debug', 'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'ffn_dim': 128,
                        'vocab_size': 512, 'max_seq_len': 64},
              'data': {'tokenizer': w['tokenizer'], 'train': {'streams': {'a': {'local': w['stream']}}}},
              'parallelism': {'fsdp': None}, 'loggers': {}, 'progress_bar': False,
              'checkpoint': {'save_folder': str(root / 'run'), 'save_interval': '2ba'}}
    w['config'], w['yaml'] = config, write_yaml(config, root / 'run.yaml')
    train(prepare(w['yaml'])).close()
    w['run'] = str(root / 'run')
    assert checkpoint_main(['to-hf', w['run'], str(root / 'hf'), '--dtype', 'float32']) == 0
    w['hf'] = str(root / 'hf')
    with open(root / 'docs.jsonl', 'w') as file:
        file.writelines(json.dumps({'text': f'w{i} w{i + 1} w{i + 2}', 'id': str(i)}) + '\n' for i in range(200))
    w['docs'] = str(root / 'docs.jsonl')
    assert convert_main(['--source', f"jsonl:{w['docs']}", '--tokenizer', w['tokenizer'], '--concat-tokens', '16',
                         '--out', str(root / 'converted'), '--processes', '1']) == 0
    w['converted'] = str(root / 'converted')
    (root / 'a-file').write_text('not a folder')
    w['file'] = str(root / 'a-file')
    return w


def variant(world, tmp_path, name: str, change) -> str:
    """A copy of ``world[name]`` (a folder) with ``change(path)`` applied."""
    path = shutil.copytree(world[name], tmp_path / name)
    change(str(path))
    return str(path)


def truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def shard(folder: str) -> str:
    with open(os.path.join(folder, 'index.json')) as file:
        return os.path.join(folder, json.load(file)['shards'][0]['zip_data']['basename'])


def decompressed_beside(folder: str, change) -> None:
    """The first shard decompressed beside its .zstd, as streaming leaves it once read, its bytes ``change``d."""
    from streaming.base.compression import decompress
    with open(shard(folder), 'rb') as file:
        raw = decompress('zstd', file.read())
    with open(shard(folder).removesuffix('.zstd'), 'wb') as file:
        file.write(change(raw))


def stream_case(change, expected: str) -> tuple:
    """A train case on a copy of the world's stream with ``change(folder)`` applied."""
    return ('train', lambda w, t: [w['yaml'], f"data.train.streams.a.local={variant(w, t, 'stream', change)}"],
            expected, 'run')


def zeroed_start(path: str) -> None:
    """The first 8 bytes of ``path`` zeroed, its size unchanged."""
    with open(path, 'r+b') as file:
        file.write(bytes(8))


def remove_shard(folder: str) -> None:
    """Both forms of the first shard: compressed, and decompressed (streaming leaves that beside it once read)."""
    for path in (shard(folder), shard(folder).removesuffix('.zstd')):
        if os.path.exists(path):
            os.remove(path)


def hf_with_bin_only(folder: str) -> None:
    os.rename(os.path.join(folder, 'model.safetensors'), os.path.join(folder, 'pytorch_model.bin'))


def hf_of_another_shape(folder: str) -> None:
    config_file = os.path.join(folder, 'config.json')
    config = json.load(open(config_file))
    json.dump({**config, 'hidden_size': 128}, open(config_file, 'w'))


def smol_ids(tmp_path) -> str:
    """A folder with one Stack-v2 smol-ids parquet file (a repository and one blob to fetch)."""
    os.makedirs(tmp_path / 'smol')
    write_parquet(tmp_path / 'smol' / 'smol.parquet',
                  {'repo_name': ['a/b'], 'files': [[{'blob_id': 'b1', 'src_encoding': 'UTF-8'}]]})
    return str(tmp_path / 'smol')


def parquet_without_text(tmp_path) -> str:
    write_parquet(tmp_path / 'p.parquet', {'content': ['x']})
    return str(tmp_path / 'p.parquet')


def two_inputs(world, tmp_path) -> str:
    """A folder with two jsonl files: the converted folder was made from one."""
    os.makedirs(tmp_path / 'in')
    for name in ('x1.jsonl', 'x2.jsonl'):
        shutil.copy(world['docs'], tmp_path / 'in' / name)
    return str(tmp_path / 'in')


def yaml_with(world, tmp_path, edit) -> str:
    """The world's run YAML, its text edited, in ``tmp_path``."""
    with open(world['yaml']) as file:
        text = edit(file.read())
    with open(tmp_path / 'edited.yaml', 'w') as file:
        file.write(text)
    return str(tmp_path / 'edited.yaml')


def written(path, content: bytes) -> str:
    with open(path, 'wb') as file:
        file.write(content)
    return str(path)


ADAMW = 'optimizer.name=adamw'
FRESH = 'checkpoint.save_folder={tmp}/fresh'  # a run that would train (the world's run is complete)


def fresh(tmp_path) -> str:
    return FRESH.format(tmp=tmp_path)


# (command, argv from (world, tmp_path), the one line expected on stderr with {placeholders} from world and
# tmp_path, the output folder that must not change)
CASES = {
    'train: no such YAML': ('train', lambda w, t: [f"{w['root']}/nope.yaml"],
                            'config error: {root}/nope.yaml: no such YAML file', 'run'),
    'train: unknown key': ('train', lambda w, t: [w['yaml'], 'max_seq_lenn=32'],
                           "config error: max_seq_lenn: unknown key; did you mean 'max_seq_len'?", 'run'),
    'train: override without =': ('train', lambda w, t: [w['yaml'], 'max_seq_len'],
                                  "config error: override 'max_seq_len': expected key=value, e.g. "
                                  "global_batch_size=64", 'run'),
    'train: wrong type': ('train', lambda w, t: [w['yaml'], 'global_batch_size=four'],
                          "config error: global_batch_size: expected int, got str 'four'", 'run'),
    'train: micro-batch': ('train', lambda w, t: [w['yaml'], 'device_microbatch_size=3'],
                           'config error: device_microbatch_size: 3 does not divide the per-device batch 4 '
                           '(global_batch_size 4 / 1 devices); pick a divisor of 4', 'run'),
    'train: bad duration': ('train', lambda w, t: [w['yaml'], 'max_duration=ten'],
                            "config error: max_duration: 'ten' is not a duration; write e.g. 1000ba, 2ep, 1000000tok "
                            "or 5000sp", 'run'),
    'train: missing MDS folder': ('train', lambda w, t: [w['yaml'], f"data.train.streams.a.local={w['root']}/none"],
                                  'config error: data.train.streams.a.local: no MDS dataset at {root}/none (index.json '
                                  'missing) and no remote set; run data_prep/convert_to_mds.py or fix the path', 'run'),
    'train: truncated MDS shard': (
        'train', lambda w, t: [w['yaml'], 'data.train.streams.a.local=' + variant(
            w, t, 'stream', lambda f: truncate(shard(f)))],
        'config error: data.train.streams.a.local: shard shard.00000.mds.zstd has {truncated} bytes where its index '
        'says {size}; re-convert the stream with data_prep/convert_to_mds.py', 'run'),
    'train: truncated decompressed MDS shard': stream_case(
        lambda f: decompressed_beside(f, lambda raw: raw[:len(raw) // 2]),
        'config error: data.train.streams.a.local: shard shard.00000.mds has {raw_half} bytes where its index says '
        '{raw_size}; re-convert the stream with data_prep/convert_to_mds.py'),
    'train: compressed MDS shard with a damaged header': stream_case(
        lambda f: zeroed_start(shard(f)),
        'config error: data.train.streams.a.local: shard shard.00000.mds.zstd: not a zstd frame (its first bytes are '
        'damaged); re-convert the stream with data_prep/convert_to_mds.py'),
    'train: decompressed MDS shard with a damaged header': stream_case(
        lambda f: decompressed_beside(f, lambda raw: bytes(4) + raw[4:]),
        'config error: data.train.streams.a.local: shard shard.00000.mds: its header counts 0 samples where its index '
        'says 64; re-convert the stream with data_prep/convert_to_mds.py'),
    'train: missing MDS shard': (
        'train', lambda w, t: [w['yaml'], f"data.train.streams.a.local={variant(w, t, 'stream', remove_shard)}"],
        'config error: data.train.streams.a.local: shard shard.00000.mds.zstd is missing; re-convert the stream with '
        'data_prep/convert_to_mds.py', 'run'),
    'train: MDS index not JSON': (
        'train', lambda w, t: [w['yaml'], 'data.train.streams.a.local=' + variant(
            w, t, 'stream', lambda f: open(f'{f}/index.json', 'w').write('{"shards": ['))],
        'config error: data.train.streams.a.local: {tmp}/stream/index.json or its manifest is unreadable (Expecting '
        'value: line 1 column 13 (char 12)); re-convert the stream with data_prep/convert_to_mds.py', 'run'),
    'train: shards of a shorter window': ('train', lambda w, t: [w['yaml'], 'max_seq_len=48'],
                                          'config error: data.train.streams.a.local: its windows have 32 tokens, '
                                          'fewer than max_seq_len 48; set max_seq_len=32 or re-convert with '
                                          '--concat-tokens 48', 'run'),
    'train: shards of another tokenizer': (
        'train', lambda w, t: [w['yaml'], f"data.tokenizer={w['other_tokenizer']}"],
        'config error: data.train.streams.a: its shards were tokenized with another tokenizer than data.tokenizer '
        '{other_tokenizer} (sha256 {sha12} vs {other_sha12}); point data.tokenizer at the one named in '
        '{stream}/manifest.json or re-convert', 'run'),
    'train: tokenizer.json that is not one': (
        'train', lambda w, t: [w['yaml'], 'data.tokenizer=' + variant(
            w, t, 'tokenizer', lambda f: open(f'{f}/tokenizer.json', 'w').write('{"model": 1}'))],
        'config error: data.tokenizer: {tmp}/tokenizer/tokenizer.json: not a tokenizer.json the tokenizers library '
        'reads ({library_says}); give the folder the shards were tokenized with', 'run'),
    'train: vocabulary larger than the model': ('train', lambda w, t: [w['yaml'], 'model.vocab_size=100'],
                                                'config error: data.tokenizer: its vocabulary has {vocab} ids but '
                                                'model.vocab_size is 100; set model.vocab_size >= {vocab}', 'run'),
    'train: init_from a folder with only .bin': (
        'train', lambda w, t: [w['yaml'], f"model.init_from={variant(w, t, 'hf', hf_with_bin_only)}"],
        'config error: model.init_from: {tmp}/hf: no .safetensors files; only safetensors are loaded (pickled '
        '.bin/.pt weights from elsewhere are never unpickled): save the model with safetensors', 'run'),
    'train: init_from weights of another shape': (
        'train', lambda w, t: [w['yaml'], f"model.init_from={variant(w, t, 'hf', hf_of_another_shape)}"],
        'config error: model.dim: 64 but the weights in {tmp}/hf have 128; set model.dim=128', 'run'),
    'train: save folder under a file': ('train', lambda w, t: [w['yaml'], f"checkpoint.save_folder={w['file']}/ckpt"],
                                        'config error: checkpoint.save_folder: {file} is a file, not a folder; choose '
                                        'a folder you can write', 'run'),
    'train: load_path missing': ('train', lambda w, t: [w['yaml'], f"checkpoint.load_path={w['root']}/ep0-ba9"],
                                 'config error: checkpoint.load_path: {root}/ep0-ba9 does not exist; give a checkpoint '
                                 '(ep0-ba100/ or ep0-ba100-rank0.pt) or remove load_path', 'run'),
    'train: load_path of shards for one process': (
        'train', lambda w, t: [w['yaml'], f"checkpoint.load_path={os.makedirs(f'{t}/ep0-ba9') or f'{t}/ep0-ba9'}"],
        'config error: checkpoint.load_path: {tmp}/ep0-ba9 is a folder of shards and this run reads one file (one '
        'process); convert it (python -m torch.distributed.checkpoint.format_utils dcp_to_torch {tmp}/ep0-ba9 '
        'ep0-ba100-rank0.pt) or put the run in checkpoint.save_folder, whose autoresume converts it', 'run'),
    'train: misspelt callback': ('train', lambda w, t: [w['yaml'], 'callbacks.speed_monitr={}'],
                                 "config error: callbacks.speed_monitr: unknown callbacks name 'speed_monitr'; did "
                                 "you mean 'speed_monitor'?", 'run'),
    'train: bf16 without a GPU': ('train', lambda w, t: [w['yaml'], 'precision=amp_bf16'],
                                  'config error: precision: amp_bf16 needs a GPU and none is visible; use '
                                  'precision=fp32 on CPU', 'run'),
    'train: YAML indented with a tab': (
        'train', lambda w, t: [yaml_with(w, t, lambda text: text.replace('  dim:', '\tdim:'))],
        'config error: {tmp}/edited.yaml:{dim_line}:1: a tab in the indentation; indent with spaces', 'run'),
    'train: a key given twice': (
        'train', lambda w, t: [yaml_with(w, t, lambda text: text + 'max_seq_len: 32\n')],
        'config error: {tmp}/edited.yaml:{last_line}:1: found duplicate key max_seq_len; give each key once', 'run'),
    'train: negative learning rate': ('train', lambda w, t: [w['yaml'], ADAMW, 'optimizer.lr=-3e-3'],
                                      'config error: optimizer: AdamW refuses its arguments (Invalid learning rate: '
                                      '-0.003); fix the optimizer keys', 'run'),
    'train: learning rate with a typo': ('train', lambda w, t: [w['yaml'], ADAMW, 'optimizer.lr=3e-3x'],
                                         "config error: optimizer.lr: AdamW takes float, got str '3e-3x'", 'run'),
    'train: one beta': ('train', lambda w, t: [w['yaml'], ADAMW, 'optimizer.betas=[0.9]'],
                        'config error: optimizer.betas: AdamW takes a list of 2 (float, float), got list [0.9]',
                        'run'),
    'train: a negative loader worker count': ('train', lambda w, t: [w['yaml'], 'data.train.num_workers=-1'],
                                              'config error: data.train.num_workers: must be >= 0, got -1', 'run'),
    'train: a warm-up that is not a duration': (
        'train', lambda w, t: [w['yaml'], 'scheduler.t_warmup=100 batches'],
        "config error: scheduler.t_warmup: CosineAnnealingWithWarmupScheduler takes a duration (e.g. 100ba, 2ep, "
        "0.1dur), got str '100 batches'", 'run'),
    'train: negative seed': ('train', lambda w, t: [w['yaml'], 'seed=-1'],
                             'config error: seed: -1 is out of range; give a whole number from 0 to 4,294,967,295',
                             'run'),
    'train: max_duration 0ba': ('train', lambda w, t: [w['yaml'], 'max_duration=0ba'],
                                "config error: max_duration: '0ba' trains nothing; give a positive duration, e.g. "
                                "1000ba", 'run'),
    'train: a duration without its unit': ('train', lambda w, t: [w['yaml'], 'max_duration=300'],
                                           'config error: max_duration: 300 has no unit; write 300ba (batches), '
                                           '300ep, 300tok or 300sp', 'run'),
    'train: save_interval 0ba': ('train', lambda w, t: [w['yaml'], 'checkpoint.save_interval=0ba'],
                                 "config error: checkpoint.save_interval: '0ba' never saves; give a positive "
                                 "duration, e.g. 1000ba; set checkpoint.save_folder=null to save no checkpoints",
                                 'run'),
    'train: varlen attention on the CPU': (
        'train', lambda w, t: [w['yaml'], fresh(t), 'model.attn_impl=varlen'],
        "config error: model.attn_impl: 'varlen' trains only on a GPU (its FA-2 kernels have no CPU version); set "
        "model.attn_impl=auto or sdpa on the CPU", 'run'),
    'train: a logger whose package is not installed': (
        'train', lambda w, t: [w['yaml'], 'loggers.wandb={}'],
        'config error: loggers.wandb: needs the wandb package, which is not installed; pip install wandb, or remove '
        'loggers.wandb', 'run'),
    'train: misspelt state_dict_type': ('train', lambda w, t: [w['yaml'], 'parallelism.fsdp.state_dict_type=shardedd'],
                                        "config error: parallelism.fsdp.state_dict_type: 'shardedd' is not one of "
                                        "sharded, full; did you mean 'sharded'?", 'run'),
    'train: resuming checkpoints of another shape': (
        'train', lambda w, t: [w['yaml'], 'model.n_layers=3', 'max_duration=4ba'],
        'config error: model.n_layers: 3, but the checkpoints in {run} are of a model with 2; set model.n_layers=2 '
        'to resume them, or give a new checkpoint.save_folder to start another run', 'run'),
    'convert: unknown source': ('convert', lambda w, t: ['--source', 'redpajama:all', '--tokenizer', w['tokenizer'],
                                                         '--concat-tokens', '16', '--out', w['converted']],
                                "error: unknown source 'redpajama:all'; use one of zyda2:<component>, "
                                "finemath:<config>, stack-v2, parquet:<glob>, jsonl:<glob>", 'converted'),
    'convert: parquet without the text column': (
        'convert', lambda w, t: ['--source', f'parquet:{parquet_without_text(t)}', '--tokenizer', w['tokenizer'],
                                 '--concat-tokens', '16', '--out', f'{t}/out'],
        "error: {tmp}/p.parquet: no column 'text' (it has content)", 'converted'),
    'convert: no EOS in the tokenizer': (
        'convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer', w['tokenizer'], '--concat-tokens',
                                 '16', '--out', f'{t}/out', '--eos-token', '</s>'],
        "error: the tokenizer has no EOS token '</s>': pass --eos-token with one it has (documents must be separated)",
        'converted'),
    'convert: --concat-tokens 0': ('convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer',
                                                            w['tokenizer'], '--concat-tokens', '0', '--out',
                                                            f'{t}/out'],
                                   'error: argument --concat-tokens: must be at least 1, got 0 (see convert_to_mds.py '
                                   '--help)', 'converted'),
    'convert: --processes 0': ('convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer', w['tokenizer'],
                                                        '--concat-tokens', '16', '--out', f'{t}/out', '--processes',
                                                        '0'],
                               'error: argument --processes: must be at least 1, got 0 (see convert_to_mds.py --help)',
                               'converted'),
    'convert: --val-fraction 1.5': ('convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer',
                                                             w['tokenizer'], '--concat-tokens', '16', '--out',
                                                             f'{t}/out', '--val-fraction', '1.5'],
                                    'error: argument --val-fraction: must be in [0, 1), got 1.5 (see convert_to_mds.py '
                                    '--help)', 'converted'),
    'convert: missing --out': ('convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer',
                                                        w['tokenizer'], '--concat-tokens', '16'],
                               'error: the following arguments are required: --out (see convert_to_mds.py --help)',
                               'converted'),
    'convert: tokenizer.json that is not one': (
        'convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--concat-tokens', '16', '--out', f'{t}/out',
                                 '--tokenizer', variant(w, t, 'tokenizer',
                                                        lambda f: open(f'{f}/tokenizer.json', 'w').write('[]'))],
        'error: --tokenizer: {tmp}/tokenizer/tokenizer.json: not a tokenizer.json the tokenizers library reads '
        '({library_says})', 'converted'),
    'convert: --out under a file': ('convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer',
                                                             w['tokenizer'], '--concat-tokens', '16', '--out',
                                                             f"{w['file']}/out"],
                                    'error: --out {file}/out: {file} is a file, not a folder; choose a folder you can '
                                    'write', 'converted'),
    'convert: folder of another tokenizer': (
        'convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer', w['other_tokenizer'],
                                 '--concat-tokens', '16', '--out', w['converted']],
        'error: {converted}: was written with another tokenizer (sha256 {sha12}, now {other_sha12}); use a new '
        '--out or the same tokenizer', 'converted'),
    'convert: folder of other input files': (
        'convert', lambda w, t: ['--source', f'jsonl:{two_inputs(w, t)}/*.jsonl', '--tokenizer', w['tokenizer'],
                                 '--concat-tokens', '16', '--out', w['converted']],
        'error: {converted}: was started on other input files (1 then, 2 now); use a new --out or the same input',
        'converted'),
    'convert: no input files': ('convert', lambda w, t: ['--source', f"jsonl:{w['root']}/*.none", '--tokenizer',
                                                         w['tokenizer'], '--concat-tokens', '16', '--out', f'{t}/out'],
                                'error: jsonl:{root}/*.none: no files match {root}/*.none', 'converted'),
    'convert: unknown Zyda-2 component': ('convert', lambda w, t: ['--source', 'zyda2:fineweb', '--tokenizer',
                                                                   w['tokenizer'], '--concat-tokens', '16', '--out',
                                                                   f'{t}/out'],
                                          "error: zyda2: unknown component 'fineweb'; one of dclm_crossdeduped, fwe3, "
                                          "dolma-cc_crossdeduped-filtered, zyda_crossdeduped-filtered", 'converted'),
    'convert: stack-v2 without --input': ('convert', lambda w, t: ['--source', 'stack-v2', '--tokenizer',
                                                                   w['tokenizer'], '--concat-tokens', '16', '--out',
                                                                   f'{t}/out'],
                                          'error: stack-v2: give --input, the folder of the gated smol-ids parquet '
                                          'files (huggingface-cli download bigcode/the-stack-v2-train-smol-ids '
                                          '--repo-type dataset --local-dir <folder>)', 'converted'),
    'convert: an S3 endpoint that refuses': (
        'convert', lambda w, t: ['--source', 'stack-v2', '--input', smol_ids(t), '--s3-endpoint', 'http://127.0.0.1:9',
                                 '--tokenizer', w['tokenizer'], '--concat-tokens', '16', '--out', f'{t}/out'],
        'error: s3://softwareheritage at http://127.0.0.1:9: Could not connect to the endpoint URL: '
        '"http://127.0.0.1:9/softwareheritage"; check --s3-endpoint, the network and the AWS credentials in the '
        'environment', 'converted'),
    'convert: a file that is not parquet': (
        'convert', lambda w, t: ['--source', f"parquet:{written(t / 'x.parquet', b'hello')}", '--tokenizer',
                                 w['tokenizer'], '--concat-tokens', '16', '--out', f'{t}/out'],
        'error: {tmp}/x.parquet: not a parquet file (Parquet file size is 5 bytes, smaller than the minimum file '
        'footer (8 bytes)); give parquet files, or jsonl:<glob> for JSON lines', 'converted'),
    'convert: an empty jsonl file': (
        'convert', lambda w, t: ['--source', f"jsonl:{written(t / 'x.jsonl', b'')}", '--tokenizer', w['tokenizer'],
                                 '--concat-tokens', '16', '--out', f'{t}/out'],
        'error: jsonl: {tmp}/x.jsonl: the file is empty; give files with documents', 'converted'),
    'convert: a jsonl file that is not JSON': (
        'convert', lambda w, t: ['--source', f"jsonl:{written(t / 'x.jsonl', bytes(range(256)))}", '--tokenizer',
                                 w['tokenizer'], '--concat-tokens', '16', '--out', f'{t}/out'],
        'error: {tmp}/x.jsonl: its first line is not UTF-8 JSON (compressed other than by gzip?); give JSON lines, '
        'plain or gzip-compressed', 'converted'),
    'convert: an HF tokenizer name with the hub unreachable': (
        'convert', lambda w, t: ['--source', f"jsonl:{w['docs']}", '--tokenizer', 'some-org/some-model',
                                 '--concat-tokens', '16', '--out', f'{t}/out'],
        'error: --tokenizer some-org/some-model: neither a tokenizer.json, a folder with one, nor in the HF cache, and '
        'http://127.0.0.1:9 is unreachable (Connection refused); download it where there is a network '
        '(huggingface-cli download some-org/some-model --include "tokenizer*") and pass its folder', 'converted'),
    'checkpoint: to-hf of a folder without checkpoints': (
        'checkpoint', lambda w, t: ['to-hf', w['root'] + '/data', f'{t}/out'],
        'error: {root}/data: no latest-rank0.pt link and not a checkpoint; give the save folder of a run or one '
        'checkpoint (ep0-ba100/ or ep0-ba100-rank0.pt)', 'hf'),
    'checkpoint: to-hf of a truncated checkpoint': (
        'checkpoint', lambda w, t: ['to-hf', variant(w, t, 'run', lambda f: truncate(f'{f}/ep0-ba2-rank0.pt')) +
                                    '/ep0-ba2-rank0.pt', f'{t}/out'],
        'error: {tmp}/run/ep0-ba2-rank0.pt: ep0-ba2-rank0.pt has {truncated_checkpoint} bytes where {checkpoint} '
        'were written; export another checkpoint of the run (ep0-ba100/ or ep0-ba100-rank0.pt)', 'hf'),
    'checkpoint: from-hf of a folder with only .bin': (
        'checkpoint', lambda w, t: ['from-hf', variant(w, t, 'hf', hf_with_bin_only), f'{t}/out'],
        'error: {tmp}/hf: no .safetensors files; only safetensors are loaded (pickled .bin/.pt weights from elsewhere '
        'are never unpickled): save the model with safetensors', 'hf'),
    'checkpoint: from-hf of a folder without config.json': (
        'checkpoint', lambda w, t: ['from-hf', w['root'] + '/data', f'{t}/out'],
        'error: {root}/data: no config.json; give the folder of an HF Llama or Mixtral model (config.json and '
        '*.safetensors)',
        'hf'),
    'checkpoint: from-hf of another architecture': (
        'checkpoint', lambda w, t: ['from-hf', variant(w, t, 'hf', lambda f: json.dump(
            {**json.load(open(f'{f}/config.json')), 'model_type': 'gpt2'}, open(f'{f}/config.json', 'w'))),
            f'{t}/out'],
        "error: config.json: model_type is 'gpt2', not 'llama' or 'mixtral'; only Llama and Mixtral checkpoints "
        "convert", 'hf'),
    'checkpoint: from-hf of a truncated safetensors file': (
        'checkpoint', lambda w, t: ['from-hf', variant(w, t, 'hf', lambda f: truncate(f'{f}/model.safetensors')),
                                    f'{t}/out'],
        'error: {tmp}/hf/model.safetensors: not a readable safetensors file (Error while deserializing header: '
        'incomplete metadata, file not fully covered); download or export it again', 'hf'),
    'checkpoint: bad --max-shard-size': (
        'checkpoint', lambda w, t: ['from-hf', w['hf'], f'{t}/out', '--max-shard-size', '5G'],
        "error: argument --max-shard-size: invalid shard_size value: '5G' (see convert_checkpoint.py from-hf --help)",
        'hf'),
    'checkpoint: to-hf into a folder under a file': (
        'checkpoint', lambda w, t: ['to-hf', w['run'], f"{w['file']}/out"],
        'error: {file}/out: {file} is a file, not a folder; choose an output folder you can write', 'hf'),
    'checkpoint: unknown command': (
        'checkpoint', lambda w, t: ['to-gguf', w['run'], f'{t}/out'],
        "error: argument command: invalid choice: 'to-gguf' (choose from 'to-hf', 'from-hf') (see "
        "convert_checkpoint.py --help)", 'hf'),
}


def tree_digest(folder: str) -> dict[str, str]:
    return {os.path.relpath(os.path.join(root, name), folder): file_sha256(os.path.join(root, name))
            for root, _, names in os.walk(folder) for name in names}


def placeholders(world, tmp_path) -> dict:
    stream_shard, checkpoint = shard(world['stream']), f"{world['run']}/ep0-ba2-rank0.pt"
    lines = open(world['yaml']).read().splitlines()
    with open(os.path.join(world['stream'], 'index.json')) as file:
        raw_bytes = json.load(file)['shards'][0]['raw_data']['bytes']
    return {**world, 'raw_size': f'{raw_bytes:,}', 'raw_half': f'{raw_bytes // 2:,}',
            'dim_line': next(i for i, line in enumerate(lines, 1) if line.strip().startswith('dim:')),
            'last_line': len(lines) + 1, 'library_says': library_says(f'{tmp_path}/tokenizer/tokenizer.json'),
            'checkpoint': f'{os.path.getsize(checkpoint):,}',
            'truncated_checkpoint': f'{os.path.getsize(checkpoint) // 2:,}', 'tmp': str(tmp_path),
            'sha12': file_sha256(f"{world['tokenizer']}/tokenizer.json")[:12],
            'other_sha12': file_sha256(f"{world['other_tokenizer']}/tokenizer.json")[:12],
            'size': f'{os.path.getsize(stream_shard):,}', 'truncated': f'{os.path.getsize(stream_shard) // 2:,}',
            'vocab': f"{len(json.load(open(world['tokenizer'] + '/tokenizer.json'))['model']['vocab']):,}"}


def library_says(path: str) -> str | None:
    """What the tokenizers library (its wording changes between versions) says of a broken tokenizer.json."""
    from tokenizers import Tokenizer
    try:
        Tokenizer.from_file(path)
    except Exception as error:
        return str(error)
    return None


def test_there_are_thirty_cases_or_more_across_the_three_commands():
    per_command = {command: sum(case[0] == command for case in CASES.values()) for command in COMMANDS}
    assert len(CASES) >= 30 and min(per_command.values()) >= 9, per_command


@pytest.mark.parametrize('name', CASES)
def test_a_bad_input_is_one_line_and_exit_status_2(world, tmp_path, capsys, monkeypatch, name):
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', 'test')  # credentials are not the problem in the S3 case
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', 'test')
    monkeypatch.setenv('HF_ENDPOINT', 'http://127.0.0.1:9')  # the hub, unreachable (nothing listens on port 9)
    command, argv, expected, output = CASES[name]
    before = tree_digest(world[output])
    arguments = argv(world, tmp_path)
    capsys.readouterr()
    try:
        status = COMMANDS[command](arguments)
    except SystemExit as exit:
        status = exit.code
    stderr = capsys.readouterr().err
    assert stderr.splitlines() == [expected.format(**placeholders(world, tmp_path))]
    assert status == 2
    assert tree_digest(world[output]) == before


@pytest.mark.slow
def test_under_the_launcher_a_bad_input_is_printed_once_and_exits_2(world):
    """Both ranks find it; Composer's launcher would otherwise report the rank it stopped (-15: 241)."""
    result = subprocess.run([*LAUNCHER, '-n', '2', os.path.join(REPO, 'train.py'), world['yaml'], 'seed=-1'],
                            capture_output=True, text=True, timeout=120)
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 2
    assert [line for line in output if 'seed' in line] == [
        'config error: seed: -1 is out of range; give a whole number from 0 to 4,294,967,295']
    assert not [line for line in output if 'Traceback' in line]


def zeroed_compressed_shard(folder: str) -> None:
    """The first shard's middle third zeroed, its size unchanged (the index's check passes); not yet decompressed."""
    decompressed = shard(folder).removesuffix('.zstd')
    if os.path.exists(decompressed):
        os.remove(decompressed)
    size = os.path.getsize(shard(folder))
    with open(shard(folder), 'r+b') as file:
        file.seek(size // 3)
        file.write(bytes(size // 3))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize('processes', [1, 2])
def test_a_corrupt_shard_found_in_training_stops_the_run_in_one_line_naming_it(world, tmp_path, processes):
    """Streaming ended the epoch early (a "complete" run of 0 batches, with a checkpoint) or waited for ever. Two
    processes under Composer's launcher (the one that finds it prints the line); one forked from the suite's import
    (FORKED), in a process of its own, as streaming's threads may hang."""
    stream = variant(world, tmp_path, 'stream', zeroed_compressed_shard)
    launcher = [*LAUNCHER, '-n', '2'] if processes == 2 else [*FORKED, '-n', '1']
    for attempt in range(2 if processes == 1 else 1):  # it lands in streaming's threads at different moments
        folder = tmp_path / f'run{attempt}'
        result = subprocess.run([*launcher, os.path.join(REPO, 'train.py'), world['yaml'], 'max_duration=1ep',
                                 f'data.train.streams.a.local={stream}', f'checkpoint.save_folder={folder}'],
                                capture_output=True, text=True, timeout=120)
        errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith('error')]
        assert result.returncode == 1
        assert errors == [f'error: shard {shard(stream)} cannot be read (ValueError: Checksum failure: {shard(stream)}); '
                          f're-convert its stream with data_prep/convert_to_mds.py (or restore the file), then run the '
                          f'same command: it resumes from the last checkpoint']
        assert not [name for name in os.listdir(folder) if name.startswith('ep')]  # no checkpoint of 0 batches


def test_a_damaged_shard_in_the_local_cache_ends_an_evaluation_in_one_line_naming_it(world, tmp_path, capsys):
    """A decompressed held-out shard overwritten in place, its size unchanged (streaming's IndexError before)."""
    damaged = damaged_beside(world['stream'], tmp_path / 'held-out', checksums=True)
    capsys.readouterr()
    assert train_main([world['yaml'], f'data.eval.streams.a.local={tmp_path / "held-out"}', 'eval_interval=1ba',
                       'max_duration=1ba', f'checkpoint.save_folder={tmp_path}/run']) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error')]
    assert len(errors) == 1 and errors[0].startswith(f'error: shard {damaged} cannot be read (ValueError: its xxh3_64 '
                                                     f'checksum is ')


@pytest.mark.parametrize('workers', [0, 1])
def test_a_token_id_beyond_the_vocabulary_stops_the_run_in_one_line(world, tmp_path, capsys, workers):
    """Shards whose manifest names no tokenizer, one sample of them from a larger vocabulary: the embedding would
    fail (an IndexError here, a device-side assert on a GPU). In a loader worker too, whose error PyTorch raises
    again with the worker's traceback."""
    windows = [np.full(32, 7, dtype=np.uint32) for _ in range(64)]
    windows[5][10] = 700
    folder = str(tmp_path / 'larger-vocabulary')
    write_mds(folder, windows, {'source': 'test', 'window': 32})
    capsys.readouterr()
    assert train_main([world['yaml'], f'data.train.streams.a.local={folder}', 'max_duration=1ep',
                       f'checkpoint.save_folder={tmp_path}/run', f'data.train.num_workers={workers}']) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith('error')]
    assert errors == ['error: sample 5 holds token id 700, beyond model.vocab_size 512: its shards were tokenized '
                      'with a larger vocabulary; set data.tokenizer to their tokenizer (and model.vocab_size to its '
                      'size), or re-convert them']
