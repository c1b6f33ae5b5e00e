"""The converter: exact token streams with EOS between documents, a hash-based hold-out, parallel parts,
resumption after kill -9, and one clear line for bad input."""
import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest
from streaming import StreamingDataset

from data_prep.convert import Job, convert, in_validation, resolve_tokenizer
from data_prep.convert_to_mds import main as convert_main
from data_prep.convert_to_mds import node_placement
from data_prep.packing import pack
from data_prep.sources import SourceError, parse_source
from data_prep.train_tokenizer import BOS, EOS, train_bpe
from llmfoundry_ext.data.mds import file_sha256
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.preflight import check_local_stream
from tests.conftest import REPO
from tests.data_prep.test_sources import write_parquet

WORDS = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma'.split()


def sentence(rng) -> str:
    return ' '.join(rng.choice(WORDS, size=rng.integers(3, 40)))


@pytest.fixture
def tokenizer_file(tmp_path) -> str:
    folder = tmp_path / 'tokenizer'
    folder.mkdir()
    train_bpe(WORDS * 50, vocab_size=300).save(str(folder / 'tokenizer.json'))
    return str(folder / 'tokenizer.json')


def token_stream(folder: str) -> list[int]:
    dataset = StreamingDataset(local=folder, shuffle=False, batch_size=1)
    return np.concatenate([dataset[i]['tokens'] for i in range(len(dataset))]).tolist() if len(dataset) else []


def expected_stream(parts: list[list[tuple[str, str]]], tokenizer_file: str, window: int, split: str,
                    fraction: float) -> list[int]:
    """Per part: its documents of ``split`` as BOS + ids + EOS, packed, tail dropped; parts in order."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(tokenizer_file)
    eos, bos = tokenizer.token_to_id(EOS), tokenizer.token_to_id(BOS)
    stream = []
    for documents in parts:
        chosen = [[bos] + tokenizer.encode(text).ids + [eos] for doc_id, text in documents
                  if in_validation(doc_id, fraction) == (split == 'val')]
        stream.extend(np.concatenate(list(pack(chosen, window))).tolist() if chosen else [])
    return stream


def test_zyda2_conversion_is_exact(tmp_path, tokenizer_file):
    rng = np.random.default_rng(0)
    parts = []
    for shard in range(3):
        documents = [(f'z-{shard}-{i}', sentence(rng)) for i in range(60)]
        write_parquet(tmp_path / 'zyda' / 'data' / 'zyda_crossdeduped-filtered ' / f'shard{shard}' / 'train.parquet',
                      {'nemo_id': [d for d, _ in documents], 'text': [t for _, t in documents],
                       f'extra_{shard}': [shard] * 60})
        parts.append(documents)
    source = parse_source('zyda2:zyda_crossdeduped-filtered', str(tmp_path / 'zyda'))
    out = str(tmp_path / 'out')
    manifest = convert(Job(source, tokenizer_file, 16, 0.2, out), 2, EOS, BOS, progress=False)

    for split in ('train', 'val'):
        stream = token_stream(os.path.join(out, split))
        assert stream == expected_stream(parts, tokenizer_file, 16, split, 0.2)
        assert manifest[split]['tokens'] == len(stream) == manifest[split]['windows'] * 16
    val_ids = [d for documents in parts for d, _ in documents if in_validation(d, 0.2)]
    assert manifest['val']['documents'] == len(val_ids) and 0 < len(val_ids) < 60
    assert manifest['train']['documents'] + manifest['val']['documents'] == 180


def test_every_document_is_recoverable_between_eos_tokens(tmp_path, tokenizer_file):
    from tokenizers import Tokenizer
    rng = np.random.default_rng(1)
    texts = [sentence(rng) for _ in range(40)]
    (tmp_path / 'docs.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts))
    out = str(tmp_path / 'out')
    convert(Job(parse_source(f'jsonl:{tmp_path}/docs.jsonl'), tokenizer_file, 32, 0.0, out), 1, EOS, None,
            progress=False)
    tokenizer = Tokenizer.from_file(tokenizer_file)
    eos = tokenizer.token_to_id(EOS)
    stream = token_stream(os.path.join(out, 'train'))
    segments, start = [], 0
    for position, token in enumerate(stream):
        if token == eos:
            segments.append(stream[start:position])
            start = position + 1
    assert [tokenizer.decode(segment) for segment in segments] == texts[:len(segments)]
    assert len(segments) >= 30  # only the documents in the dropped tail are missing


def write_jsonl_parts(folder, count: int, documents: int) -> None:
    rng = np.random.default_rng(2)
    os.makedirs(folder)
    for part in range(count):
        with open(os.path.join(folder, f'part{part:02d}.jsonl'), 'w') as file:
            for i in range(documents):
                file.write(json.dumps({'text': sentence(rng), 'id': f'{part}-{i}'}) + '\n')


def run_cli(tmp_path, out, tokenizer_file, *extra, output=subprocess.DEVNULL) -> subprocess.Popen:
    command = [sys.executable, 'data_prep/convert_to_mds.py', '--source', f'jsonl:{tmp_path}/in/*.jsonl',
               '--id-column', 'id', '--tokenizer', tokenizer_file, '--concat-tokens', '64', '--out', out,
               '--processes', '1', '--val-fraction', '0.1', '--eos-token', EOS, '--bos-token', BOS, *extra]
    environment = {name: value for name, value in os.environ.items() if not name.startswith('SLURM_')}
    return subprocess.Popen(command, cwd=REPO, stdout=output, stderr=output, start_new_session=True, text=True,
                            env=environment)


def finished_parts(out) -> int:
    folder = os.path.join(out, 'train')
    return sum(not name.endswith('.partial') for name in os.listdir(folder)) if os.path.isdir(folder) else 0


def tree_digest(folder) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``."""
    return {os.path.relpath(os.path.join(root, name), folder): file_sha256(os.path.join(root, name))
            for root, _, names in os.walk(folder) for name in names}


