"""Data-prep throughput on one input: an llm-foundry-style converter against ours, 1 process and all cores.

  python scripts/bench_data_prep.py [--files 8] [--window 2048] [--json out.json]

Input: the demo corpus (Python's standard library as code and prose, generated arithmetic) as jsonl files,
and a 32k byte-level BPE trained on it. The baseline does what llm-foundry's text-to-MDS conversion does:
one process, the transformers tokenizer called on one document at a time, tokens concatenated with EOS and
cut into windows written by MDSWriter. Ours: data_prep.convert with 1 process, then with every core.
Ours runs three ways: 1 process x 1 thread (per-core speed), N processes x 1 thread (scaling in processes),
and 1 process x N tokenizer threads. Target: ours >= 2x the baseline on a 2-core machine, and near-linear in
processes.
"""
import argparse
import glob
import json
import os
import sys
import tempfile
import time

from streaming import MDSWriter

from data_prep.convert import Job, convert, usable_cores, worker_pool
from data_prep.demo_corpus import demo_corpus
from data_prep.packing import pack
from data_prep.sources import parse_source
from data_prep.train_tokenizer import EOS, train_bpe
from llmfoundry_ext.data.mds import COLUMNS


def read_texts(folder: str):
    for path in sorted(glob.glob(f'{folder}/*.jsonl')):
        with open(path) as file:
            yield from (json.loads(line)['text'] for line in file)


def baseline(folder: str, tokenizer_file: str, window: int, out: str) -> int:
    """llm-foundry style: per-document tokenizer call, concat, MDSWriter. Returns tokens written."""
    from transformers import PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    documents = (tokenizer(text, truncation=False, padding=False)['input_ids'] + [eos] for text in read_texts(folder))
    windows = 0
    with MDSWriter(out=out, columns=COLUMNS, compression='zstd') as writer:
        for window_tokens in pack(documents, window):
            writer.write({'tokens': window_tokens})
            windows += 1
    return windows * window


def ours(folder: str, tokenizer_file: str, window: int, out: str, processes: int, threads: int) -> int:
    manifest = convert(Job(parse_source(f'jsonl:{folder}/*.jsonl'), tokenizer_file, window, 0.0, out), processes,
                       EOS, None, progress=False, threads=threads)
    return manifest['train']['tokens']


def timed(function, *args) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = function(*args)
    return tokens, time.perf_counter() - start


def start_worker_server() -> float:
    """Seconds to start the converter's worker server (once per converting process; kept out of the rows)."""
    start = time.perf_counter()
    with worker_pool(1, 1) as pool:
        pool.submit(int).result()
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--files', type=int, default=8)
    parser.add_argument('--window', type=int, default=2048)
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as root:
        texts = [doc for docs in demo_corpus(files=1500, math_docs=1500).values() for doc in docs]
        tokenizer_file = f'{root}/tokenizer.json'
        train_bpe(texts, 32000).save(tokenizer_file)
        os.makedirs(f'{root}/in')
        for part in range(args.files):
            with open(f'{root}/in/part{part:02d}.jsonl', 'w') as file:
                file.writelines(json.dumps({'text': t}) + '\n' for t in texts[part::args.files])
        server_seconds = start_worker_server()
        rows = [('llm-foundry style, 1 process', *timed(baseline, f'{root}/in', tokenizer_file, args.window, f'{root}/base'))]
        for processes, threads in ((1, 1), (cores, 1), (1, cores)):
            name = f'ours, {processes} process{"es" * (processes > 1)} x {threads} thread{"s" * (threads > 1)}'
            rows.append((name, *timed(ours, f'{root}/in', tokenizer_file, args.window, f'{root}/{processes}x{threads}',
                                      processes, threads)))
    base_speed = rows[0][1] / rows[0][2]
    print(f"{'converter':<32}{'tokens':>12}{'seconds':>9}{'tokens/s':>12}{'x baseline':>11}   ({len(texts)} documents)")
    results = []
    for name, tokens, seconds in rows:
        print(f'{name:<32}{tokens:>12,}{seconds:>9.2f}{tokens / seconds:>12,.0f}{tokens / seconds / base_speed:>11.2f}')
        results.append({'converter': name, 'tokens': tokens, 'seconds': seconds, 'tokens_per_second': tokens / seconds})
    print(f'worker server start, once per conversion (not in the rows): {server_seconds:.2f} s')
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'cores': cores, 'window': args.window, 'worker_server_seconds': server_seconds,
                       'rows': results}, file, indent=2)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
