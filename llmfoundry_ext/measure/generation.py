"""Generation's cost (``scripts/measure_generation.py``): ours (``HarnessModel.generate_until``: greedy, a KV cache,
contexts batched by length) beside lm-evaluation-harness's HF backend (``HFLM``, transformers' ``generate``) on the
same weights and the same requests: a local GSM8K-like task, few-shot, scored by the harness (exact_match after its
regex filter). Both run through the same ``run_tasks`` (the harness's ``evaluate``), timed from its start to its
end after a warm-up of a few questions; neither includes loading the model.

The weights are the 1B's architecture (``PRESETS['1b']``) with torchtitan's test tokenizer's 2,004 ids, drawn fresh
from seed 1: untrained, so answers rarely meet a stop string and most run to ``max_gen_toks`` (the most work a question
can cost), and exact_match is near 0; what is compared is the time and the generated text."""
import dataclasses
import json
import os
import random
import time

import torch

from llmfoundry_ext.measure.learning import BOS, EOS, TORCHTITAN_TOKENIZER, write_tokenizer
from llmfoundry_ext.downstream import HarnessModel, load_tasks, metrics_of, model_from_weights, run_tasks
from llmfoundry_ext.model.llama import PRESETS, Transformer
from llmfoundry_ext.weights import save_hf

TASK = 'sums_word_problems'
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["Question:", "\\n\\n"]
  max_gen_toks: {max_new}
  do_sample: false
filter_list:
  - name: number
    filter:
      - function: regex
        regex_pattern: "#### (-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    regexes_to_ignore: ["(?s).*#### "]
"""
NAMES = ['Ada', 'Ben', 'Chen', 'Dana', 'Eli', 'Fatima', 'Gus', 'Hana']
THINGS = ['apples', 'books', 'coins', 'marbles', 'stamps', 'pencils']


def write_task(folder: str, questions: int, max_new: int) -> str:
    """``questions`` two-step word problems in GSM8K's form (a question; the working, then ``#### <number>``; the
    number after ``####`` is scored, as GSM8K's task does) as a harness task YAML over local JSON; returns the
    folder."""
    generator = random.Random(0)
    rows = []
    for _ in range(questions):
        name, thing = generator.choice(NAMES), generator.choice(THINGS)
        a, b, c = generator.randint(2, 90), generator.randint(2, 90), generator.randint(2, 9)
        rows.append({'question': f'{name} has {a} {thing}, buys {b} more, then gives away {c}. How many {thing} '
                                 f'does {name} have now?', 'answer': f'{name} has {a} + {b} - {c} = {a + b - c}. '
                                                                     f'#### {a + b - c}'})
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, f'{TASK}.jsonl')
    with open(data, 'w') as file:
        file.writelines(json.dumps(row) + '\n' for row in rows)
    with open(os.path.join(folder, f'{TASK}.yaml'), 'w') as file:
        file.write(TASK_YAML.format(task=TASK, data=data, max_new=max_new))
    return folder


def write_weights(folder: str, preset: str) -> str:
    """``preset``'s architecture over torchtitan's test tokenizer, seed 1's fresh weights, as an HF folder (fp32)
    with that tokenizer; returns the folder."""
    tokenizer = write_tokenizer(os.path.join(folder, 'tokenizer'), TORCHTITAN_TOKENIZER)
    with open(os.path.join(tokenizer, 'tokenizer_config.json'), 'w') as file:
        json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': BOS, 'eos_token': EOS}, file)
    from transformers import AutoTokenizer
    config = dataclasses.replace(PRESETS[preset], vocab_size=len(AutoTokenizer.from_pretrained(tokenizer)))
    torch.manual_seed(1)
    model = Transformer(config)
    model.init_weights()
    save_hf(model.state_dict(), config, os.path.join(folder, 'hf'), torch.float32, tokenizer)
    return os.path.join(folder, 'hf')


def timed(model, tasks: dict, shots: int, warm_up: int, limit: int | None) -> tuple[float, dict]:
    """(seconds, results) of the harness's evaluation of ``tasks`` with ``model`` (its first ``limit`` questions;
    None: all), after one of ``warm_up`` questions. Both end with the texts on the host: nothing is left queued."""
    run_tasks(model, tasks, warm_up, shots)
    started = time.perf_counter()
    results = run_tasks(model, tasks, limit, shots)
    return time.perf_counter() - started, results


def ours(args, weights: str, tasks: dict, dtype: str, rows: int) -> dict:
    """Ours as scripts/evaluate.py runs it: the weights in ``dtype``, ``rows`` contexts generated together."""
    model, tokenizer, max_length = model_from_weights(weights)
    harness = HarnessModel(model.to(args.device, getattr(torch, dtype)), tokenizer, max_length, args.batch_tokens,
                           args.device, None, rows)
    seconds, results = timed(harness, tasks, args.shots, args.warm_up, args.limit)
    return row(f'ours, {rows} rows', dtype, seconds, results)


def hf(args, weights: str, tasks: dict, dtype: str, batch_size: int) -> dict:
    from lm_eval.models.huggingface import HFLM
    model = HFLM(pretrained=weights, dtype=dtype, batch_size=batch_size, device=args.device)
    seconds, results = timed(model, tasks, args.shots, args.warm_up, args.limit)
    return row(f'hf, batch_size {batch_size}', dtype, seconds, results)


def row(name: str, dtype: str, seconds: float, results: dict) -> dict:
    samples = sorted(results['samples'][TASK], key=lambda sample: sample['doc_id'])
    return {'row': name, 'dtype': dtype, 'seconds': seconds, 'metrics': metrics_of(results),
            'generations': [sample['resps'][0][0] for sample in samples]}


def differing(a: dict, b: dict) -> int:
    """How many questions' generated texts differ between two rows."""
    return sum(x != y for x, y in zip(a['generations'], b['generations'], strict=True))


