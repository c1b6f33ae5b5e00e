"""``composer -n N tests/gradient_norms_worker.py OUT RUN [RUN ...]``: tests/training_runs_worker.py's runs, each
one's gradient norms before clipping (the ``gradient_clipping`` algorithm's, a batch each) written by rank 0 to
OUT as a JSON list of lists, one a run."""
import json
import shlex
import sys

from composer.utils import dist

from llmfoundry_ext.measure.benchmark import LossRecorder
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import train
from tests.training_runs_worker import RUN_MARK

if __name__ == '__main__':
    out, *runs = sys.argv[1:]
    norms = []
    for index, run in enumerate(runs):
        print(f'{RUN_MARK}{index}', flush=True)
        yaml, *overrides = shlex.split(run)
        recorder = LossRecorder()
        train(prepare(yaml, overrides), extra_callbacks=[recorder]).close()
        norms.append(recorder.norms())
    if dist.get_global_rank() == 0:
        with open(out, 'w') as file:
            json.dump(norms, file)
