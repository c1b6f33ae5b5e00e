"""The demo's training: on the demo data (``data_prep.demo_corpus``), 2 processes train, stop as at a queue limit,
and autoresume; then the held-out loss and a plot.

Re-running continues from the latest checkpoint (and says so) instead of starting over.
"""
import os
import subprocess

from omegaconf import OmegaConf

from llmfoundry_ext.measure.plotting import HELD_OUT_LOSS, accuracies, plot_run, read_scalars

DEMO_YAML = 'yamls/demo.yaml'
QUEUE_LIMIT_BATCHES = 150  # the first run stops here, as a job at its queue limit would


def launch(extra: list[str]) -> None:
    """``composer -n 2 train.py yamls/demo.yaml`` on CPU; one process per GPU, in bf16, where there are GPUs."""
    import torch
    gpus = torch.cuda.device_count()
    on_gpu = ['precision=amp_bf16'] if gpus else []
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    command = ['composer', '-n', str(gpus or 2), 'train.py', DEMO_YAML, *on_gpu, *extra]
    print('$ ' + ' '.join(command), flush=True)
    subprocess.run(command, env=env, check=True)


def demo_yaml():
    """yamls/demo.yaml, not yet validated (its data may not exist yet): where the data and checkpoints go."""
    return OmegaConf.load(DEMO_YAML)


def train_demo(raw) -> None:
    """Train as a queue-limited job would (a stop, then the same command resumes), or resume an earlier run."""
    checkpoints = raw.checkpoint.save_folder.format(run_name=raw.run_name)
    if not os.path.exists(os.path.join(checkpoints, 'latest-rank0.pt')):
        print(f'\n== run 1: stops after {QUEUE_LIMIT_BATCHES} batches, as at a queue limit ==', flush=True)
        launch([f'callbacks.stop_after.batches={QUEUE_LIMIT_BATCHES}'])
        print('\n== run 2: the same command again: autoresume ==', flush=True)
    else:
        print('\n== a checkpoint exists: the same command autoresumes ==', flush=True)
    launch([])
    print(evaluation_curves(os.path.join(checkpoints, 'tensorboard')), flush=True)
    plot = os.path.join(os.path.dirname(checkpoints.rstrip('/')), f'{raw.run_name}.png')
    plot_run(os.path.join(checkpoints, 'tensorboard'), plot)
    print(f'loss and tokens/s curves: {plot} (python scripts/plot_run.py {checkpoints}/tensorboard {plot})', flush=True)


def evaluation_curves(tensorboard_folder: str) -> str:
    """The held-out loss and the downstream accuracies (4 choices: chance 0.25) at each evaluation, over every
    invocation of the run."""
    scalars = read_scalars(tensorboard_folder)
    lines = ['\nheld-out loss by batch  ' + ' | '.join(f'{batch}: {loss:.2f}' for batch, loss in scalars[HELD_OUT_LOSS])]
    for tag, label in accuracies(scalars):
        lines.append(f'{label} by batch (chance 0.25)  ' + ' | '.join(f'{batch}: {value:.3f}'
                                                                      for batch, value in scalars[tag]))
    return '\n'.join(lines)