def kill_inside_the_next_part(process, out, rng) -> None:
    """Wait until ``process`` finishes one more part, then kill -9 its process group at a random moment of the
    next: when that one is finished too (between parts), or after a random 0-80 ms (inside its writing; a part
    of 1,500 documents takes ~85 ms on a 2-core machine), whichever comes first. A run finishes one or two parts."""
    before = finished_parts(out)
    while finished_parts(out) < before + 1:
        assert process.poll() is None, 'a run finished before its kill'
        time.sleep(0.001)
    deadline = time.monotonic() + rng.uniform(0, 0.08)
    while time.monotonic() < deadline and finished_parts(out) < before + 2:
        time.sleep(0.001)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.timeout(900)
def test_five_kills_at_random_points_then_a_rerun_give_the_same_bytes(tmp_path, tokenizer_file):
    """Five runs, each killed (kill -9 of its process group) inside or just after the part after its first; the
    last run finishes. Every file equals the uninterrupted one's. 12 parts: five runs leave two or more."""
    write_jsonl_parts(tmp_path / 'in', count=12, documents=1500)
    assert run_cli(tmp_path, str(tmp_path / 'whole'), tokenizer_file).wait(timeout=600) == 0
    out, rng = str(tmp_path / 'resumed'), np.random.default_rng(0)
    for _ in range(5):
        kill_inside_the_next_part(run_cli(tmp_path, out, tokenizer_file), out, rng)
        assert not os.path.exists(os.path.join(out, 'manifest.json'))
    assert finished_parts(out) >= 5  # each run finished a part before its kill
    assert run_cli(tmp_path, out, tokenizer_file).wait(timeout=600) == 0
    assert tree_digest(out) == tree_digest(tmp_path / 'whole')


