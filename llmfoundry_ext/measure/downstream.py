"""Downstream evaluation's cost (``scripts/measure_downstream.py``): ours trains on one GPU or more with the task
scored in the loop, its last checkpoint is exported with to-hf and lm-evaluation-harness's HF backend scores the same
task; each evaluation's seconds, the metrics and how far the two backends' log-likelihoods differ, and (``--against``)
how far each evaluation's metrics are from another run's (the same benchmark on another number of GPUs). Every run
starts from seed 1's fresh weights drawn on the CPU (the learning benchmark's shared start), so runs on 1 and 2 GPUs
train the same model: a fresh draw on meta depends on the shard layout (DTensor's RNG)."""
import json
import os
import re
import statistics
import subprocess
import sys
import time

from llmfoundry_ext.measure.benchmark import Row
from llmfoundry_ext.measure import REPO
from llmfoundry_ext.measure.learning import Hyper, our_run_yaml, write_shared_init
from llmfoundry_ext.downstream import HarnessModel, load_tasks, metrics_of, model_from_weights, run_tasks
from llmfoundry_ext.launch import LAUNCHER

TASK = 'hellaswag_like'
SEED = 1
GLOBAL_BATCH = 2  # torchtitan's 1B flavor at local batch 2, as the learning benchmark trains it (gpu.sh: L)
EVALUATION_LINE = re.compile(r'^downstream at batch (\d+) .*\(([\d.]+) s\)$', re.M)
BATCH_LINE = re.compile(r'^batch (\d+)/\d+ .*?([\d,]+) tokens/s/GPU', re.M)


def run(args, data: dict, task: dict) -> int:
    """Train with the task (``data_prep.demo_corpus.write_held_out_task``'s) in the loop, export, score with the
    harness's HF backend at each batch size, report; ``args``: the script's."""
    print(f"task: {task['questions']} questions, context {task['context_tokens']:.1f} tokens, choices "
          f"{task['ending_tokens']:.1f} tokens (means), longest request {task['longest_tokens']}", flush=True)
    folder = os.path.join(args.work, f'run-{args.gpus}gpu')
    os.makedirs(folder, exist_ok=True)
    yaml = run_yaml(args, data, task, folder)
    write_shared_init(yaml, SEED, os.path.join(folder, 'init'), ['model.init_from=null'])
    ours = train(yaml, os.path.join(folder, 'train.log'), args.gpus)
    results = {}
    for batch, _ in ours['evaluations']:
        with open(os.path.join(folder, 'checkpoints', 'downstream', f'ba{batch}.json')) as file:
            results[batch] = json.load(file)
    ours.update(metrics_by_batch={batch: metrics_of(result) for batch, result in results.items()},
                loglikelihoods=loglikelihoods(results[args.batches]))
    if args.hf_batch_sizes:
        export(os.path.join(folder, 'checkpoints'), os.path.join(args.work, 'export'))
    hf_runs = [hf_evaluate(os.path.join(args.work, 'export'), task, size, args.device) for size in args.hf_batch_sizes]
    if args.profile:
        profile_ours(os.path.join(folder, 'checkpoints'), task, args, args.profile)
    report = summarize(args, data, task, ours, hf_runs)
    if args.rescore:
        report['rescored'] = rescore(os.path.join(folder, 'checkpoints'), task, args, ours)
    print_report(report)
    if args.against:
        with open(args.against) as file:
            report['against'] = metric_differences(report, json.load(file))
        print_differences(report['against'])
    if args.json:
        with open(args.json, 'w') as file:
            json.dump(report, file, indent=1)
    return 0


def summarize(args, data: dict, task: dict, ours: dict, hf_runs: list[dict]) -> dict:
    """The report: each evaluation's seconds, the metrics, the differences, the speed-ups over the steady in-loop
    evaluation (the last: the first compiles the blocks for scoring) and its share of 1,000 batches."""
    import torch
    steady = ours['evaluations'][-1][1]
    batch_seconds = GLOBAL_BATCH * data['window'] / (ours['tokens_per_second'] * args.gpus)
    return {'device': torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu',
            'torch': torch.__version__, 'task': task, 'batches': args.batches, 'interval': args.interval,
            'gpus': args.gpus,
            'ours': {'evaluations': ours['evaluations'], 'metrics': ours['metrics_by_batch'][args.batches],
                     'metrics_by_batch': ours['metrics_by_batch'], 'batch_tokens': args.batch_tokens,
                     'tokens_per_second': ours['tokens_per_second'],
                     'share_of_1000_batches': steady / (steady + 1000 * batch_seconds)},
            'hf': [{key: run[key] for key in ('batch_size', 'seconds', 'metrics')}
                   | {'ours_speedup': run['seconds'] / steady,
                      'loglikelihood_differences': differences(ours['loglikelihoods'], run['loglikelihoods'])}
                   for run in hf_runs]}


