"""The learning benchmark: window means and verdicts, the corpus, the rows' YAML reading the shards in order, and a
whole run of an ours row beside a stand-in torchtitan on two CPU steps."""
import json
import os

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from llmfoundry_ext.measure import benchmark, learning
from llmfoundry_ext.measure.benchmark import Row
from llmfoundry_ext.measure.learning import (Hyper, Plan, our_run_yaml, prepare_data, summarize, verdict,
                                           window_means, write_corpus)
from llmfoundry_ext.measure.time_to_quality import Evaluation
from tests.conftest import FORKED

SOURCE = 'def add(a, b):\n    """Add two numbers."""\n    return a + b\n\n'


def test_windows_average_each_seed_then_the_seeds():
    assert window_means([4.0, 2.0, 3.0, 1.0, 9.0], 2) == [3.0, 2.0]  # the partial last window is left out
    results = [{'name': 'ours', 'losses': [4.0, 2.0, 3.0, 1.0]}, {'name': 'ours', 'losses': [2.0, 2.0, 1.0, 1.0]},
               {'name': 'titan', 'losses': [3.0, 3.0, 1.0, 1.0]}, {'name': 'broken', 'error': 'exit status 1'}]
    assert summarize(results, 2) == {
        'ours': {'seeds': 2, 'mean': [2.5, 1.5], 'low': [2.0, 1.0], 'high': [3.0, 2.0]},
        'titan': {'seeds': 1, 'mean': [3.0, 1.0], 'low': [3.0, 1.0], 'high': [3.0, 1.0]}}


def test_verdict_names_every_window_over_the_tolerance_from_the_first_step_counted():
    summary = {'ours': {'mean': [9.0, 2.02, 2.03, 1.5]}, 'titan': {'mean': [1.0, 2.0, 2.0, 1.5]}}
    assert verdict(summary, 'ours', 'titan', 50, 50, 0.01) == {
        'ours': 'ours', 'theirs': 'titan', 'windows_over': [150], 'final_ours': 1.5, 'final_theirs': 1.5,
        'holds': False}
    summary['ours']['mean'][2] = 2.02  # 1 % over: within
    assert verdict(summary, 'ours', 'titan', 50, 50, 0.01)['holds']
    summary['ours']['mean'][3] = 1.5001  # the last window must not be above
    assert not verdict(summary, 'ours', 'titan', 50, 50, 0.01)['holds']


def test_merged_reports_join_renamed_rows_of_the_files_named(tmp_path):
    """'ours' of the first file was another setting (renamed apart); 'matched' everywhere is now 'ours'."""
    def report(name, rows):
        path = tmp_path / name
        path.write_text(json.dumps(learning.build_report(Hyper(steps=2), 2, {}, rows, [])))
        return str(path)

    first = report('1.json', [{'name': 'ours', 'seed': 1, 'losses': [4.0, 2.0]},
                              {'name': 'matched', 'seed': 1, 'losses': [3.0, 1.0]}])
    second = report('2.json', [{'name': 'ours', 'seed': 2, 'losses': [2.0, 2.0]}])
    merged = learning.merge_reports([first, second], ['ours:old'], [f'{first}:ours=old', 'matched=ours'])
    assert {name: (row['seeds'], row['mean']) for name, row in merged['summary'].items()} == {
        'old': (1, [3.0]), 'ours': (2, [2.0])}
    assert merged['verdicts'][0]['holds'] and merged['verdicts'][0]['final_ours'] == 2.0


