"""A run's TensorBoard scalars -> one PNG of its loss, tokens/s and MFU curves."""
import glob
import os

PANELS = (('loss/train/total', 'training loss'), ('throughput/device/tokens_per_sec', 'tokens/s per device'),
          ('throughput/device/mfu', 'MFU'))


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


def plot_run(run_folder: str, out_png: str) -> dict[str, int]:
    """Write the PNG, a panel for each of PANELS' metrics the run logged (MFU only on GPUs); returns how many points
    each panel drew."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    scalars = read_scalars(run_folder)
    panels = [(tag, title) for tag, title in PANELS if scalars.get(tag)]
    if not panels:
        raise ValueError(f"{run_folder}: none of {', '.join(tag for tag, _ in PANELS)} was logged")
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    drawn = {}
    for axis, (tag, title) in zip(axes[0], panels):
        points = scalars[tag]
        steps, values = zip(*points)
        axis.plot([s + 1 for s in steps], values)
        axis.set(title=title, xlabel='batch')
        axis.grid(alpha=0.3)
        drawn[tag] = len(points)
    figure.suptitle(os.path.normpath(run_folder))
    figure.tight_layout()
    figure.savefig(out_png, dpi=110)
    plt.close(figure)
    return drawn
