"""Every script is a command line over the package: argument parsing and a call, its logic in the package."""
import glob
import os

from tests.conftest import REPO

MOST_LINES = 80


def test_no_script_is_longer_than_80_lines():
    scripts = sorted(glob.glob(os.path.join(REPO, 'scripts', '*.py')))
    lengths = {os.path.basename(path): sum(1 for _ in open(path)) for path in scripts}
    assert len(lengths) >= 14 and 'train.py' not in lengths
    assert {name: lines for name, lines in lengths.items() if lines > MOST_LINES} == {}
