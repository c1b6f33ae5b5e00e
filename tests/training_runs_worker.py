"""Several training runs in one launch, one after another in the same processes and process group:
``composer -n N tests/training_runs_worker.py RUN [RUN ...]``, each RUN a YAML path and its overrides as one
argument (shell words). Each run is what ``composer -n N train.py <yaml> <overrides>`` trains, without a launcher and
N processes started again for it (~12 s of start-up a launch on 2 cores). Before each run every process prints
``RUN_MARK`` and the run's index; the first run that fails ends the launch with its traceback."""
import shlex
import sys

from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import train

RUN_MARK = '=== run '


def train_each(runs: list[str], callbacks=list) -> list[list]:
    """Each run in turn, with the extra callbacks ``callbacks()`` makes for it; those callbacks, a list a run."""
    made = []
    for index, run in enumerate(runs):
        print(f'{RUN_MARK}{index}', flush=True)
        yaml, *overrides = shlex.split(run)
        made.append(callbacks())
        train(prepare(yaml, overrides), extra_callbacks=made[-1]).close()
    return made


if __name__ == '__main__':
    train_each(sys.argv[1:])
