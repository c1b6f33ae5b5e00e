"""Downstream evaluation's cost: ours in the training loop beside lm-evaluation-harness's HF backend on the same
weights (the checkpoint exported with to-hf), on a local HellaSwag-like task (pip install 'llmfoundry_ext[eval]').

  python scripts/bench_downstream.py --questions 1000 --batches 200 --interval 100 --json downstream.json \\
      [--hf-batch-sizes auto 64] [override ...]

The text, tokenizer and shards are the learning benchmark's (its --corpus-mb of Python source, torchtitan's test
tokenizer: bash ../shared/anchors/prepare.sh). The task is made of pieces of that source the corpus left out: two
lines of a file, and four candidates for the next line (the real one, a line of each of three other files), as a
harness task YAML (dataset_path: json). Ours trains yamls/llama1b.yaml with the learning benchmark's settings (and
the overrides given) for --batches batches, scoring the task every --interval batches in the loop, and saves its
last checkpoint; that checkpoint is exported with to-hf and the harness's own HF backend (``HFLM``, bf16) scores the
task at each --hf-batch-sizes. Prints each evaluation's seconds, the metrics, how far each question's log-likelihoods
differ, and what an evaluation adds to 1,000 batches of training.
"""
import argparse
import os
import random
import site
import statistics
import sys

from data_prep.demo_corpus import next_line_questions, write_choice_task, write_tokenizer_config
from llmfoundry_ext.bench.downstream import TASK, run
from llmfoundry_ext.bench.learning import prepare_data, source_pieces
from llmfoundry_ext.downstream import harness_tokenizer

MAX_CHARS = 400  # a question's context and longest choice (code has lines of data thousands long)


def write_task(work: str, data: dict, roots: list[str], questions: int) -> dict:
    """The task over the source pieces the corpus left out (``write_corpus`` keeps the first of the shuffled
    pieces), questions of at most ``MAX_CHARS`` whose every choice adds tokens to the context as the harness
    splits them (its HF backend asserts on an empty continuation); returns its YAML's path and its questions'
    lengths in tokens."""
    pieces = source_pieces(roots)
    random.Random(0).shuffle(pieces)  # write_corpus's order
    tokenizer = harness_tokenizer(data['tokenizer'])
    length = lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    candidates = next_line_questions(pieces[data['documents']:], 2 * questions, context_lines=2, ending_lines=1)
    made = [q for q in candidates if len(q['context']) + max(map(len, q['choices'])) <= MAX_CHARS
            and all(length(q['context'] + ' ' + choice) > length(q['context'].rstrip()) for choice in q['choices'])
            ][:questions]
    return {'yaml': write_choice_task(os.path.join(work, 'tasks'), TASK, made), 'questions': len(made),
            'context_tokens': statistics.fmean(length(q['context']) for q in made),
            'ending_tokens': statistics.fmean(length(choice) for q in made for choice in q['choices']),
            'longest_tokens': max(length(q['context']) + length(choice) for q in made for choice in q['choices'])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('overrides', nargs='*', help='key=value for the training YAML')
    parser.add_argument('--work', default='/tmp/bench_downstream')
    parser.add_argument('--questions', type=int, default=1000)
    parser.add_argument('--batches', type=int, default=200)
    parser.add_argument('--interval', type=int, default=100)
    parser.add_argument('--batch-tokens', type=int, default=16384, help="ours' tokens a forward")
    parser.add_argument('--hf-batch-sizes', nargs='+', default=['auto', '64'])
    parser.add_argument('--corpus-mb', type=float, default=8.0)
    parser.add_argument('--seq-len', type=int, default=8192)
    parser.add_argument('--roots', nargs='+', default=site.getsitepackages())
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--profile', help='write where ours out of the loop spends an evaluation to this file')
    parser.add_argument('--json')
    args = parser.parse_args(argv)
    data = prepare_data(args.work, args.roots, args.corpus_mb, args.seq_len)
    write_tokenizer_config(data['tokenizer'])
    task = write_task(args.work, data, args.roots, args.questions)
    print(f"task: {task['questions']} questions, context {task['context_tokens']:.1f} tokens, choices "
          f"{task['ending_tokens']:.1f} tokens (means), longest request {task['longest_tokens']}", flush=True)
    return run(args, data, task)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