def run(args) -> dict:
    """Every row of ``args`` (the script's), the report printed and returned."""
    folder = write_task(os.path.join(args.work, 'task'), args.questions, args.max_gen_toks)
    weights = write_weights(args.work, args.preset)
    tasks, _ = load_tasks([TASK], [folder])
    rows = []
    for dtype in args.dtypes:
        for generation_rows in args.generation_rows:
            rows.append(ours(args, weights, tasks, dtype, generation_rows))
            print_row(rows[-1])
        for batch_size in args.hf_batch_sizes:
            rows.append(hf(args, weights, tasks, dtype, batch_size))
            print_row(rows[-1])
    device = torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device
    report = {'device': device, 'torch': torch.__version__, 'preset': args.preset,
              'questions': args.limit or args.questions, 'shots': args.shots, 'max_gen_toks': args.max_gen_toks,
              'rows': rows}
    print_summary(report)
    return report


def print_row(this: dict) -> None:
    print(f"{this['row']:<28}{this['dtype']:>10}{this['seconds']:>10.2f} s"
          f"  exact_match {this['metrics'][f'metrics/downstream/{TASK}/exact_match']:.4f}", flush=True)


def print_summary(report: dict) -> None:
    """Each HF row beside ours of the same dtype: how much faster ours is, and how many generations differ."""
    print(f"\n{report['device']}, torch {report['torch']}: {report['questions']} questions, {report['shots']}-shot, "
          f"max_gen_toks {report['max_gen_toks']}")
    print(f"{'row':<28}{'dtype':>10}{'seconds':>10}{'ours faster':>13}{'texts differing from ours':>28}")
    for this in report['rows']:
        line = f"{this['row']:<28}{this['dtype']:>10}{this['seconds']:>10.2f}"
        if this['row'].startswith('hf'):
            for mine in (other for other in report['rows'] if other['row'].startswith('ours')
                         and other['dtype'] == this['dtype']):
                print(f"{line}{this['seconds'] / mine['seconds']:>12.2f}x"
                      f"{differing(mine, this):>20} of {len(this['generations'])}  (vs {mine['row']})")
        else:
            print(line)