def print_report(report: dict) -> None:
    ours = report['ours']
    print(f"{report['device']} x {report['gpus']}, torch {report['torch']}: {report['task']['questions']} questions")
    print(f"{'row':<22}{'seconds':>9}{'acc':>8}{'acc_norm':>10}{'ours faster':>13}{'|dLL| max/mean':>17}"
          f"{'picks differ':>14}")
    for batch, seconds in ours['evaluations']:
        print(f"{f'ours in-loop ba{batch}':<22}{seconds:>9.2f}" + (
            f"{metric(ours['metrics'], 'acc'):>8.4f}{metric(ours['metrics'], 'acc_norm'):>10.4f}"
            if batch == report['batches'] else ''))
    for run in report['hf']:
        print(scored_again_line('hf batch ' + run['batch_size'], run, f"{run['ours_speedup']:.2f}x"))
    if 'rescored' in report:
        print(scored_again_line('ours, 1 process', report['rescored']))
    print(f"an evaluation every 1,000 batches: {100 * ours['share_of_1000_batches']:.2f} % of the run "
          f"(training at {ours['tokens_per_second']:,.0f} tokens/s a GPU)")


def metric(metrics: dict, name: str) -> float:
    """The task's metric ``name`` (acc, acc_norm) from a run's logged metrics."""
    return metrics[f'metrics/downstream/{TASK}/{name}']


def scored_again_line(name: str, run: dict, faster: str = '') -> str:
    """A row of the weights scored again outside the loop (the HF backend's, or ours in one process): its seconds,
    metrics, how much faster ours is (where given) and its log-likelihoods' differences from the in-loop ones."""
    d = run['loglikelihood_differences']
    return (f"{name:<22}{run['seconds']:>9.2f}{metric(run['metrics'], 'acc'):>8.4f}"
            f"{metric(run['metrics'], 'acc_norm'):>10.4f}{faster:>13}"
            f"{d['max_abs']:>9.4f}/{d['mean_abs']:.4f}{d['questions_picked_differently']:>14}")


def metric_differences(report: dict, other: dict) -> dict:
    """Each in-loop evaluation's metrics beside ``other``'s (a report of this benchmark, e.g. on another number of
    GPUs): per batch and metric, (this, other); and the largest |this - other|. JSON keeps the batches as text."""
    ours, theirs = report['ours']['metrics_by_batch'], other['ours']['metrics_by_batch']
    pairs = {str(batch): {name: (value, theirs[str(batch)][name]) for name, value in metrics.items()}
             for batch, metrics in ours.items()}
    return {'gpus': (report['gpus'], other['gpus']), 'metrics': pairs,
            'max_abs': max(abs(a - b) for metrics in pairs.values() for a, b in metrics.values())}


def print_differences(against: dict) -> None:
    this, other = against['gpus']
    for batch, metrics in against['metrics'].items():
        print(f'batch {batch}: ' + ', '.join(f"{name.rsplit('/', 1)[-1]} {a:.4f} on {this} GPU(s), {b:.4f} on {other}"
                                            for name, (a, b) in metrics.items()))
    print(f"largest |difference|: {against['max_abs']:.4f}")


def run_yaml(args, data: dict, task: dict, folder: str) -> str:
    """The learning benchmark's run YAML, starting from ``<folder>/init``, with the task scored every ``--interval``
    batches and the last batch's checkpoint saved; returns its path."""
    from omegaconf import OmegaConf
    row = Row('ours', 'yamls/llama1b.yaml', [
        f'global_batch_size={GLOBAL_BATCH}', f'device_microbatch_size={GLOBAL_BATCH // args.gpus}',
        'model.tie_embeddings=false', 'model.rope_scaling_factor=8', f"model.init_from={os.path.join(folder, 'init')}",
        *args.overrides])
    path = our_run_yaml(row, folder, data, Hyper(steps=args.batches), seed=SEED)
    raw = OmegaConf.load(path)
    raw.checkpoint = {'save_folder': os.path.join(folder, 'checkpoints'), 'save_interval': f'{args.batches}ba',
                      'autoresume': False}
    raw.downstream = {'tasks': [TASK], 'include': [task['yaml']], 'interval': f'{args.interval}ba',
                      'batch_tokens': args.batch_tokens}
    OmegaConf.save(raw, path)
    return path


def train(yaml: str, log_path: str, gpus: int) -> dict:
    """``composer -n gpus train.py`` on the YAML; each in-loop evaluation's (batch, seconds) and the last logged
    tokens/s (a GPU)."""
    command = [*LAUNCHER, '-n', str(gpus), os.path.join(REPO, 'train.py'), yaml]
    print('--- ours:', ' '.join(command[len(LAUNCHER):]), flush=True)
    with open(log_path, 'w') as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    text = open(log_path).read()
    if code != 0:
        raise RuntimeError(f'training exited {code}; see {log_path}:\n' + '\n'.join(text.splitlines()[-15:]))
    return {'evaluations': [(int(batch), float(seconds)) for batch, seconds in EVALUATION_LINE.findall(text)],
            'tokens_per_second': float(BATCH_LINE.findall(text)[-1][1].replace(',', ''))}


