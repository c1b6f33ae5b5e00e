"""The learning benchmark: our model, torchtitan and transformers' Llama trained on the same tokens of a real text
with the same hyper-parameters, several seeds each; the mean loss of each window of steps side by side.

The text is Python source (the machine's installed packages: tens of MB on any machine with PyTorch), or any other
files under given folders (the English prose of Debian's linux-doc: docs/learning.md), cut into pieces of
``PIECE_CHARS`` characters and shuffled with a fixed seed, tokenized with torchtitan's
test tokenizer (2,000 ids; BOS and EOS added as ids 2,002 and 2,003, as torchtitan loads it). torchtitan reads the
JSON-lines file in order, each document between BOS and EOS, and cuts the stream into samples of seq_len + 1 tokens
(inputs the first seq_len, labels the last seq_len). Ours reads the same file converted by
``data_prep/convert_to_mds.py`` as one part into windows of seq_len + 1 tokens, in order (``shuffle: false``), and
trains at ``max_seq_len`` seq_len, the window's last token the last position's label (``data.collate``), so each
step's inputs, labels, loss and gradients are torchtitan's, token for token. (Windows of seq_len
drifted one token a sample from torchtitan's, and parts converted apart dropped their tails: on the 1B, a drift of
~40 tokens decided whether the step after the warm-up's peak spiked, and with it the run's next hundreds of steps:
docs/learning.md.) Rows are the throughput
benchmark's (``benchmark.Row``): ``NAME yamls/x.yaml overrides``, ``NAME hf:yamls/x.yaml ...``,
``NAME torchtitan:SETTING ENV=...``. Every row gets ``Hyper``'s optimizer and schedule (torchtitan's AdamW with a
linear warm-up and a linear decay to 0, clipping at 1.0), but where an ours or hf row's own overrides set them.
"""
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
from omegaconf import OmegaConf

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.measure import REPO
from llmfoundry_ext.measure.benchmark import Row, run_row, transformers_held_out_loss
from llmfoundry_ext.measure.time_to_quality import (RECIPES, TARGET, Curve, Evaluation, cell_name, compare, decide,
                                                  format_decision, over_seeds, row_of)
from llmfoundry_ext.measure.time_to_quality import format_table as format_quality
from llmfoundry_ext.config import read_yaml
from llmfoundry_ext.data.mds import TOKENS, read_manifest, write_mds
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.weights import save_hf

PIECE_CHARS = 2000
BOS, EOS = '<|begin_of_text|>', '<|end_of_text|>'
TORCHTITAN_TOKENIZER = os.path.join(REPO, '.anchors', 'torchtitan', 'tests', 'assets', 'tokenizer', 'tokenizer.json')


@dataclass(frozen=True)
class Hyper:
    """What every row trains with: torchtitan's optimizer settings, its warm-up then linear decay to 0."""
    steps: int = 500
    lr: float = 3e-4
    warmup: int = 20
    betas: tuple = (0.9, 0.95)
    weight_decay: float = 0.1
    eps: float = 1e-8
    clip: float = 1.0
    eval_every: int = 0  # held-out loss every so many steps (0: none): ours at eval_interval, torchtitan validating
    eval_batches: int = 16  # batches of the local batch an evaluation reads (the same documents every time)


def source_pieces(roots: list[str], suffix: str = '.py', piece_chars: int = PIECE_CHARS) -> list[str]:
    """Every file under ``roots`` whose name ends in ``suffix`` (sorted paths, undecodable files skipped) cut into
    pieces of ``piece_chars`` characters; whitespace-only pieces dropped."""
    pieces = []
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            subfolders.sort()
            for name in sorted(files):
                if not name.endswith(suffix):
                    continue
                try:
                    with open(os.path.join(folder, name), encoding='utf-8') as file:
                        text = file.read()
                except (UnicodeDecodeError, OSError):
                    continue
                pieces += [text[i:i + piece_chars] for i in range(0, len(text), piece_chars)
                           if text[i:i + piece_chars].strip()]
    return pieces


def write_corpus(roots: list[str], folder: str, max_megabytes: float, seed: int = 0, suffix: str = '.py') -> dict:
    """The pieces of ``roots``' ``suffix`` files shuffled with ``seed``, cut at ``max_megabytes`` of UTF-8, as JSON
    lines ``{"text": ...}`` in ``all.jsonl`` (torchtitan's input, and the converter's one part). Returns their
    description."""
    documents, size = write_pieces(shuffled_pieces(roots, seed, suffix), folder, max_megabytes)
    return {'roots': roots, 'suffix': suffix, 'documents': documents, 'megabytes': size / 1e6, 'seed': seed,
            'piece_chars': PIECE_CHARS}


