"""Data-prep throughput end to end (``scripts/measure_data_prep.py``: the rows are described there): ours,
datatrove and an llm-foundry-style converter on the same files, tokenizer and cores."""
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from data_prep.train_tokenizer import EOS, train_bpe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'measure_data_prep.py')  # each row runs it again, in a process of its own

INPUT_FILES = 32
VOCAB = 128_000
WINDOW = 8192
TOOLS = ('ours', 'datatrove', 'llm-foundry style')
ALONE = 'HF tokenizers alone'


def python_sources(root: str, megabytes: float) -> list[tuple[str, str]]:
    """(path, text) of the first ``megabytes`` of non-empty UTF-8 .py files under ``root``, in path order."""
    documents, size = [], 0
    for path in sorted(glob.glob(f'{root}/**/*.py', recursive=True)):
        try:
            with open(path, encoding='utf-8') as file:
                text = file.read()
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            documents.append((path, text))
            size += len(text.encode('utf-8'))
            if size >= megabytes * 2 ** 20:
                return documents
    raise SystemExit(f'{root}: only {size / 2 ** 20:.0f} MB of Python source; pass a larger --corpus-root')


def write_jsonl(documents: list[tuple[str, str]], folder: str) -> None:
    os.makedirs(folder)
    for part in range(INPUT_FILES):
        with open(f'{folder}/part{part:02d}.jsonl', 'w') as file:
            file.writelines(json.dumps({'id': i, 'text': t}) + '\n' for i, t in documents[part::INPUT_FILES])


def jsonl_texts(files: list[str]):
    """The documents' texts of ``write_jsonl``'s files, in order."""
    for path in files:
        with open(path) as file:
            yield from (json.loads(line)['text'] for line in file)


def ours(folder: str, tokenizer: str, out: str, processes: int) -> list[str]:
    return [sys.executable, f'{ROOT}/data_prep/convert_to_mds.py', '--source', f'jsonl:{folder}/*.jsonl',
            '--tokenizer', tokenizer, '--concat-tokens', str(WINDOW), '--bos-token', '', '--eos-token', EOS,
            '--out', out, '--processes', str(processes)]


def ours_tokens(out: str) -> int:
    with open(f'{out}/manifest.json') as file:
        manifest = json.load(file)
    return sum(manifest[s]['tokens'] + manifest[s]['tail_tokens_dropped'] for s in ('train', 'val'))


def run_datatrove(folder: str, tokenizer: str, out: str, processes: int) -> int:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    LocalPipelineExecutor(pipeline=[JsonlReader(folder, glob_pattern='*.jsonl'),
                                    DocumentTokenizer(out, tokenizer_name_or_path=tokenizer, eos_token=EOS,
                                                      shuffle_documents=False)],
                          tasks=INPUT_FILES, workers=processes, logging_dir=f'{out}-logs').run()
    return sum(int(open(f).read().split('\n')[1]) for f in glob.glob(f'{out}/*.ds.metadata'))  # [tokenizer, tokens]


def convert_group(files: list[str], tokenizer_file: str, out: str) -> int:
    """llm-foundry style, one process: a transformers tokenizer per document, concatenated, MDSWriter."""
    from streaming import MDSWriter
    from transformers import PreTrainedTokenizerFast

    from data_prep.packing import pack
    from llmfoundry_ext.data.mds import COLUMNS
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    documents = (tokenizer(text, truncation=False, padding=False)['input_ids'] + [eos] for text in jsonl_texts(files))
    tokens = 0
    with MDSWriter(out=out, columns=COLUMNS, compression='zstd') as writer:
        for window in pack(documents, WINDOW):
            writer.write({'tokens': window})
            tokens += WINDOW
    return tokens


def run_llmfoundry_style(folder: str, tokenizer: str, out: str, processes: int) -> int:
    from multiprocessing import Pool

    from streaming.base.util import merge_index
    files = sorted(glob.glob(f'{folder}/*.jsonl'))
    groups = [(files[g::processes], tokenizer, f'{out}/group-{g}') for g in range(processes)]
    with Pool(processes) as pool:
        tokens = sum(pool.starmap(convert_group, groups))
    merge_index(out, keep_local=True)
    return tokens


def timed_row(tool: str, folder: str, tokenizer: str, out: str, processes: int, datatrove: str | None) -> dict:
    """One row in a fresh process pinned to cores 0..processes-1; its tokens and wall seconds."""
    environment = {**{k: v for k, v in os.environ.items() if k != 'TOKENIZERS_PARALLELISM'},  # each tool's default
                   'RAYON_NUM_THREADS': '1', 'PYTHONPATH': os.pathsep.join(filter(None, [ROOT, datatrove]))}
    command = ours(folder, tokenizer, out, processes) if tool == 'ours' else \
        [sys.executable, SCRIPT, '--row', tool, folder, tokenizer, out, str(processes)]
    start = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, range(processes)))
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f'{tool} failed:\n{done.stderr[-3000:]}')
    if tool == 'ours':
        return {'tool': tool, 'processes': processes, 'tokens': ours_tokens(out), 'seconds': seconds}
    tokens, *inner = done.stdout.split('\n')[-2].split()  # the row's last line: tokens [seconds]
    return {'tool': tool, 'processes': processes, 'tokens': int(tokens),
            'seconds': float(inner[0]) if inner else seconds}


