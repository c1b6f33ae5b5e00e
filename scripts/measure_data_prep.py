"""Data-prep throughput end to end: ours, datatrove and an llm-foundry-style converter on the same files, the same
tokenizer and the same cores.

  python scripts/measure_data_prep.py [--megabytes 100 25] [--repeats 3] [--datatrove-path DIR] [--json out.json]

Input: Python source files under --corpus-root (default: this Python's site-packages), one document each, the first
--megabytes of them in path order, as 32 jsonl files; a 128k byte-level BPE (Llama 3's size) trained here on the
first 30 MB. Each row is a fresh process timed from start to exit (imports and start-up included), pinned to as many
cores as it has processes, one tokenizer thread per process (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM as each
tool leaves it), documents ending in EOS, no BOS, no shuffling:
- ours: ``data_prep/convert_to_mds.py --processes P`` (8,192-token windows, MDS, zstd);
- datatrove 0.10.1: ``LocalPipelineExecutor`` with P workers, ``JsonlReader`` -> ``DocumentTokenizer``
  (``shuffle_documents=False``), the field's pipeline (install it where it cannot clash with ours:
  ``pip install --target .bench-deps datatrove==0.10.1 loguru humanize orjson --no-deps``, then
  ``--datatrove-path .bench-deps``; without it its rows are left out, saying so);
- llm-foundry style: what llm-foundry's text-to-MDS conversion does, one process per group of files (a
  transformers tokenizer called per document, tokens concatenated with EOS, windows by MDSWriter), then
  streaming's ``merge_index``;
- HF tokenizers alone: ``encode_batch_fast`` over the texts already in memory, one core: the ceiling (its seconds
  are the encoding's alone).
Tokens per second per core is each row's own token count (EOS included) over its wall seconds and its cores.
"""
import argparse
import os
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data_prep.throughput import run, run_row  # noqa: E402


def main(argv: list[str]) -> int:
    if argv[:1] == ['--row']:  # one timed row, in its own process
        return run_row(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--megabytes', type=float, nargs='+', default=[100, 25])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--corpus-root', default=sysconfig.get_paths()['purelib'])
    parser.add_argument('--datatrove-path', help='a folder holding datatrove 0.10.1 (see above)')
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        parser.error('needs 2 cores (its rows run 1 and 2 processes)')
    return run(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
