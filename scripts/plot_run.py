"""Plot a run's training and held-out loss, tokens/s and MFU from its TensorBoard logs.

  python scripts/plot_run.py <folder with event files, e.g. demo_run/checkpoints/demo/tensorboard> <out.png>
"""
import sys

from llmfoundry_ext.measure.plotting import plot_run


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        drawn = plot_run(argv[0], argv[1])
    except FileNotFoundError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    print(f"wrote {argv[1]}: " + ', '.join(f'{tag} {count} points' for tag, count in drawn.items()))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