def tokenizer_alone(folder: str, tokenizer_file: str, out: str, processes: int) -> str:
    """HF tokenizers' encode_batch_fast over the texts already in memory, one thread: what no converter beats.
    Returns its tokens and seconds (the encoding alone)."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(tokenizer_file)
    texts = list(jsonl_texts(sorted(glob.glob(f'{folder}/*.jsonl'))))
    start, tokens = time.perf_counter(), 0
    for first in range(0, len(texts), 256):
        tokens += sum(len(e.ids) + 1 for e in tokenizer.encode_batch_fast(texts[first:first + 256],
                                                                           add_special_tokens=False))
    return f'{tokens} {time.perf_counter() - start}'


def bench(megabytes: float, corpus_root: str, repeats: int, datatrove: str | None, root: str) -> list[dict]:
    documents = python_sources(corpus_root, megabytes)
    folder, tokenizer = f'{root}/in-{megabytes:g}', f'{root}/tokenizer-{megabytes:g}.json'
    write_jsonl(documents, folder)
    train_bpe(texts_up_to(documents, 30), VOCAB).save(tokenizer)
    tools = [t for t in TOOLS if t != 'datatrove' or datatrove]
    runs = []
    for repeat in range(repeats):  # interleaved, so that a slow spell of the machine hits every tool
        for processes in (1, 2):
            for tool in tools:
                out = f'{root}/out-{megabytes:g}-{tool.replace(" ", "-")}-{processes}-{repeat}'
                runs.append(timed_row(tool, folder, tokenizer, out, processes, datatrove))
                print(f'  {megabytes:g} MB, {tool}, {processes} process(es), run {repeat + 1}: '
                      f'{runs[-1]["seconds"]:.1f} s', flush=True)
    runs.append(timed_row(ALONE, folder, tokenizer, f'{root}/unused', 1, None))
    return [{'megabytes': megabytes, **row} for row in summarise(runs)]


def texts_up_to(documents: list[tuple[str, str]], megabytes: float):
    size = 0
    for _, text in documents:
        yield text
        size += len(text)
        if size >= megabytes * 2 ** 20:
            return


def summarise(runs: list[dict]) -> list[dict]:
    """Per tool and process count: median, fastest and slowest seconds, and the median's tokens/s per core."""
    rows = []
    for key in dict.fromkeys((r['tool'], r['processes']) for r in runs):
        mine = [r for r in runs if (r['tool'], r['processes']) == key]
        seconds = [r['seconds'] for r in mine]
        median = statistics.median(seconds)
        rows.append({'tool': key[0], 'processes': key[1], 'tokens': mine[0]['tokens'], 'runs': len(mine),
                     'seconds_median': median, 'seconds_min': min(seconds), 'seconds_max': max(seconds),
                     'tokens_per_second_per_core': mine[0]['tokens'] / median / key[1]})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'MB':>4} {'converter':<22}{'procs':>6}{'tokens':>13}{'runs':>5}{'median s':>10}{'min-max s':>14}"
          f"{'tok/s/core':>12}{'x datatrove':>12}")
    for row in rows:
        datatrove = next((r for r in rows if (r['megabytes'], r['tool'], r['processes']) ==
                          (row['megabytes'], 'datatrove', row['processes'])), None)
        ratio = f"{row['tokens_per_second_per_core'] / datatrove['tokens_per_second_per_core']:.2f}" \
            if datatrove else '-'
        print(f"{row['megabytes']:>4g} {row['tool']:<22}{row['processes']:>6}{row['tokens']:>13,}{row['runs']:>5}"
              f"{row['seconds_median']:>10.1f}{row['seconds_min']:>7.1f}-{row['seconds_max']:<6.1f}"
              f"{row['tokens_per_second_per_core']:>12,.0f}{ratio:>12}")


def run_row(argv: list[str]) -> int:
    """``--row TOOL FOLDER TOKENIZER OUT PROCESSES``: one timed row, in its own process; its last line is its
    tokens [and seconds]."""
    tool, folder, tokenizer, out, processes = argv
    run = {'datatrove': run_datatrove, 'llm-foundry style': run_llmfoundry_style, ALONE: tokenizer_alone}[tool]
    print(run(folder, tokenizer, out, int(processes)))
    return 0


def run(args) -> int:
    """The rows at each of ``args.megabytes`` (the script's arguments), a table and optionally JSON."""
    if not args.datatrove_path:
        print('datatrove rows left out: no --datatrove-path (see --help)')
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for megabytes in args.megabytes:
            rows += bench(megabytes, args.corpus_root, args.repeats, args.datatrove_path, root)
    print_table(rows)
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'cores': len(os.sched_getaffinity(0)), 'vocabulary': VOCAB, 'rows': rows}, file, indent=2)
    return 0