@pytest.mark.timeout(900)
def test_three_nodes_one_killed_mid_part_give_the_one_node_bytes(tmp_path, tokenizer_file):
    """Nodes 0 and 2 of 3 finish first: no index, so the half-converted output is refused for training and by
    --finalize; node 1 is killed inside its second part and re-run, finds every part done and writes the index and
    manifest: every file equals a one-node conversion's."""
    write_jsonl_parts(tmp_path / 'in', count=12, documents=1500)
    assert run_cli(tmp_path, str(tmp_path / 'whole'), tokenizer_file).wait(timeout=600) == 0
    out = str(tmp_path / 'nodes')
    for rank in (0, 2):
        node = run_cli(tmp_path, out, tokenizer_file, '--nodes', '3', '--node-rank', str(rank), output=subprocess.PIPE)
        assert node.wait(timeout=600) == 0
        assert node.stdout.read().strip().splitlines()[-1] == (
            f'node {rank} of 3: its parts are converted; {8 if rank == 0 else 4} parts of other nodes are not yet: the '
            f'last node to finish writes the index and manifest (or --finalize then)')
    assert finished_parts(out) == 8 and not os.path.exists(os.path.join(out, 'train', 'index.json'))
    with pytest.raises(ConfigError) as refused:
        check_local_stream(os.path.join(out, 'train'), 'data.train.streams.code.local', 64)
    assert str(refused.value).startswith('data.train.streams.code.local: no MDS dataset at ')
    early = run_cli(tmp_path, out, tokenizer_file, '--nodes', '3', '--finalize', output=subprocess.PIPE)
    assert early.wait(timeout=600) == 2
    assert early.stderr.read().strip() == ('error: --finalize: 4 parts are not converted yet (of nodes 1 of 3); run '
                                           "those nodes' commands first")
    kill_inside_the_next_part(run_cli(tmp_path, out, tokenizer_file, '--nodes', '3', '--node-rank', '1'), out,
                              np.random.default_rng(0))
    assert not os.path.exists(os.path.join(out, 'manifest.json'))
    assert run_cli(tmp_path, out, tokenizer_file, '--nodes', '3', '--node-rank', '1').wait(timeout=600) == 0
    assert tree_digest(out) == tree_digest(tmp_path / 'whole')
    assert run_cli(tmp_path, out, tokenizer_file, '--nodes', '3', '--finalize').wait(timeout=600) == 0
    assert tree_digest(out) == tree_digest(tmp_path / 'whole')  # finalizing again writes the same bytes


@pytest.mark.parametrize('environment, given, placement', [
    ({}, (None, None), (1, 0)),
    ({'SLURM_NNODES': '4', 'SLURM_NODEID': '2'}, (None, None), (4, 2)),
    ({'SLURM_ARRAY_TASK_COUNT': '8', 'SLURM_ARRAY_TASK_ID': '6', 'SLURM_ARRAY_TASK_MIN': '1',
      'SLURM_NNODES': '1', 'SLURM_NODEID': '0'}, (None, None), (8, 5)),   # an array job of one-node tasks
    ({'SLURM_NNODES': '4', 'SLURM_NODEID': '2'}, (3, 1), (3, 1)),       # given beats Slurm's
])
def test_node_placement_comes_from_the_arguments_then_slurm(environment, given, placement):
    assert node_placement(*given, environment) == placement


def test_a_stream_whose_documents_fill_no_window_is_one_line(tmp_path, tokenizer_file):
    """The converter says so (exit 2), and training refuses the folder it wrote."""
    os.makedirs(tmp_path / 'in')
    (tmp_path / 'in' / 'short.jsonl').write_text(json.dumps({'text': 'too short', 'id': '0'}) + '\n')
    assert run_cli(tmp_path, str(tmp_path / 'out'), tokenizer_file).wait(timeout=600) == 2
    with pytest.raises(ConfigError) as refused:
        check_local_stream(str(tmp_path / 'out' / 'train'), 'data.train.streams.code.local', 64)
    assert str(refused.value) == (f"data.train.streams.code.local: {tmp_path / 'out' / 'train'} holds no samples (its "
                                  f'documents filled no window of 64 tokens); convert more data into it or leave the '
                                  f'stream out')


