"""scripts/config_reference.py writes the reference."""
import pathlib
import subprocess
import sys

from llmfoundry_ext.config_reference import reference

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_script_writes_it(tmp_path):
    out = tmp_path / 'config.md'
    done = subprocess.run([sys.executable, 'scripts/config_reference.py', '--out', str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout, out.read_text()) == (0, f'wrote {out}\n', reference())