def test_decide_merges_the_grids_runs_by_cell_counts_a_run_once_and_refuses_a_file_without_held_out(tmp_path,
                                                                                                       capsys):
    """The runs of the prose lr 1e-3 cell as several calls saved them (one given again in a merged report), the
    tied blocks row's second run averaged with its first, and the grid's other cells missing."""
    from scripts.measure_learning import main

    def runs(name, steps, rows, suffix='.rst.txt'):
        report = learning.build_report(Hyper(steps=steps, lr=1e-3, eval_every=200), 2, {'suffix': suffix}, [
            {'name': row, 'seed': 1, 'losses': [4.0, 3.0], 'held_out': [[200, 2.2], [steps, final]],
             'tokens_per_step': 1000, 'tokens_per_second_per_gpu': speed, 'gpus': 1}
            for row, final, speed in rows], [])
        path = tmp_path / name
        path.write_text(json.dumps(report))
        return str(path)

    bf16 = runs('bf16.json', 400, [('ours-shipped-bf16', 2.0, 1100.0), ('torchtitan', 2.1, 1000.0)])
    blocks = runs('blocks.json', 400, [('ours-shipped-float8-blocks', 2.002, 1600.0),
                                       ('ours-shipped', 2.1, 2000.0)])
    again = runs('again.json', 400, [('ours-shipped-float8-blocks', 2.006, 1600.0)])
    merged = tmp_path / 'merged.json'
    merged.write_text(json.dumps(learning.merge_reports([bf16, blocks], [])))
    python = runs('python.json', 400, [('ours-shipped-bf16', 2.0, 1100.0)], suffix='.py')
    decision_json = str(tmp_path / 'decision.json')
    assert main(['--decide', bf16, blocks, str(merged), again, python, '--json', decision_json]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        'float8 blocks and output layer                       - / - / -            - / +5.00% / 2.00x'
        '                     - / - / -                     - / - / -',
        'decision: none yet (incomplete: float8 blocks lacks its tied row or a time to the target in prose lr 0.0003,'
        ' python lr 0.0003, python lr 0.001, and a second seed in prose lr 0.001)']  # bf16 ran one seed there
    with open(decision_json) as file:
        decision = json.load(file)
    blocks_here = decision['recipes']['float8 blocks']['prose lr 0.001']
    assert blocks_here['tied_gap'] == pytest.approx(0.002, rel=1e-9)  # the mean of 2.002 and 2.006 beside 2.0
    assert blocks_here['sooner'] == pytest.approx(400 / ((200 + 200 * 0.1 / 0.196) * 1000 / 1600), rel=1e-12)
    assert decision['failed'] == ['float8 blocks and output layer']
    speeds = tmp_path / 'speeds.json'  # one call's tokens/s: torchtitan 800 (its grid run: 1,000), blocks 2,000
    speeds.write_text(json.dumps({'rows': [
        {'name': 'torchtitan', 'tokens_per_second_per_gpu': 800.0, 'gpus': 1},
        {'name': 'ours-shipped-float8-blocks', 'tokens_per_second_per_gpu': 1000.0, 'gpus': 2},
        {'name': 'ours-shipped', 'error': 'exit status 1'}]}))
    assert main(['--decide', bf16, blocks, again, '--speeds', str(speeds), '--json', decision_json]) == 2
    assert capsys.readouterr().err.strip() == (
        f'error: {speeds}: no tokens/s of ours-shipped: run them in the speed call too (gpu.sh grid-speed)')
    assert main(['--decide', bf16, again, '--speeds', str(speeds), '--json', decision_json]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"tokens/s: {speeds} (each row's mean over these calls), not the grid's own runs")
    with open(decision_json) as file:
        timed = json.load(file)['recipes']['float8 blocks']['prose lr 0.001']['sooner']
    assert timed == pytest.approx(500 / ((200 + 200 * 0.1 / 0.194) * 1000 / 2000), rel=1e-12)  # 2.006 alone
    bare = tmp_path / 'bare.json'
    bare.write_text(json.dumps({'data': {}, 'hyper': {'lr': 0.001}}))
    assert main(['--decide', bf16, str(bare)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {bare} has no held-out evaluations: the grid's runs are made with --eval-every (gpu.sh grid)")


def test_a_report_of_a_longer_schedule_joins_as_its_own_row_timed_to_the_target(tmp_path):
    """The default trained as long as torchtitan's seconds over 1.15 allow, merged beside the 400-step cell."""
    def report(name, steps, rows):
        path = tmp_path / name
        path.write_text(json.dumps(learning.build_report(Hyper(steps=steps, eval_every=2), 2, {}, rows, [])))
        return str(path)

    def row(name, held_out, tokens_per_second):
        return {'name': name, 'seed': 1, 'losses': [4.0, 3.0], 'held_out': held_out, 'tokens_per_step': 10,
                'tokens_per_second_per_gpu': tokens_per_second, 'gpus': 1}

    cell = report('cell.json', 4, [row('bf16', [[2, 3.0], [4, 2.0]], 100.0),
                                   row('titan', [[2, 3.0], [4, 1.9]], 80.0)])
    check = {'row': 'bf16', 'step': 4, 'ours': 2.0, 'transformers': 2.002, 'relative': 0.001}
    with open(cell) as file:
        saved = json.load(file)
    with open(cell, 'w') as file:
        json.dump(saved | {'transformers_check': [check]}, file)
    longer = report('longer.json', 5, [row('bf16', [[2, 3.0], [4, 2.1], [5, 1.9]], 100.0)])
    merged = learning.merge_reports([cell, longer], [], quality='bf16:titan')
    table = {entry['name']: entry for entry in merged['time_to_quality']}
    assert list(table) == ['bf16', 'titan', 'bf16@5'] and merged['transformers_check'] == [check]
    assert learning.format_check(check) == (
        "transformers' model (fp32) on bf16's export at step 4: held-out 2.0020, our evaluator 2.0000 (+0.100%)")
    longest = table['bf16@5']
    assert (longest['steps'], longest['holds'], longest['tokens_to_target']) == (5, None, 50.0)
    assert longest['sooner'] == pytest.approx((40 / 80) / (50 / 100), rel=1e-12)  # 1.0x: as soon
    assert table['bf16']['steps_in_time'] == 4  # torchtitan's 0.5 s over 1.15 at 100 tokens/s: 43 tokens
    other_lr = tmp_path / 'lr.json'
    other_lr.write_text(json.dumps(learning.build_report(Hyper(steps=4, lr=1e-3, eval_every=2), 2, {}, [], [])))
    with pytest.raises(learning.UnusableRuns, match=r"lr.json: trained with .*'lr': 0.001"):
        learning.merge_reports([cell, str(other_lr)], [])


def test_runs_on_another_corpus_are_not_merged_and_the_command_says_so_in_one_line(tmp_path, capsys):
    """The Python corpus is the machine's installed packages: a run on another machine may have read another one."""
    from scripts.measure_learning import main
    paths = []
    for name, documents in (('here.json', 9850), ('there.json', 9851)):
        path = tmp_path / name
        path.write_text(json.dumps(learning.build_report(Hyper(steps=4), 2, {'documents': documents, 'tokens': 5}, [],
                                                         [])))
        paths.append(str(path))
    assert main(['--report', *paths]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {paths[1]}: trained and evaluated on {{'documents': 9851, 'tokens': 5, 'held_out_documents': None, "
        f"'held_out_tokens': None, 'torchtitan_ranks': 1}}; {paths[0]}: {{'documents': 9850, 'tokens': 5, "
        "'held_out_documents': None, 'held_out_tokens': None, 'torchtitan_ranks': 1} (another corpus: the Python one "
        "is the machine's installed packages; or the same in torchtitan's order on another number of GPUs)")


def test_a_row_that_would_outlast_the_calls_limit_is_not_begun(monkeypatch, capsys):
    """--stop-by 300: row a takes 200 s, 100 of them drawing the shared weights (which a later row of the same
    weights skips), so b (100 s left) begins and ends at 290; c and d, as long as 100 s, would end past 300."""
    clock = iter([0.0, 0.0, 200.0, 200.0, 200.0, 290.0, 290.0, 290.0])
    monkeypatch.setattr(learning.time, 'monotonic', lambda: next(clock))
    monkeypatch.setattr(learning, 'train_row', lambda plan, row, seed, data, folder, work: {
        'name': row.name, 'seed': seed, 'losses': [3.0, 2.0], 'tokens_per_second_per_gpu': 1.0, 'gpus': 1,
        'drawing_seconds': 100.0 if row.name == 'a' else 0.0})
    plan = Plan([Row.parse(f'{name} yamls/demo.yaml') for name in 'abcd'], seeds=[1], width=2, stop_by=300,
                started=0.0)
    report = learning.run(plan, {}, '/nonexistent', [], None)
    assert [row['name'] for row in report['rows']] == ['a', 'b']
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('===')]
    assert lines == [
        '=== a seed 1: last 2 steps 2.5000, 1 tokens/s/GPU, 200 s (its shared weights drawn in 100 s)',
        '=== b seed 1: last 2 steps 2.5000, 1 tokens/s/GPU, 90 s',
        *(f'=== {name} seed 1: not begun: the longest row so far took 100 s, 10 s are left of --stop-by 300'
          for name in 'cd')]


def source_tree(root) -> str:
    for index in range(3):
        os.makedirs(root / f'pkg{index}', exist_ok=True)
        (root / f'pkg{index}' / 'module.py').write_text(f'# file {index}\n' + SOURCE * (30 + 20 * index))
    (root / 'pkg0' / 'notes.txt').write_text('not python')
    return str(root)


def test_corpus_is_shuffled_pieces_in_one_file(tmp_path):
    roots = [source_tree(tmp_path / 'src')]
    described = write_corpus(roots, str(tmp_path / 'a'), 1.0, seed=0)
    pieces = [json.loads(line)['text'] for line in open(tmp_path / 'a' / 'all.jsonl')]
    whole = sorted(learning.source_pieces(roots))
    assert sorted(pieces) == whole and pieces != whole and described['documents'] == len(whole) == 6  # 1 + 2 + 3
    assert os.listdir(tmp_path / 'a') == ['all.jsonl']
    assert max(len(piece) for piece in pieces) == learning.PIECE_CHARS
    write_corpus(roots, str(tmp_path / 'b'), 1.0, seed=0)
    assert open(tmp_path / 'b' / 'all.jsonl').read() == open(tmp_path / 'a' / 'all.jsonl').read()
    write_corpus(roots, str(tmp_path / 'c'), 1.0, seed=1)
    assert open(tmp_path / 'c' / 'all.jsonl').read() != open(tmp_path / 'a' / 'all.jsonl').read()
    assert write_corpus(roots, str(tmp_path / 'd'), 0.005)['documents'] == 2  # cut at 5,000 bytes
    kept = [json.loads(line)['text'] for line in open(tmp_path / 'd' / 'all.jsonl')]
    assert learning.held_out_pieces(roots, 2) == pieces[2:] and kept == pieces[:2]  # the same shuffle, the rest



def test_a_corpus_of_other_files_takes_those_ending_in_its_suffix(tmp_path):
    root = tmp_path / 'docs'
    os.makedirs(root / 'admin-guide')
    (root / 'admin-guide' / 'README.rst.txt').write_text('What is Linux? ' * 200)  # 3,000 characters: 2 pieces
    (root / 'index.rst.txt').write_text('Welcome.')
    (root / 'index.html').write_text('<p>Welcome.</p>')
    assert learning.source_pieces([str(root)], '.rst.txt') == [  # a folder's files before its subfolders'
        'Welcome.', ('What is Linux? ' * 200)[:2000], ('What is Linux? ' * 200)[2000:]]
    described = write_corpus([str(root)], str(tmp_path / 'corpus'), 1.0, suffix='.rst.txt')
    assert (described['documents'], described['suffix']) == (3, '.rst.txt')
    assert learning.source_pieces([str(root)]) == []  # no .py there

def small_tokenizer(folder) -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator([SOURCE * 10], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(folder)
    path = os.path.join(folder, 'tokenizer.json')
    tokenizer.save(path)
    return path


@pytest.fixture(scope='module')
def learning_data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp('learning')
    return prepare_data(str(root / 'work'), [source_tree(root / 'src')], 1.0, SEQ_LEN,
                        small_tokenizer(str(root / 'source-tokenizer')))


SEQ_LEN = 63  # torchtitan's seq_len and our max_seq_len: our windows are 64


SMALL = ('max_seq_len=63 global_batch_size=2 device_microbatch_size=2 precision=fp32 model.n_layers=2 '
         'model.vocab_size=512 parallelism.fsdp=null')


def test_our_rows_read_the_shards_in_order_with_the_benchmarks_optimizer(learning_data, tmp_path, launched_alone):
    from llmfoundry_ext.build import build_collator
    from llmfoundry_ext.data.dataloader import build_dataloader
    from llmfoundry_ext.preflight import prepare

    hyper = Hyper(steps=7, lr=1e-3, warmup=2)
    yaml = our_run_yaml(Row.parse(f'ours yamls/demo.yaml {SMALL} optimizer.weight_decay=0.0'), str(tmp_path),
                        learning_data, hyper, seed=5)
    run = prepare(yaml)
    config = run.config
    assert (config.seed, config.max_duration, config.data.eval, config.checkpoint.save_folder) == (5, '7ba', None, None)
    assert (config.max_seq_len, config.model.max_seq_len) == (SEQ_LEN, SEQ_LEN)
    assert config.optimizer == {'name': 'adamw', 'fused': True, 'lr': 1e-3, 'betas': [0.9, 0.95], 'eps': 1e-8,
                                'weight_decay': 0.0}  # the row's own override: the change it measures
    assert config.scheduler == {'name': 'linear_with_warmup', 't_warmup': '2ba', 'alpha_f': 0.0}
    assert config.algorithms['gradient_clipping'] == {'clipping_type': 'norm', 'clipping_threshold': 1.0}
    loader = build_dataloader(config.data.train, config.device_batch_size, build_collator(run))
    batches = [batch['sample_ids'].tolist() for batch, _ in zip(loader.dataloader, range(3))]
    assert batches == [[0, 1], [2, 3], [4, 5]]


def torchtitan_samples(corpus: str, tokenizer: str, seq_len: int, count: int) -> list[tuple[list, list]]:
    """The first ``count`` (input, label) samples torchtitan v0.2.2 makes of ``corpus`` (its
    ``HuggingFaceDataset.__iter__``: each document's ids between BOS and EOS appended to one buffer, samples of
    seq_len + 1 tokens cut off its front, input the first seq_len, label the last seq_len)."""
    tokens = Tokenizer.from_file(os.path.join(tokenizer, 'tokenizer.json'))
    bos, eos = tokens.token_to_id(learning.BOS), tokens.token_to_id(learning.EOS)
    buffer, samples = [], []
    for line in open(os.path.join(corpus, 'all.jsonl')):
        buffer += [bos, *tokens.encode(json.loads(line)['text'], add_special_tokens=False).ids, eos]
        while len(buffer) >= seq_len + 1 and len(samples) < count:
            window, buffer = buffer[:seq_len + 1], buffer[seq_len + 1:]
            samples.append((window[:-1], window[1:]))
    return samples


def test_each_batch_holds_torchtitans_samples_token_for_token(learning_data, tmp_path, launched_alone):
    """Every sample of the corpus (46 of 64 tokens), inputs and labels: every position labelled, the last by the
    window's last token, so the loss and gradients are torchtitan's."""
    from llmfoundry_ext.build import build_collator
    from llmfoundry_ext.data.dataloader import build_dataloader
    from llmfoundry_ext.preflight import prepare

    run = prepare(our_run_yaml(Row.parse(f'ours yamls/demo.yaml {SMALL}'), str(tmp_path), learning_data,
                               Hyper(steps=2), seed=5))
    loader = build_dataloader(run.config.data.train, run.config.device_batch_size, build_collator(run))
    ours = [(sample.tolist(), labels.tolist())
            for batch in loader.dataloader for sample, labels in zip(batch['input_ids'], batch['labels'])]
    theirs = torchtitan_samples(learning_data['corpus'], learning_data['tokenizer'], SEQ_LEN, len(ours))
    assert (len(ours), learning_data['tokens'] // (SEQ_LEN + 1)) == (46, 47)  # 23 whole batches of 2 windows
    assert ours == theirs


def test_torchtitans_ranks_read_contiguous_shares_of_the_documents():
    """datasets' split_dataset_by_node of a map-style dataset, as torchtitan v0.2.2 splits its data over GPUs."""
    assert learning.rank_shares(5, 2) == [range(0, 3), range(3, 5)]
    assert learning.rank_shares(4, 2) == [range(0, 2), range(2, 4)]
    assert learning.rank_shares(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert learning.rank_shares(3, 1) == [range(0, 3)]


@pytest.fixture(scope='module')
def two_rank_data(tmp_path_factory) -> dict:
    """The corpus of 3 of the tree's 6 pieces in torchtitan's order for 2 GPUs, the other 3 held out."""
    root = tmp_path_factory.mktemp('two-ranks')
    return prepare_data(str(root / 'work'), [source_tree(root / 'src')], 0.006, SEQ_LEN,
                        small_tokenizer(str(root / 'source-tokenizer')), held_out_megabytes=1.0, ranks=2)


def shares_samples(corpus: str, tokenizer: str, folder) -> list[list]:
    """Each of 2 GPUs' torchtitan windows: ``corpus``'s first 2 documents and its last (3 split by node), each share
    packed on its own."""
    lines = open(os.path.join(corpus, 'all.jsonl')).readlines()
    windows = []
    for name, share in (('a', lines[:(len(lines) + 1) // 2]), ('b', lines[(len(lines) + 1) // 2:])):
        os.makedirs(folder / name)
        (folder / name / 'all.jsonl').write_text(''.join(share))
        windows.append([inputs + labels[-1:] for inputs, labels in
                        torchtitan_samples(str(folder / name), tokenizer, SEQ_LEN, 10 ** 6)])
    return windows


READ_ON_TWO_RANKS = """
import json, sys
from llmfoundry_ext.build import build_collator
from llmfoundry_ext.data.dataloader import build_dataloader
from llmfoundry_ext.preflight import prepare
run = prepare(sys.argv[1])
section = run.config.data.eval if sys.argv[2] == 'eval' else run.config.data.train
loader = build_dataloader(section, run.config.device_batch_size, build_collator(run), held_out=sys.argv[2] == 'eval')
print(json.dumps([[*batch['input_ids'][0].tolist(), batch['labels'][0, -1].item()] for batch in loader.dataloader]))
"""


def test_on_two_gpus_each_rank_reads_torchtitans_samples_of_that_rank(two_rank_data, tmp_path):
    """Training and held-out shards interleave the two shares' windows (cut to the shorter share's); read on 2
    ranks, rank r's batches are torchtitan's rank r's samples in order, token for token."""
    import subprocess
    import sys

    from streaming import StreamingDataset

    row = Row.parse(f'ours yamls/demo.yaml {SMALL} device_microbatch_size=1')
    yaml = our_run_yaml(row, str(tmp_path), two_rank_data, Hyper(steps=2, eval_every=2, eval_batches=2), seed=5)
    for section, corpus, mds in (('train', 'corpus', 'mds'), ('eval', 'held_out_corpus', 'held_out_mds')):
        first, second = shares_samples(two_rank_data[corpus], two_rank_data['tokenizer'], tmp_path / section)
        count = min(len(first), len(second))
        stored = StreamingDataset(local=two_rank_data[mds], shuffle=False, batch_size=1)
        assert [stored[index]['tokens'].tolist() for index in range(len(stored))] == [
            window for pair in zip(first[:count], second[:count]) for window in pair]
        assert two_rank_data['tokens' if section == 'train' else 'held_out_tokens'] == 2 * count * (SEQ_LEN + 1)
        ranks = [subprocess.Popen([sys.executable, '-c', READ_ON_TWO_RANKS, yaml, section], stdout=subprocess.PIPE,
                                  text=True, cwd=learning.REPO,
                                  env={**os.environ, 'RANK': str(rank), 'LOCAL_RANK': str(rank), 'WORLD_SIZE': '2',
                                       'LOCAL_WORLD_SIZE': '2', 'NODE_RANK': '0', 'MASTER_ADDR': '127.0.0.1',
                                       'MASTER_PORT': '29617'})
                 for rank in (0, 1)]
        read = [json.loads(process.communicate(timeout=120)[0]) for process in ranks]
        assert [process.returncode for process in ranks] == [0, 0]
        assert read == [first[:count], second[:count]]
        assert count >= 3


FAKE_TORCHTITAN = """
import json, os, sys
env = {key: os.environ[key] for key in ('LR', 'WARMUP', 'SEED', 'DATA_JSON', 'STEPS', 'TT_TIMEOUT', 'FLAVOR')}
steps = [{'step': s, 'tps': 1000, 'mfu': 50.0, 'mem_gib': 60.0, 'loss': 9.0 - s} for s in range(1, int(env['STEPS']) + 1)]
json.dump({sys.argv[1]: {'rows': steps}}, open(os.environ['OUT'] + '/tt_summary.json', 'w'))
json.dump(env, open(os.environ['OUT'] + '/env.json', 'w'))
with open(os.environ['OUT'] + f'/tt_{sys.argv[1]}.log', 'w') as log:
    for s in range(1, int(env['STEPS']) + 1):
        print(f'step: {s:2}  loss: {9.0 - s:8.5f}  grad_norm: {0.5 * s:7.4f}  memory: 60.00GiB(75.00%)', file=log)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_trains_each_row_on_each_seed_and_writes_the_table(learning_data, tmp_path, monkeypatch, capsys):
    script = tmp_path / 'run.sh'
    script.write_text(f"python3 - \"$1\" <<'EOF'{FAKE_TORCHTITAN}EOF\n")
    monkeypatch.setattr(benchmark, 'TORCHTITAN_SCRIPT', str(script))
    monkeypatch.setattr(benchmark, 'LAUNCHER', FORKED)  # our rows' ranks fork from one import
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    plan = Plan([Row.parse(f'ours yamls/demo.yaml {SMALL}'), Row.parse('titan torchtitan:compile FLAVOR=1B')],
                seeds=[1, 2], single_seed=('ours',), hyper=Hyper(steps=4, lr=1e-3, warmup=1), width=2)
    assert [(seed, row.name) for seed, row in plan.runs()] == [(1, 'ours'), (1, 'titan'), (2, 'titan')]
    report = learning.run(plan, learning_data, str(tmp_path / 'work'), ['ours:titan'], str(tmp_path / 'out.json'))
    ours, titan_1, titan_2 = report['rows']
    assert len(ours['losses']) == 4 and ours['seed'] == 1 and ours['tokens_per_second_per_gpu'] > 0
    assert titan_2['losses'] == [8.0, 7.0, 6.0, 5.0] and titan_2['seed'] == 2
    assert titan_2['grad_norms'] == [0.5, 1.0, 1.5, 2.0]
    assert len(ours['grad_norms']) == 4 and all(norm > 0 for norm in ours['grad_norms'])  # fused AdamW's folded clip
    env = json.load(open(tmp_path / 'work' / 'rows' / 'titan-seed2' / 'env.json'))
    assert env == {'LR': '0.001', 'WARMUP': '1', 'SEED': '2', 'DATA_JSON': f"{learning_data['corpus']}/all.jsonl",
                   'STEPS': '4', 'TT_TIMEOUT': '128', 'FLAVOR': '1B'}
    assert report['summary']['titan'] == {'seeds': 2, 'mean': [7.5, 5.5], 'low': [7.5, 5.5], 'high': [7.5, 5.5]}
    assert json.load(open(tmp_path / 'out.json'))['summary'] == report['summary']
    printed = capsys.readouterr().out
    assert '   1-2     ' in printed and 'ours vs titan: ' in printed


FAKE_TORCHTITAN_WITH_CHECKPOINTS = FAKE_TORCHTITAN + """
open(os.environ['OUT'] + '/toml', 'w').write('''[checkpoint]
enable = false
''')
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_with_a_shared_init_every_row_of_a_seed_starts_from_the_same_weights(learning_data, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from llmfoundry_ext.build import build_model
    from llmfoundry_ext.preflight import prepare

    script = tmp_path / 'run.sh'
    script.write_text(f"python3 - \"$1\" <<'EOF'{FAKE_TORCHTITAN_WITH_CHECKPOINTS}EOF\n")
    monkeypatch.setattr(benchmark, 'TORCHTITAN_SCRIPT', str(script))
    monkeypatch.setattr(benchmark, 'LAUNCHER', FORKED)  # our rows' ranks fork from one import
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    ours = Row.parse(f'ours yamls/demo.yaml {SMALL} model.init_scheme=torchtitan model.tie_embeddings=false')
    plan = Plan([ours, Row.parse('titan torchtitan:compile FLAVOR=1B')], seeds=[3], hyper=Hyper(steps=2, warmup=1),
                width=2, shared_init=ours)
    work = tmp_path / 'work'
    report = learning.run(plan, learning_data, str(work), [], None)
    assert [(row['name'], row['shared_init'], len(row['losses'])) for row in report['rows']] == [
        ('ours', str(ours), 2), ('titan', str(ours), 2)]
    weights = str(work / 'init-ours-seed3')  # one a seed and shared model (the shipped tied 1B draws its own)
    assert json.load(open(work / 'rows' / 'titan-seed3' / 'env.json'))['SEED'] == '3'
    assert open(work / 'rows' / 'titan-seed3' / 'toml').read() == (
        f'[checkpoint]\nenable = true\nload_only = true\ninitial_load_path = "{weights}"\ninitial_load_in_hf = true\n')
    drawn = load_file(f'{weights}/model.safetensors')
    assert drawn['model.embed_tokens.weight'].std().item() == pytest.approx(1.0, abs=0.02)  # torchtitan's scheme

    yaml = our_run_yaml(learning.starting_from(ours, weights), str(tmp_path), learning_data, plan.hyper,
                        seed=99)  # another seed: the weights still win
    model, _ = build_model(prepare(yaml))
    loaded = dict(model.model.named_parameters())
    assert sorted(loaded) == sorted(name.removeprefix('model.') for name in drawn)
    assert all(loaded[name.removeprefix('model.')].equal(tensor) for name, tensor in drawn.items())
    redrawn = tmp_path / 'again'
    learning.write_shared_init(yaml, 3, str(redrawn))
    assert all(load_file(f'{redrawn}/model.safetensors')[name].equal(tensor) for name, tensor in drawn.items())


def test_prepared_data_is_used_again_for_the_same_request(learning_data):
    index = os.path.join(learning_data['mds'], 'index.json')
    written = os.stat(index).st_mtime_ns
    work = os.path.dirname(learning_data['corpus'])
    source_tokenizer = os.path.join(os.path.dirname(work), 'source-tokenizer', 'tokenizer.json')
    again = prepare_data(work, learning_data['roots'], 1.0, SEQ_LEN, source_tokenizer)
    assert again == learning_data and os.stat(index).st_mtime_ns == written


def test_the_table_of_a_run_whose_rows_all_failed_is_its_header():
    assert learning.format_windows({}, 50) == 'steps      '


@pytest.fixture(scope='module')
def held_out_data(tmp_path_factory) -> dict:
    """A corpus of 2 of the tree's 6 pieces, the other 4 held out."""
    root = tmp_path_factory.mktemp('held-out')
    return prepare_data(str(root / 'work'), [source_tree(root / 'src')], 0.005, SEQ_LEN,
                        small_tokenizer(str(root / 'source-tokenizer')), held_out_megabytes=1.0)


def test_the_held_out_documents_are_the_pieces_the_corpus_left_out(held_out_data):
    trained = [json.loads(line)['text'] for line in open(f"{held_out_data['corpus']}/all.jsonl")]
    held = [json.loads(line)['text'] for line in open(f"{held_out_data['held_out_corpus']}/all.jsonl")]
    assert (len(trained), len(held), held_out_data['held_out_documents']) == (2, 4, 4)
    assert held == learning.held_out_pieces(held_out_data['roots'], 2) and not set(held) & set(trained)
    assert held_out_data['held_out_tokens'] > 0 and os.path.isfile(f"{held_out_data['held_out_mds']}/index.json")


def test_a_corpus_that_takes_every_piece_leaves_none_to_evaluate_on(tmp_path):
    with pytest.raises(ValueError, match=r'the corpus took every piece of .*: none is left out to evaluate on; '
                                         r'lower --corpus-mb'):
        prepare_data(str(tmp_path / 'work'), [source_tree(tmp_path / 'src')], 1.0, SEQ_LEN,
                     small_tokenizer(str(tmp_path / 'tokenizer')), held_out_megabytes=1.0)


FAKE_VALIDATING_TORCHTITAN = FAKE_TORCHTITAN + """
validation = '''[validation]
enable = false
''' + '-m torchtitan.train'  # what the runner replaces
with open(os.environ['OUT'] + f'/tt_{sys.argv[1]}.log', 'a') as log:
    for s in (1, 2, 4):
        print(f'validate step: {s:2}  loss: {6.0 - s / 2:7.4f}  memory: 60.00GiB(75.00%)  tps: 9,000', file=log)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_row_is_evaluated_on_the_held_out_documents_and_timed_to_the_target(held_out_data, tmp_path,
                                                                                   monkeypatch, capsys):
    script = tmp_path / 'run.sh'
    script.write_text(f"python3 - \"$1\" <<'EOF'{FAKE_VALIDATING_TORCHTITAN}EOF\n")
    monkeypatch.setattr(benchmark, 'TORCHTITAN_SCRIPT', str(script))
    monkeypatch.setattr(benchmark, 'LAUNCHER', FORKED)
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    plan = Plan([Row.parse(f'ours yamls/demo.yaml {SMALL}'), Row.parse('titan torchtitan:compile FLAVOR=1B LBS=2')],
                seeds=[1], hyper=Hyper(steps=5, lr=1e-3, warmup=1, eval_every=2, eval_batches=1), width=2,
                transformers_check='ours')
    report = learning.run(plan, held_out_data, str(tmp_path / 'work'), [], None, quality='ours:titan')
    ours, titan = report['rows']
    # every 2 steps and at the schedule's end: a longer run's last evaluation is its last step's
    assert [step for step, _ in ours['held_out']] == [2, 4, 5] and all(0 < loss < 20 for _, loss in ours['held_out'])
    assert titan['held_out'] == [[1, 5.5], [2, 5.0], [4, 4.0]]
    assert (ours['tokens_per_step'], titan['tokens_per_step']) == (2 * SEQ_LEN, 2 * 8192)
    env = json.load(open(tmp_path / 'work' / 'rows' / 'titan-seed1' / 'env.json'))
    assert env['DATA_JSON'] == f"{held_out_data['corpus']}/all.jsonl"
    quality = {entry['name']: entry for entry in report['time_to_quality']}
    assert quality['titan']['target'] == 4.0 and quality['titan']['sooner'] == 1.0
    assert quality['ours']['gaps'] == {2: 0.0, 4: 0.0, 5: 0.0} and quality['ours']['holds']
    assert quality['titan']['gaps'] == pytest.approx({2: 5.0 / ours['held_out'][0][1] - 1,
                                                      4: 4.0 / ours['held_out'][1][1] - 1})
    out = capsys.readouterr().out
    assert "target: titan's final held-out loss 4.0000; gaps against ours at equal tokens" in out
    # transformers' LlamaForCausalLM on the trained weights, the batches our last evaluation read (fp32 both)
    check, = report['transformers_check']
    assert (check['row'], check['step'], check['ours']) == ('ours', 5, ours['held_out'][-1][1])
    assert check['transformers'] == pytest.approx(check['ours'], rel=1e-5) and abs(check['relative']) < 1e-5
    saved = torch.load(tmp_path / 'work' / 'rows' / 'ours-seed1' / 'export' / 'held_out.pt')
    assert saved['input_ids'].shape == saved['labels'].shape == (2, SEQ_LEN)  # eval_batches 1 of 2 samples
    assert f"transformers' model (fp32) on ours's export at step 5: held-out {check['transformers']:.4f}" in out


def test_the_held_out_batches_are_torchtitans_validation_samples(held_out_data, tmp_path, launched_alone):
    """Our evaluation reads the held-out documents as torchtitan's validation packs them, token for token."""
    from llmfoundry_ext.build import build_collator
    from llmfoundry_ext.data.dataloader import build_dataloader
    from llmfoundry_ext.preflight import prepare

    run = prepare(our_run_yaml(Row.parse(f'ours yamls/demo.yaml {SMALL}'), str(tmp_path), held_out_data,
                               Hyper(steps=2, eval_every=2, eval_batches=3), seed=5))
    assert (run.config.eval_interval, run.config.eval_subset_num_batches) == ('2ba', 3)
    loader = build_dataloader(run.config.data.eval, run.config.device_batch_size, build_collator(run), held_out=True)
    ours = [(sample.tolist(), labels.tolist())
            for batch in loader.dataloader for sample, labels in zip(batch['input_ids'], batch['labels'])]
    theirs = torchtitan_samples(held_out_data['held_out_corpus'], held_out_data['tokenizer'], SEQ_LEN, len(ours))
    assert len(ours) == held_out_data['held_out_tokens'] // (SEQ_LEN + 1) // 2 * 2  # whole batches of 2
    assert ours == theirs


def test_the_held_out_loss_is_the_mean_token_loss_of_the_first_batches(held_out_data, tmp_path, launched_alone):
    """The recorded held-out loss after the last step equals the mean cross-entropy of the trained model over every
    label of the first 3 batches of torchtitan's validation samples, computed here by hand."""
    import torch
    import torch.nn.functional as F

    from llmfoundry_ext.measure.benchmark import HeldOutRecorder
    from llmfoundry_ext.preflight import prepare
    from llmfoundry_ext.train import train

    run = prepare(our_run_yaml(Row.parse(f'ours yamls/demo.yaml {SMALL}'), str(tmp_path), held_out_data,
                               Hyper(steps=2, eval_every=1, eval_batches=3), seed=5))
    recorder = HeldOutRecorder()
    trainer = train(run, extra_callbacks=[recorder])
    samples = torchtitan_samples(held_out_data['held_out_corpus'], held_out_data['tokenizer'], SEQ_LEN, 3 * 2)
    inputs, labels = (torch.tensor([sample[part] for sample in samples]) for part in (0, 1))
    with torch.no_grad():
        logits = trainer.state.model.model(inputs)
    expected = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()).item()
    trainer.close()
    assert [step for step, _ in recorder.evaluations] == [1, 2]
    assert recorder.evaluations[1][1] == pytest.approx(expected, rel=1e-6)
    assert recorder.evaluations[0][1] != recorder.evaluations[1][1]  # the model of batch 1 is not batch 2's


def test_a_mixture_of_experts_row_trains_from_its_shared_weights_and_is_evaluated_held_out(held_out_data, tmp_path,
                                                                                           monkeypatch):
    """gpu.sh grid's Mixtral rows (float8 experts beside bf16): a small Mixtral drawn once as an HF folder, loaded
    by the row, and evaluated every 2 steps on the held-out documents (cross entropy, the router's loss left out)."""
    from safetensors.torch import load_file

    monkeypatch.setattr(benchmark, 'LAUNCHER', FORKED)
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    moe = Row.parse(f'moe yamls/demo.yaml {SMALL} model.family=mixtral model.n_experts=4 model.experts_per_token=2 '
                    'model.ffn_dim=64')
    plan = Plan([moe], seeds=[1], hyper=Hyper(steps=4, lr=1e-3, warmup=1, eval_every=2, eval_batches=1), width=2,
                shared_init=moe)
    row, = learning.run(plan, held_out_data, str(tmp_path / 'work'), [], None, quality='moe:moe')['rows']
    drawn = load_file(str(tmp_path / 'work' / 'init-moe-seed1' / 'model.safetensors'))
    assert drawn['model.layers.1.block_sparse_moe.experts.3.w2.weight'].shape == (128, 64)
    assert row['shared_init'] == str(moe) and [step for step, _ in row['held_out']] == [2, 4]
    assert all(0 < loss < 7 for _, loss in row['held_out'])  # ln(512) = 6.24 at the start


def test_runs_are_keyed_by_seed_unless_a_seed_is_unnamed_or_repeated():
    run = lambda seed, final: {'seed': seed, 'held_out': [[100, 3.0], [400, final]]}
    assert learning.by_seed([run(2, 1.5), run(1, 1.4)]) == {
        2: [Evaluation(100, 3.0), Evaluation(400, 1.5)], 1: [Evaluation(100, 3.0), Evaluation(400, 1.4)]}
    assert learning.by_seed([run(1, 1.5), run(1, 1.4)]) is None  # one seed run twice: their mean, as before
    assert learning.by_seed([run(None, 1.5)]) is None