def test_the_cli_prints_one_line_and_no_traceback(tmp_path, tokenizer_file):
    """The command as users run it (the cases of bad input: tests/test_bad_inputs.py)."""
    result = subprocess.run([sys.executable, 'data_prep/convert_to_mds.py', '--source', 'redpajama:all', '--tokenizer',
                             tokenizer_file, '--concat-tokens', '16', '--out', str(tmp_path / 'out')], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (
        2, '', "error: unknown source 'redpajama:all'; use one of zyda2:<component>, finemath:<config>, stack-v2, "
               "parquet:<glob>, jsonl:<glob>\n")
    assert not os.path.exists(tmp_path / 'out')


def test_gzip_compressed_json_lines_convert_as_the_plain_ones(tmp_path, tokenizer_file):
    rng = np.random.default_rng(0)
    lines = ''.join(json.dumps({'text': sentence(rng), 'id': str(i)}) + '\n' for i in range(300)).encode()
    (tmp_path / 'plain.jsonl').write_bytes(lines)
    (tmp_path / 'packed.jsonl.gz').write_bytes(gzip.compress(lines))
    streams = []
    for name in ('plain.jsonl', 'packed.jsonl.gz'):
        job = Job(parse_source(f'jsonl:{tmp_path / name}'), tokenizer_file, 16, 0.0, str(tmp_path / f'out-{name}'))
        manifest = convert(job, 1, EOS, BOS, progress=False)
        streams.append(token_stream(str(tmp_path / f'out-{name}' / 'train')))
        assert manifest['skipped'] == {}
    assert len(streams[0]) > 1000 and streams[0] == streams[1]


def test_a_full_disk_names_the_output_folder(tmp_path, tokenizer_file, monkeypatch, capsys):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, 'No space left on device')  # as a write deep in a worker reports it: no path

    monkeypatch.setattr('data_prep.convert_to_mds.convert', no_space)
    (tmp_path / 'docs.jsonl').write_text(json.dumps({'text': 'alpha beta'}) + '\n')
    assert convert_main(['--source', f"jsonl:{tmp_path / 'docs.jsonl'}", '--tokenizer', tokenizer_file,
                         '--concat-tokens', '16', '--out', str(tmp_path / 'out')]) == 2
    assert capsys.readouterr().err == (f"error: --out {tmp_path / 'out'}: No space left on device; finished parts are "
                                       f"kept: fix it and run the same command again\n")


@dataclass(frozen=True)
class KilledOnSecondFile:
    """Reads like ``source``, but the worker that reads its second file is killed (as the OOM killer would)."""
    source: object

    def check(self) -> None:
        self.source.check()

    def files(self) -> list[str]:
        return self.source.files()

    def documents(self, file: str, counts):
        if file == self.files()[1]:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.source.documents(file, counts)


def test_a_killed_worker_is_one_error_and_the_rerun_finishes(tmp_path, tokenizer_file):
    write_jsonl_parts(tmp_path / 'in', count=3, documents=20)
    source, out = parse_source(f'jsonl:{tmp_path}/in/*.jsonl'), str(tmp_path / 'out')
    with pytest.raises(SourceError) as caught:
        convert(Job(KilledOnSecondFile(source), tokenizer_file, 16, 0.0, out), 1, EOS, BOS, progress=False)
    assert str(caught.value) == ('a converter worker died (killed, or out of memory?); finished parts are kept: '
                                 'run the same command again to resume, with fewer --processes if memory ran out')
    sizes = [os.path.getsize(file) for file in source.files()]
    started_before = [i for i in range(3) if sizes[i] > sizes[1]]  # parts start largest first
    assert started_before  # the kill leaves parts done before it
    assert sorted(os.listdir(tmp_path / 'out' / 'train')) == sorted([*(f'part-{i:05d}' for i in started_before),
                                                                     'part-00001.partial'])
    manifest = convert(Job(source, tokenizer_file, 16, 0.0, out), 1, EOS, BOS, progress=False)
    assert manifest['train']['documents'] == 60


def test_output_folder_from_another_tokenizer_is_refused(tmp_path, tokenizer_file):
    (tmp_path / 'd.jsonl').write_text('{"text": "alpha beta"}\n')
    source = parse_source(f'jsonl:{tmp_path}/d.jsonl')
    convert(Job(source, tokenizer_file, 4, 0.0, str(tmp_path / 'out')), 1, EOS, None, progress=False)
    other = tmp_path / 'other.json'
    train_bpe(WORDS * 10, vocab_size=280).save(str(other))
    with pytest.raises(SourceError, match=r'out: was written with another tokenizer \(sha256 \w{12}, now \w{12}\); '
                                          r'use a new --out or the same tokenizer'):
        convert(Job(source, str(other), 4, 0.0, str(tmp_path / 'out')), 1, EOS, None, progress=False)


