import json
import os

from tests.conftest import REPO

# bash benchmarks/gpu.sh plan-1b settings on one H200: the 1B at 8 samples a step, eight settings, each row with the
# plan's predictions (of the model then) beside the measured peak allocated memory and tokens/s
H200_SETTINGS = os.path.join(REPO, 'benchmarks/results/plan/plan-1b-settings_h200.json')


def h200_rows() -> list[dict]:
    with open(H200_SETTINGS) as file:
        return json.load(file)['rows']