def export(checkpoints: str, out: str) -> None:
    command = [sys.executable, os.path.join(REPO, 'scripts', 'convert_checkpoint.py'), 'to-hf', checkpoints, out]
    subprocess.run(command, check=True, cwd=REPO)


def hf_evaluate(export_folder: str, task: dict, batch_size: str, device: str) -> dict:
    """The harness's HF backend on the export (bf16 on a GPU), timed from ``simple_evaluate``'s start, as ours is
    from the callback's."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    import torch
    model = HFLM(pretrained=export_folder, dtype='bfloat16' if device.startswith('cuda') else 'float32',
                 batch_size=batch_size, device=device)
    manager = TaskManager(include_path=os.path.dirname(task['yaml']), include_defaults=False)  # the local task alone
    started = time.perf_counter()
    results = simple_evaluate(model=model, tasks=[TASK], task_manager=manager, log_samples=True, random_seed=None,
                              numpy_random_seed=None, torch_random_seed=None, bootstrap_iters=0)
    seconds = time.perf_counter() - started
    del model
    torch.cuda.empty_cache()
    return {'batch_size': batch_size, 'seconds': seconds, 'metrics': metrics_of(results),
            'loglikelihoods': loglikelihoods(results)}


def out_of_loop(checkpoints: str, task: dict, args) -> tuple[dict, HarnessModel]:
    """The task, and ours on the last checkpoint's weights in this process (scripts/evaluate.py's path: eager, bf16
    autocast on a GPU)."""
    import torch
    tasks, _ = load_tasks([TASK], [task['yaml']])
    model, tokenizer, max_length = model_from_weights(checkpoints)
    return tasks, HarnessModel(model.to(args.device), tokenizer, max_length, args.batch_tokens, args.device,
                               torch.bfloat16 if args.device.startswith('cuda') else None)


def rescore(checkpoints: str, task: dict, args, ours: dict) -> dict:
    """The last checkpoint scored again out of the loop in this one process: the same weights' metrics and
    log-likelihoods beside the last in-loop evaluation's (on ``--gpus`` GPUs, the model sharded), and its seconds."""
    tasks, harness = out_of_loop(checkpoints, task, args)
    started = time.perf_counter()
    results = run_tasks(harness, tasks)
    seconds = time.perf_counter() - started
    metrics, in_loop = metrics_of(results), ours['metrics_by_batch'][args.batches]
    return {'seconds': seconds, 'metrics': metrics,
            'max_abs_metric_difference': max(abs(metrics[name] - value) for name, value in in_loop.items()),
            'loglikelihood_differences': differences(ours['loglikelihoods'], loglikelihoods(results))}


def profile_ours(checkpoints: str, task: dict, args, out: str) -> None:
    """Where an evaluation's seconds go: ours out of the loop (scripts/evaluate.py's path) timed twice, the second
    under cProfile, and the harness alone (every request scored 0) timed: written to ``out``."""
    import cProfile
    import io
    import pstats

    class Unscored(HarnessModel):
        def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
            return [(0.0, False)] * len(requests)

    tasks, harness = out_of_loop(checkpoints, task, args)
    lines = []
    for attempt in range(2):
        profiler = cProfile.Profile() if attempt else None
        started = time.perf_counter()
        if profiler:
            profiler.enable()
        run_tasks(harness, tasks)  # its results are on the CPU: no GPU work is left
        if profiler:
            profiler.disable()
        lines.append(f'ours out of the loop, evaluation {attempt + 1}: {time.perf_counter() - started:.2f} s')
    started = time.perf_counter()
    run_tasks(Unscored(None, harness.tokenizer, harness.max_length), tasks)
    lines.append(f'the harness alone (requests scored 0): {time.perf_counter() - started:.2f} s')
    for order in ('tottime', 'cumulative'):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
        lines.append(text.getvalue())
    with open(out, 'w') as file:
        file.write('\n'.join(lines))
    print('\n'.join(lines[:3]))


def loglikelihoods(results: dict) -> dict[int, list[float]]:
    """Each question's (doc_id's) choices' log-likelihoods, from the harness's logged samples."""
    return {sample['doc_id']: [response[0] for response in sample['filtered_resps']]
            for sample in results['samples'][TASK]}


def differences(ours: dict[int, list[float]], theirs: dict[int, list[float]]) -> dict:
    """Largest and mean |ours - theirs| over every choice, and the questions whose best choice differs."""
    gaps = [abs(a - b) for doc in theirs for a, b in zip(ours[doc], theirs[doc])]
    best = lambda scores: max(range(len(scores)), key=scores.__getitem__)
    picks = sum(best(ours[doc]) != best(theirs[doc]) for doc in theirs)
    return {'max_abs': max(gaps), 'mean_abs': statistics.fmean(gaps), 'questions_picked_differently': picks}