def write_pieces(pieces: list[str], folder: str, max_megabytes: float) -> tuple[int, int]:
    """``pieces`` in order as JSON lines ``{"text": ...}`` in ``folder``/all.jsonl, cut at ``max_megabytes`` of
    UTF-8; returns the documents and bytes written."""
    lines, size = [], 0
    for piece in pieces:
        line = json.dumps({'text': piece}) + '\n'
        if size + len(line.encode()) > max_megabytes * 1e6:
            break
        lines.append(line)
        size += len(line.encode())
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'all.jsonl'), 'w') as file:
        file.writelines(lines)
    return len(lines), size


def shuffled_pieces(roots: list[str], seed: int, suffix: str = '.py') -> list[str]:
    """``source_pieces`` in the order ``write_corpus`` writes them (and cuts them) with ``seed``."""
    pieces = source_pieces(roots, suffix)
    random.Random(seed).shuffle(pieces)
    return pieces


def held_out_pieces(roots: list[str], documents: int, seed: int = 0, suffix: str = '.py') -> list[str]:
    """The pieces of ``roots`` that ``write_corpus`` left out of a corpus of ``documents`` pieces."""
    return shuffled_pieces(roots, seed, suffix)[documents:]


def write_tokenizer(folder: str, source: str = TORCHTITAN_TOKENIZER) -> str:
    """torchtitan's test tokenizer with its BOS and EOS added after the vocabulary (ids 2,002 and 2,003), as its
    loader adds them; returns the folder holding the tokenizer.json."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(source)
    tokenizer.add_special_tokens([BOS, EOS])
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, 'tokenizer.json'))
    return folder


def convert_corpus(corpus: str, tokenizer: str, window: int, out: str) -> dict:
    """``data_prep/convert_to_mds.py`` on the corpus as one part (its tokenizer's threads on every core); returns its
    manifest's train figures."""
    command = [sys.executable, os.path.join(REPO, 'data_prep', 'convert_to_mds.py'),
               '--source', f'jsonl:{corpus}/all.jsonl', '--tokenizer', tokenizer, '--concat-tokens', str(window),
               '--out', out, '--processes', '1', '--bos-token', BOS, '--eos-token', EOS]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(f'converting the corpus failed: {result.stderr.strip().splitlines()[-1]}')
    return json.loads(result.stdout.strip().splitlines()[-1])['train']


def rank_shares(documents: int, ranks: int) -> list[range]:
    """The documents each of torchtitan's ``ranks`` data-parallel ranks reads: datasets' ``split_dataset_by_node``
    of a map-style dataset (``Dataset.shard(contiguous=True)``): contiguous shares, the first ``documents % ranks``
    one document longer."""
    share, longer = divmod(documents, ranks)
    return [range(share * rank + min(rank, longer), share * (rank + 1) + min(rank + 1, longer))
            for rank in range(ranks)]


def convert_in_torchtitans_order(corpus: str, tokenizer: str, window: int, out: str, ranks: int = 1) -> dict:
    """``convert_corpus``, its windows in the order torchtitan reads them on ``ranks`` GPUs: each rank packs its own
    share of the documents (``rank_shares``) and a step takes each rank's next window, so the shards hold share 0's
    window 0, share 1's window 0, ..., then every share's window 1; ours on as many GPUs gives rank r the samples
    r, r + ranks, ... (streaming's partition, unshuffled): each rank trains on torchtitan's rank's samples, token
    for token. Every share is cut to the shortest one's windows. Returns the train figures (``tokens``)."""
    if ranks == 1:
        return convert_corpus(corpus, tokenizer, window, out)
    from streaming import StreamingDataset

    with open(os.path.join(corpus, 'all.jsonl')) as file:
        documents = file.readlines()
    shares = []
    for rank, share in enumerate(rank_shares(len(documents), ranks)):
        folder = f'{out}-rank{rank}'
        os.makedirs(os.path.join(folder, 'corpus'), exist_ok=True)
        with open(os.path.join(folder, 'corpus', 'all.jsonl'), 'w') as file:
            file.writelines(documents[share.start:share.stop])
        convert_corpus(os.path.join(folder, 'corpus'), tokenizer, window, os.path.join(folder, 'mds'))
        shares.append(StreamingDataset(local=os.path.join(folder, 'mds', 'train'), shuffle=False, batch_size=1))
    windows = (share[index][TOKENS] for index in range(min(map(len, shares))) for share in shares)
    first = os.path.join(f'{out}-rank0', 'mds', 'train')
    return write_mds(os.path.join(out, 'train'), windows, {**read_manifest(first), 'torchtitan_ranks': ranks})


def our_run_yaml(row: Row, folder: str, data: dict, hyper: Hyper, seed: int) -> str:
    """An ours or hf row's YAML: the row's YAML and overrides, reading ``data``'s shards in order at their window
    (torchtitan's samples: the module docstring), with ``hyper``'s optimizer, schedule and clipping (but where the
    row's own overrides set them: the change under test) and ``seed``; no evaluation, checkpoints or loggers.
    Returns its path."""
    raw = read_yaml(row.source, row.overrides)
    seq_len = data['window'] - 1
    raw.setdefault('model', {})['max_seq_len'] = seq_len
    raw.update(seed=seed, max_duration=f'{hyper.steps}ba', loggers={}, downstream=None, max_seq_len=seq_len,
               checkpoint={'save_folder': None, 'autoresume': False},
               optimizer={'name': 'adamw', 'fused': True, 'lr': hyper.lr, 'betas': list(hyper.betas),
                          'eps': hyper.eps, 'weight_decay': hyper.weight_decay},
               scheduler={'name': 'linear_with_warmup', 't_warmup': f'{hyper.warmup}ba', 'alpha_f': 0.0},
               algorithms={**(raw.get('algorithms') or {}),
                           'gradient_clipping': {'clipping_type': 'norm', 'clipping_threshold': hyper.clip}},
               callbacks={name: args for name, args in (raw.get('callbacks') or {}).items() if name != 'stop_after'})
    raw['data'] = {**{key: value for key, value in raw.get('data', {}).items() if key not in ('train', 'eval')},
                   'tokenizer': data['tokenizer'],
                   'eos_token': EOS, 'train': {'streams': {'text': {'local': data['mds']}}, 'shuffle': False,
                                               'num_canonical_nodes': 1, 'num_workers': 0}}  # in order
    if hyper.eval_every:  # the held-out documents' windows in order: torchtitan's validation samples
        raw['data']['eval'] = {'streams': {'held_out': {'local': data['held_out_mds']}}, 'shuffle': False,
                               'num_canonical_nodes': 1, 'num_workers': 0}
        raw.update(eval_interval=f'{hyper.eval_every}ba', eval_subset_num_batches=hyper.eval_batches)
    training = [item for item in row.overrides if item.split('.')[0] in ('optimizer', 'scheduler', 'algorithms')]
    path = os.path.join(folder, 'run.yaml')
    OmegaConf.save(OmegaConf.merge(raw, OmegaConf.from_dotlist(training)), path)
    return path


def torchtitan_row(row: Row, hyper: Hyper, seed: int, data: dict) -> Row:
    """The torchtitan row with ``hyper`` and ``seed`` in its environment (``.anchors/run.sh``'s LR, WARMUP, SEED,
    DATA_JSON, and a time limit of 2 s a step; STEPS is set by the runner; with ``hyper.eval_every``, the held-out
    documents ``benchmark.run_torchtitan`` validates on)."""
    env = [f'LR={hyper.lr}', f'WARMUP={hyper.warmup}', f'SEED={seed}', f"DATA_JSON={data['corpus']}/all.jsonl",
           f'TT_TIMEOUT={120 + 2 * hyper.steps}']
    if hyper.eval_every:
        env += [f"HELD_OUT={data['held_out_corpus']}", f'EVAL_EVERY={hyper.eval_every}',
                f'EVAL_BATCHES={hyper.eval_batches}']
    return Row(row.name, row.source, [*row.overrides, *env], row.model)


def write_shared_init(yaml: str, seed: int, out: str, overrides: list[str] = ()) -> None:
    """Seed ``seed``'s fresh weights of ``yaml``'s model (its ``init_scheme``) as an fp32 HF folder that every row of
    that seed starts from: ours and hf rows through ``model.init_from``, torchtitan through its own HF loader. The
    draw itself then drops out of a comparison (each row's own draws ended 3-4 % apart at the 1B's step 500); the
    rows still part where bf16 roundings decide the fast-learning phase (docs/learning.md)."""
    run = prepare(yaml, overrides)
    torch.manual_seed(seed)
    module = run.config.model.family_entry().module(run.architecture, run.kernels)
    module.init_weights()
    save_hf({name: tensor.detach() for name, tensor in module.named_parameters()}, run.architecture, out,
            torch.float32)


def starting_from(row: Row, weights: str) -> Row:
    """``row`` loading ``weights`` (an HF folder) instead of drawing its own initialisation."""
    setting = f'INIT_HF={weights}' if row.model == 'torchtitan' else f'model.init_from={weights}'
    return Row(row.name, row.source, [*row.overrides, setting], row.model)


def window_means(losses: list[float], width: int) -> list[float]:
    """The mean loss of steps 1-width, width+1-2 width, ... (a last, partial window is left out)."""
    return [statistics.fmean(losses[start:start + width]) for start in range(0, len(losses) - width + 1, width)]


def summarize(results: list[dict], width: int) -> dict:
    """Per row name: each seed's window means, their mean over seeds, the smallest and largest."""
    by_name = {}
    for result in results:
        if 'error' not in result:
            by_name.setdefault(result['name'], []).append(window_means(result['losses'], width))
    summary = {}
    for name, seeds in by_name.items():
        windows = list(zip(*seeds))
        summary[name] = {'seeds': len(seeds), 'mean': [statistics.fmean(w) for w in windows],
                         'low': [min(w) for w in windows], 'high': [max(w) for w in windows]}
    return summary


def verdict(summary: dict, ours: str, theirs: str, width: int, from_step: int, tolerance: float) -> dict:
    """Whether ``ours``' mean over seeds is within ``tolerance`` (relative) of ``theirs`` in every window from
    ``from_step`` on, and at most theirs in the last window."""
    mine, reference = summary[ours]['mean'], summary[theirs]['mean']
    windows = range(from_step // width, min(len(mine), len(reference)))
    failing = [(index + 1) * width for index in windows if mine[index] > reference[index] * (1 + tolerance)]
    last = len(mine) - 1
    return {'ours': ours, 'theirs': theirs, 'windows_over': failing, 'final_ours': mine[last],
            'final_theirs': reference[last], 'holds': not failing and mine[last] <= reference[last]}


def format_windows(summary: dict, width: int) -> str:
    """One line per window: each row's mean over seeds and, with several seeds, their range."""
    names = list(summary)
    lines = ['steps      ' + ''.join(f'{name:>22}' for name in names)]
    for index in range(max((len(entry['mean']) for entry in summary.values()), default=0)):  # none: every row failed
        cells = []
        for name in names:
            entry = summary[name]
            if index >= len(entry['mean']):
                cells.append(f"{'-':>22}")
                continue
            spread = f" ({entry['low'][index]:.3f}-{entry['high'][index]:.3f})" if entry['seeds'] > 1 else ''
            cells.append(f"{entry['mean'][index]:.3f}{spread}".rjust(22))
        lines.append(f'{index * width + 1:>4}-{(index + 1) * width:<6}' + ''.join(cells))
    return '\n'.join(lines)


BENCHMARK_SCRIPT = os.path.join(REPO, 'scripts', 'measure_speed.py')  # its --worker mode trains an ours or hf row


@dataclass
class Plan:
    """What one benchmark run trains: the rows, each on ``seeds`` (``single_seed`` rows on the first only)."""
    rows: list[Row]
    seeds: list[int]
    single_seed: tuple = ()
    hyper: Hyper = Hyper()
    width: int = 50
    gpus: int = 1
    shared_init: Row | None = None  # the row whose model draws each seed's weights for every row to start from
    stop_by: float | None = None  # seconds after ``started``: a row the longest so far would carry past is not begun
    transformers_check: str | None = None  # an ours row whose first seed's export transformers scores again
    started: float = field(default_factory=time.monotonic)

    def runs(self) -> list[tuple[int, Row]]:
        """(seed, row) in the order they train: seed by seed, so a run cut short has every row's first seeds."""
        return [(seed, row) for index, seed in enumerate(self.seeds) for row in self.rows
                if index == 0 or row.name not in self.single_seed]


def prepare_data(work: str, roots: list[str], corpus_megabytes: float, seq_len: int,
                 tokenizer_source: str = TORCHTITAN_TOKENIZER, suffix: str = '.py',
                 held_out_megabytes: float = 0.0, ranks: int = 1) -> dict:
    """The corpus, the tokenizer and our MDS shards of it (windows of ``seq_len`` + 1 tokens, torchtitan's samples,
    in the order its ``ranks`` GPUs read them: ``convert_in_torchtitans_order``) under ``work``, and
    ``held_out_megabytes`` of the pieces the corpus left out (documents never trained on) the same way; returns
    where they are and their sizes. A ``work`` folder that holds them for the same request already is used as it
    is."""
    window = seq_len + 1
    if not os.path.isfile(tokenizer_source):
        raise FileNotFoundError(f'{tokenizer_source}: no tokenizer; run bash ../shared/anchors/prepare.sh first')
    made = os.path.join(work, 'data.json')
    asked = {'roots': roots, 'suffix': suffix, 'requested_megabytes': corpus_megabytes, 'window': window,
             'requested_held_out_megabytes': held_out_megabytes, 'torchtitan_ranks': ranks}
    if os.path.isfile(made):
        with open(made) as file:
            data = json.load(file)
        if {key: data.get(key) for key in asked} == asked:
            return data
    corpus = write_corpus(roots, os.path.join(work, 'corpus'), corpus_megabytes, suffix=suffix)
    tokenizer = write_tokenizer(os.path.join(work, 'tokenizer'), tokenizer_source)
    converted = convert_in_torchtitans_order(os.path.join(work, 'corpus'), tokenizer, window,
                                             os.path.join(work, 'mds'), ranks)
    data = {'corpus': os.path.join(work, 'corpus'), 'tokenizer': tokenizer, 'mds': os.path.join(work, 'mds', 'train'),
            'documents': corpus['documents'], 'megabytes': corpus['megabytes'], 'tokens': converted['tokens'],
            **asked}
    if held_out_megabytes:
        data.update(held_out(work, roots, suffix, corpus['documents'], held_out_megabytes, tokenizer, window, ranks))
    write_atomically(made, json.dumps(data))
    return data


def held_out(work: str, roots: list[str], suffix: str, documents: int, megabytes: float, tokenizer: str,
             window: int, ranks: int = 1) -> dict:
    """The first ``megabytes`` of the pieces a corpus of ``documents`` left out, as JSON lines (torchtitan's
    validation reads them) and our MDS windows of them (in the order its ``ranks`` GPUs read them)."""
    pieces = held_out_pieces(roots, documents, suffix=suffix)
    if not pieces:
        raise ValueError(f'the corpus took every piece of {roots}: none is left out to evaluate on; lower --corpus-mb')
    folder = os.path.join(work, 'held-out')
    count, size = write_pieces(pieces, folder, megabytes)
    converted = convert_in_torchtitans_order(folder, tokenizer, window, os.path.join(work, 'held-out-mds'), ranks)
    return {'held_out_corpus': folder, 'held_out_mds': os.path.join(work, 'held-out-mds', 'train'),
            'held_out_documents': count, 'held_out_megabytes': size / 1e6, 'held_out_tokens': converted['tokens']}


def train_row(plan: Plan, row: Row, seed: int, data: dict, folder: str, work: str) -> dict:
    """One row on one seed, in its own processes (``benchmark.run_row``): its per-step losses and tokens/s."""
    warmup = min(5, plan.hyper.steps - 1)
    write_yaml = lambda row, folder: our_run_yaml(row, folder, data, plan.hyper, seed)
    drawing = 0.0
    if plan.shared_init:
        weights = os.path.join(work, f'init-{plan.shared_init.name}-seed{seed}')
        if not os.path.isdir(weights):  # drawn once a seed and model, by the first of its rows
            begun = time.monotonic()
            os.makedirs(f'{weights}-run', exist_ok=True)
            write_shared_init(write_yaml(plan.shared_init, f'{weights}-run'), seed, weights)
            drawing = time.monotonic() - begun
        row = starting_from(row, weights)
    if row.model == 'torchtitan':
        row = torchtitan_row(row, plan.hyper, seed, data)
    checked = (row.name, seed) == (plan.transformers_check, plan.seeds[0])
    export = os.path.join(folder, 'export') if checked else None
    result = run_row(BENCHMARK_SCRIPT, row, plan.gpus, warmup, plan.hyper.steps - warmup, folder, write_yaml, export)
    return {**result, 'seed': seed, 'steps': plan.hyper.steps, **({'export': export} if checked else {}),
            'shared_init': plan.shared_init and str(plan.shared_init), 'drawing_seconds': drawing}


def transformers_check(results: list[dict]) -> dict | None:
    """transformers' model on the checked row's export (its first seed's trained weights) scores the held-out
    batches our evaluator read at the end: both losses and their relative difference; None where that row did not
    run or evaluate."""
    result = next((result for result in results if result.get('export') and result.get('held_out')), None)
    if result is None:
        return None
    step, ours = result['held_out'][-1]
    theirs = transformers_held_out_loss(result['export'], 'cuda' if torch.cuda.is_available() else 'cpu')
    return {'row': result['name'], 'step': step, 'ours': ours, 'transformers': theirs,
            'relative': (theirs - ours) / ours}


def format_check(check: dict) -> str:
    return (f"transformers' model (fp32) on {check['row']}'s export at step {check['step']}: held-out "
            f"{check['transformers']:.4f}, our evaluator {check['ours']:.4f} ({check['relative']:+.3%})")


def run(plan: Plan, data: dict, work: str, versus: list[str], json_path: str | None,
        quality: str | None = None) -> dict:
    """Train every (seed, row), then print the window table, each ``OURS:THEIRS`` verdict and, with held-out
    evaluations and ``quality`` ('REFERENCE:TARGET'), the time-to-quality table; the JSON is rewritten after every
    row, so a run cut short keeps what finished. With ``plan.stop_by`` (a device call's limit), a row that would end
    after it, were it as long as the longest so far, is not begun: a row cut by the call's limit is device time
    lost: the longest row counts without the drawing of its shared weights, which a later row of the same weights
    skips."""
    results, longest = [], 0.0
    for seed, row in plan.runs():
        left = plan.stop_by - (time.monotonic() - plan.started) if plan.stop_by else None
        if results and left is not None and longest > left:
            print(f'=== {row.name} seed {seed}: not begun: the longest row so far took {longest:.0f} s, {left:.0f} s '
                  f'are left of --stop-by {plan.stop_by:g}', flush=True)
            continue
        folder = os.path.join(work, 'rows', f'{row.name}-seed{seed}')
        shutil.rmtree(folder, ignore_errors=True)
        begun = time.monotonic()
        result = train_row(plan, row, seed, data, folder, work)
        seconds, drawing = time.monotonic() - begun, result.get('drawing_seconds', 0.0)
        longest = max(longest, seconds - drawing)
        results.append(result)
        last = statistics.fmean(result['losses'][-plan.width:]) if 'losses' in result else None
        print(f'=== {row.name} seed {seed}: ' + (f"last {plan.width} steps {last:.4f}, "
              f"{result['tokens_per_second_per_gpu']:,.0f} tokens/s/GPU" if last else result.get('error', ''))
              + f', {seconds:.0f} s' + (f' (its shared weights drawn in {drawing:.0f} s)' if drawing else ''),
              flush=True)
        report = build_report(plan.hyper, plan.width, data, results, versus, quality)
        if json_path:
            write_report(report, json_path)
    check = transformers_check(results)
    if check:
        report['transformers_check'] = [check]
        if json_path:
            write_report(report, json_path)
    print_report(report)
    return report


def write_report(report: dict, path: str) -> None:
    with open(path, 'w') as file:
        json.dump(report, file, indent=1)


class UnusableRuns(ValueError):
    """Saved runs that cannot be weighed together: another hyper-parameter, window or corpus, no held-out
    evaluations, or a timed row without a speed."""


# what tells two corpora apart, each with its value in a report that predates it
CORPUS_KEYS = {'documents': None, 'tokens': None, 'held_out_documents': None, 'held_out_tokens': None,
               'torchtitan_ranks': 1}


def corpus_of(report: dict) -> dict:
    """The sizes of a report's corpus and held-out documents, and the GPUs whose order they were written in: runs
    compared at equal tokens must share them."""
    return {key: report['data'].get(key, absent) for key, absent in CORPUS_KEYS.items()}


def merge_reports(paths: list[str], versus: list[str], renames: list[str] = (),
                  quality: str | None = None) -> dict:
    """One report from the rows of several saved ones (runs split over machines or calls), which must share their
    hyper-parameters and window but for the steps: a row of a schedule other than the first file's is named
    NAME@STEPS (a run as long as a speed-up's time allows: docs/learning.md). ``renames`` ('OLD=NEW', or
    'FILE:OLD=NEW' for one file's rows, FILE as given in ``paths``) joins rows that ran the same settings under
    another name (a row whose settings became the default)."""
    return merge_loaded({path: read_report(path) for path in paths}, versus, renames, quality)


def read_report(path: str) -> dict:
    with open(path) as file:
        return json.load(file)


def merge_loaded(by_path: dict[str, dict], versus: list[str], renames: list[str] = (),
                 quality: str | None = None) -> dict:
    """``merge_reports`` of reports already read (path -> report, the first path's schedule the merge's)."""
    paths, reports = list(by_path), list(by_path.values())
    first = reports[0]
    for path, report in zip(paths, reports):
        if ({**report['hyper'], 'steps': 0}, report['width']) != ({**first['hyper'], 'steps': 0}, first['width']):
            raise UnusableRuns(f"{path}: trained with {report['hyper']}, window {report['width']}; {paths[0]}: "
                               f"{first['hyper']}, window {first['width']}")
        if corpus_of(report) != corpus_of(first):
            raise UnusableRuns(f'{path}: trained and evaluated on {corpus_of(report)}; {paths[0]}: '
                               f"{corpus_of(first)} (another corpus: the Python one is the machine's installed "
                               "packages; or the same in torchtitan's order on another number of GPUs)")
    rows = [{**row, 'steps': report['hyper']['steps'], 'name': scheduled(renamed(row['name'], path, renames),
                                                                          report['hyper']['steps'], first)}
            for path, report in zip(paths, reports) for row in report['rows']]
    merged = build_report(Hyper(**{**first['hyper'], 'betas': tuple(first['hyper']['betas'])}), first['width'],
                          first['data'], rows, versus, quality)
    checks = [check for report in reports for check in report.get('transformers_check', [])]
    return merged | ({'transformers_check': checks} if checks else {})


def scheduled(name: str, steps: int, first: dict) -> str:
    """A row's name in a merged report: NAME@STEPS where its schedule is not the first report's (a row of a merged
    report keeps its name)."""
    return name if steps == first['hyper']['steps'] or name.endswith(f'@{steps}') else f'{name}@{steps}'


def renamed(name: str, path: str, renames: list[str]) -> str:
    """``name`` after the first of ``renames`` ('OLD=NEW' or 'FILE:OLD=NEW') that applies to it in ``path``."""
    for rename in renames:
        scope, _, pair = rename.rpartition(':')
        old, new = pair.split('=', 1)
        if old == name and scope in ('', path):
            return new
    return name


def print_report(report: dict) -> None:
    """The window table and each verdict."""
    print(format_windows(report['summary'], report['width']))
    for compared in report['verdicts']:
        over = compared['windows_over']
        print(f"{compared['ours']} vs {compared['theirs']}: {'holds' if compared['holds'] else 'does not hold'} "
              f"(windows from step {FROM_STEP} over theirs + {TOLERANCE:.0%}: {over or 'none'}; last window "
              f"{compared['final_ours']:.4f} vs {compared['final_theirs']:.4f})")
    if 'time_to_quality' in report:
        print(format_quality(report['time_to_quality'], *report['quality'].split(':')))
    for check in report.get('transformers_check', []):
        print(format_check(check))


FROM_STEP, TOLERANCE = 100, 0.01  # the verdict: every window from step 100 on within 1 % of theirs


QUALITY_TOLERANCE = 0.005  # a recipe holds when its final held-out loss is at most 0.5 % over the reference's
SOONER = 1.15  # the speed-up to the target a default must show (issue 66): the table's steps in that time


def build_report(hyper: Hyper, width: int, data: dict, results: list[dict], versus: list[str],
                 quality: str | None = None) -> dict:
    summary = summarize(results, width)
    verdicts = [verdict(summary, *pair.split(':'), width, FROM_STEP, TOLERANCE) for pair in versus
                if all(name in summary for name in pair.split(':'))]
    report = {'hyper': vars(hyper) | {'betas': list(hyper.betas)}, 'width': width, 'data': data,
              'rows': results, 'summary': summary, 'verdicts': verdicts}
    curves = held_out_curves(results)
    if curves:
        report['held_out'] = {name: [point._asdict() for point in curve.held_out] for name, curve in curves.items()}
    if quality and all(name in curves for name in quality.split(':')):
        report['quality'] = quality
        report['time_to_quality'] = compare(list(curves.values()), *quality.split(':'), QUALITY_TOLERANCE, SOONER)
    return report


def held_out_curves(results: list[dict]) -> dict[str, Curve]:
    """Per row name with held-out evaluations: their mean over seeds, the row's tokens/s (every GPU's, the mean
    over seeds), its schedule's steps (its last evaluation's, in reports saved before rows recorded them) and its
    runs."""
    by_name = {}
    for result in results:
        if result.get('held_out'):
            by_name.setdefault(result['name'], []).append(result)
    return {name: Curve(name, over_seeds([evaluations(row) for row in rows]), rows[0]['tokens_per_step'],
                        statistics.fmean(row['tokens_per_second_per_gpu'] * row['gpus'] for row in rows),
                        rows[0].get('steps', rows[0]['held_out'][-1][0]), len(rows), by_seed(rows))
            for name, rows in by_name.items()}


def evaluations(row: dict) -> list[Evaluation]:
    return [Evaluation(*point) for point in row['held_out']]


def by_seed(rows: list[dict]) -> Optional[dict[int, list[Evaluation]]]:
    """One row name's runs' evaluations by seed; None where a run does not name its seed or two name the same."""
    seeds = [row.get('seed') for row in rows]
    if None in seeds or len(set(seeds)) < len(seeds):
        return None
    return {seed: evaluations(row) for seed, row in zip(seeds, rows)}


def in_one_line(command):
    """``command`` (a --report or --decide) with runs that cannot be weighed together told in one line, exit 2."""
    @functools.wraps(command)
    def wrapped(args) -> int:
        try:
            return command(args)
        except UnusableRuns as error:
            print(f'error: {error}', file=sys.stderr)
            return 2
    return wrapped


@in_one_line
def report_command(args) -> int:
    """``scripts/measure_learning.py --report``: the saved runs merged, printed and written; 1 if a verdict fails."""
    report = merge_reports(args.report, args.versus, args.rename, args.quality)
    print_report(report)
    if args.json:
        write_report(report, args.json)
    return 0 if all(checked['holds'] for checked in report['verdicts']) else 1


@in_one_line
def decide_command(args) -> int:
    """``scripts/measure_learning.py --decide``: the default precision by issue 66's rule over the grid's saved runs
    (any number of calls' JSON files, each cell's merged by its corpus and learning rate), timed at the tokens/s of
    ``--speeds`` where given; 1 while the grid is incomplete."""
    by_cell = {}
    for path in args.decide:
        report = read_report(path)
        if not report.get('held_out'):
            raise UnusableRuns(f"{path} has no held-out evaluations: the grid's runs are made with --eval-every "
                               '(gpu.sh grid)')
        by_cell.setdefault(cell_name(report), {})[path] = report
    cells = {cell: held_out_curves(distinct(merge_loaded(in_schedule_order(reports), [])['rows']))
             for cell, reports in by_cell.items()}
    if args.speeds:
        cells = at_speeds(cells, args.speeds)
    decision = decide(cells, tolerance=QUALITY_TOLERANCE, speedup=SOONER)
    print(format_decision(decision))
    if args.speeds:
        print(f"tokens/s: {', '.join(args.speeds)} (each row's mean over these calls), not the grid's own runs")
    if args.json:
        write_report(decision | {'speeds': args.speeds}, args.json)
    return 0 if decision['decision'] else 1


def at_speeds(cells: dict[str, dict[str, Curve]], paths: list[str]) -> dict[str, dict[str, Curve]]:
    """Each cell's curves at the tokens/s of ``paths`` (scripts/measure_speed.py's JSON; NAME@STEPS at NAME's), which
    must hold every row the decision times: torchtitan's and each recipe's tied row that the cells ran."""
    speeds = row_speeds(paths)
    timed = {name for curves in cells.values() for name in curves} & {TARGET, *(recipe.tied for recipe in RECIPES)}
    if timed - set(speeds):
        raise UnusableRuns(f"{', '.join(paths)}: no tokens/s of {', '.join(sorted(timed - set(speeds)))}: run them "
                           'in the speed call too (gpu.sh grid-speed)')
    return {cell: {name: curve._replace(tokens_per_second=speeds.get(row_of(name), curve.tokens_per_second))
                   for name, curve in curves.items()} for cell, curves in cells.items()}


def row_speeds(paths: list[str]) -> dict[str, float]:
    """Each row's tokens/s (every GPU's) in scripts/measure_speed.py's JSON files, the mean over the files that ran
    it: the speeds a decision weighs when the grid's rows ran on several machines, taken on one in one call."""
    by_name = {}
    for path in paths:
        with open(path) as file:
            for row in json.load(file)['rows']:
                if 'tokens_per_second_per_gpu' in row:
                    by_name.setdefault(row['name'], []).append(row['tokens_per_second_per_gpu'] * row['gpus'])
    return {name: statistics.fmean(values) for name, values in by_name.items()}


def in_schedule_order(by_path: dict[str, dict]) -> dict[str, dict]:
    """A cell's reports (path -> report) with one of its most common schedule first: the merge names the other
    schedules' rows NAME@STEPS."""
    common = statistics.mode(report['hyper']['steps'] for report in by_path.values())
    return dict(sorted(by_path.items(), key=lambda item: item[1]['hyper']['steps'] != common))


def distinct(rows: list[dict]) -> list[dict]:
    """The rows less repeats (a run given twice: in a merged report and in its own file, counts once)."""
    seen = {}
    for row in rows:
        seen.setdefault(json.dumps(row, sort_keys=True), row)
    return list(seen.values())


def train_command(args) -> int:
    """``scripts/measure_learning.py --row ...``: the corpus, then every row on every seed; 1 if a verdict fails."""
    plan = Plan([Row.parse(text) for text in args.row], args.seeds, tuple(args.single_seed),
                Hyper(steps=args.steps, lr=args.lr, warmup=args.warmup, eval_every=args.eval_every,
                      eval_batches=args.eval_batches), args.window, args.gpus,
                args.shared_init and Row.parse(args.shared_init), args.stop_by, args.transformers_check)
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work or scratch
        begun = time.monotonic()
        data = prepare_data(work, args.roots, args.corpus_mb, args.seq_len, suffix=args.suffix,
                            held_out_megabytes=args.held_out_mb if args.eval_every else 0.0,
                            ranks=args.torchtitan_ranks)
        print(f"corpus: {data['documents']:,} documents, {data['megabytes']:.1f} MB, {data['tokens']:,} tokens "
              f"({time.monotonic() - begun:.0f} s)", flush=True)
        report = run(plan, data, work, args.versus, args.json, args.quality)
    return 0 if all(checked['holds'] for checked in report['verdicts']) else 1
