"""``composer -n N tests/gradient_norms_worker.py OUT RUN [RUN ...]``: tests/training_runs_worker.py's runs, each
one's gradient norms before clipping (the ``gradient_clipping`` algorithm's, a batch each) written by rank 0 to
OUT as a JSON list of lists, one a run."""
import json
import sys

from composer.utils import dist

from llmfoundry_ext.measure.benchmark import LossRecorder
from tests.training_runs_worker import train_each

if __name__ == '__main__':
    out, *runs = sys.argv[1:]
    norms = [recorder.norms() for recorder, in train_each(runs, lambda: [LossRecorder()])]
    if dist.get_global_rank() == 0:
        with open(out, 'w') as file:
            json.dump(norms, file)
