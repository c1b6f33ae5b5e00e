"""A run's TensorBoard scalars -> one PNG of its loss, tokens/s and MFU curves."""
import glob
import os

HELD_OUT_LOSS = 'metrics/eval/LanguageCrossEntropy'
# title -> (tag, legend label): a panel for each title with a tag logged
PANELS = {'loss': (('loss/train/total', 'training'), (HELD_OUT_LOSS, 'held-out')),
          'tokens/s per device': (('throughput/device/tokens_per_sec', None),),
          'MFU': (('throughput/device/mfu', None),)}


def read_scalars(run_folder: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] over every event file under ``run_folder`` (all invocations of a resumed run)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    files = sorted(glob.glob(os.path.join(run_folder, '**', 'events.out.tfevents.*'), recursive=True))
    if not files:
        raise FileNotFoundError(f'{run_folder}: no TensorBoard event files (events.out.tfevents.*) under it')
    series: dict[str, dict[int, float]] = {}
    for path in files:
        accumulator = EventAccumulator(path, size_guidance={'scalars': 0})
        accumulator.Reload()
        for tag in accumulator.Tags()['scalars']:
            series.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    return {tag: sorted(points.items()) for tag, points in series.items()}


def evaluated(tag: str) -> bool:
    return tag.startswith(('metrics/eval/', 'metrics/downstream/'))


def accuracies(scalars: dict) -> list[tuple[str, str]]:
    """The downstream tasks' accuracies logged (``metrics/downstream/<task>/acc``, ``acc_norm``), as (tag, label)."""
    return [(tag, tag.removeprefix('metrics/downstream/')) for tag in sorted(scalars)
            if tag.startswith('metrics/downstream/') and tag.endswith(('/acc', '/acc_norm'))]


def batch(tag: str, step: int) -> int:
    """The batch a point belongs to: Composer logs training metrics at step = batch - 1, evaluation ones at the
    number of batches done."""
    return step if evaluated(tag) else step + 1


def plot_run(run_folder: str, out_png: str) -> dict[str, int]:
    """Write the PNG, a panel for each of PANELS' titles with a metric the run logged (MFU only on GPUs, held-out
    loss only with evaluation) and one of the downstream accuracies; returns how many points each metric drew."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    scalars = read_scalars(run_folder)
    panels = {title: [(tag, label) for tag, label in lines if scalars.get(tag)]
              for title, lines in {**PANELS, 'downstream accuracy': accuracies(scalars)}.items()}
    panels = {title: lines for title, lines in panels.items() if lines}
    if not panels:
        raise ValueError(f"{run_folder}: none of {', '.join(t for lines in PANELS.values() for t, _ in lines)} "
                         f"was logged")
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    drawn = {}
    for axis, (title, lines) in zip(axes[0], panels.items()):
        for tag, label in lines:
            steps, values = zip(*scalars[tag])
            axis.plot([batch(tag, s) for s in steps], values, label=label,
                      marker='o' if evaluated(tag) else None)
            drawn[tag] = len(steps)
        if len(lines) > 1:
            axis.legend()
        axis.set(title=title, xlabel='batch')
        axis.grid(alpha=0.3)
    figure.suptitle(os.path.normpath(run_folder))
    figure.tight_layout()
    figure.savefig(out_png, dpi=110)
    plt.close(figure)
    return drawn