def test_output_folder_from_other_input_files_is_refused(tmp_path, tokenizer_file):
    (tmp_path / 'a.jsonl').write_text('{"text": "alpha beta"}\n')
    convert(Job(parse_source(f'jsonl:{tmp_path}/*.jsonl'), tokenizer_file, 4, 0.0, str(tmp_path / 'out')), 1, EOS,
            None, progress=False)
    (tmp_path / 'b.jsonl').write_text('{"text": "gamma delta"}\n')
    with pytest.raises(SourceError, match=r'out: was started on other input files \(1 then, 2 now\); use a new '
                                          r'--out or the same input'):
        convert(Job(parse_source(f'jsonl:{tmp_path}/*.jsonl'), tokenizer_file, 4, 0.0, str(tmp_path / 'out')), 1,
                EOS, None, progress=False)


def test_resolve_tokenizer_reads_special_tokens_next_to_it(tmp_path, tokenizer_file):
    folder = os.path.dirname(tokenizer_file)
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as file:
        json.dump({'eos_token': {'content': EOS}, 'bos_token': BOS}, file)
    assert resolve_tokenizer(folder, str(tmp_path)) == (tokenizer_file, EOS, BOS)


def test_train_tokenizer_cli_then_convert_with_it(tmp_path):
    rng = np.random.default_rng(3)
    (tmp_path / 'd.jsonl').write_text(''.join(json.dumps({'text': sentence(rng)}) + '\n' for _ in range(200)))
    result = subprocess.run([sys.executable, 'data_prep/train_tokenizer.py', '--source', f'jsonl:{tmp_path}/d.jsonl',
                             '--vocab-size', '300', '--out', str(tmp_path / 'tok')], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f'wrote {tmp_path}/tok: 300 ids; skipped nothing\n'
    file, eos, bos = resolve_tokenizer(str(tmp_path / 'tok'), str(tmp_path))
    assert (eos, bos) == (EOS, BOS)
    manifest = convert(Job(parse_source(f'jsonl:{tmp_path}/d.jsonl'), file, 32, 0.0, str(tmp_path / 'out')), 1,
                       eos, bos, progress=False)
    assert manifest['train']['documents'] == 200 and manifest['tokenizer_sha256'] == file_sha256(file)


def test_stack_v2_through_the_converter(s3_endpoint, tmp_path, tokenizer_file, monkeypatch):
    from data_prep.sources import BlobStore
    for name, value in {'AWS_ACCESS_KEY_ID': 'test', 'AWS_SECRET_ACCESS_KEY': 'test',
                        'AWS_DEFAULT_REGION': 'us-east-1'}.items():
        monkeypatch.setenv(name, value)
    store = BlobStore(endpoint_url=s3_endpoint)
    store.client.create_bucket(Bucket='softwareheritage')
    store.client.put_object(Bucket='softwareheritage', Key='content/k1', Body=gzip.compress(b'alpha beta gamma'))
    write_parquet(tmp_path / 'stack' / 'data' / 'train-0.parquet', {
        'repo_name': ['r/one'], 'files': [[{'blob_id': 'k1', 'src_encoding': 'UTF-8'},
                                            {'blob_id': 'absent', 'src_encoding': 'UTF-8'}]]})
    source = parse_source('stack-v2', str(tmp_path / 'stack'), s3_endpoint=s3_endpoint)
    manifest = convert(Job(source, tokenizer_file, 4, 0.0, str(tmp_path / 'out')), 1, EOS, BOS, progress=False)
    assert manifest['train']['documents'] == 1 and manifest['skipped'] == {'missing blob': 1}


def test_datasets_streaming_source_gives_the_same_stream_as_the_local_files(tmp_path, tokenizer_file):
    """The hub path (datasets streaming, one part per file shard), run here on local parquet files."""
    from data_prep.sources import HubSource
    rng = np.random.default_rng(4)
    for shard in range(3):
        write_parquet(tmp_path / 'hub' / f'train-{shard}.parquet',
                      {'url': [f'u{shard}-{i}' for i in range(50)], 'text': [sentence(rng) for _ in range(50)]})
    streamed = HubSource('parquet', None, f'{tmp_path}/hub/*.parquet', 'text', 'url')
    assert len(streamed.files()) == 3
    local = parse_source(f'parquet:{tmp_path}/hub/*.parquet', id_column='url')
    for name, source in (('streamed', streamed), ('local', local)):
        convert(Job(source, tokenizer_file, 16, 0.1, str(tmp_path / name)), 2, EOS, BOS, progress=False)
    for split in ('train', 'val'):
        assert token_stream(str(tmp_path / 'streamed' / split)) == token_stream(str(tmp_path / 'local' / split))
