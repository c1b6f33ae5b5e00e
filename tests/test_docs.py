"""The README, docs/ and benchmarks/: the README stays a front door (at most 15 KB, no commit hashes) whose commands
run as written, every relative link resolves, and benchmarks/results/ holds only what a dated report cites."""
import collections
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from llmfoundry_ext.config import TrainConfig, build, read_yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
REPORTS = sorted((REPO / 'benchmarks').glob('*.md'))
PAGES = [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md')), *REPORTS]
LINK = re.compile(r'\]\(([^)\s]+)\)')
JOB_COMMAND = re.compile(r'^\| [^|]+ \| `((?:python|composer|sbatch) [^`]+)` \|', re.MULTILINE)


def test_the_readme_is_at_most_15_kb():
    assert (REPO / 'README.md').stat().st_size <= 15 * 1024


@pytest.mark.parametrize('page', PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    targets = [target.split('#')[0] for target in LINK.findall(page.read_text())
               if not re.match(r'(https?:|#|mailto:)', target)]
    missing = [target for target in targets if not (page.parent / target).exists()]
    assert missing == []


def test_the_architecture_page_names_every_module_script_and_yaml():
    """docs/architecture.md is the map a newcomer reads: a file it leaves out is a file nobody finds."""
    page = (REPO / 'docs' / 'architecture.md').read_text()
    files = [path for folder in ('llmfoundry_ext', 'scripts', 'data_prep', 'yamls') for path in (REPO / folder).rglob('*')
             if path.suffix in ('.py', '.yaml', '.sh', '.sbatch') and path.name != '__init__.py'
             and '__pycache__' not in path.parts]
    assert len(files) > 90
    assert [str(path.relative_to(REPO)) for path in files if path.name not in page] == []


def test_the_readme_names_no_commit():
    assert re.findall(r'\b[0-9a-f]{7,40}\b', (REPO / 'README.md').read_text()) == []


def test_benchmark_reports_are_named_what_hardware_date():
    assert len(REPORTS) >= 8
    assert [path.name for path in REPORTS if not re.fullmatch(r'[a-z0-9.-]+_[a-z0-9-]+_\d{4}-\d{2}-\d{2}\.md',
                                                                path.name)] == []


def test_every_results_file_is_cited_by_a_dated_report():
    """By its path under benchmarks/results/, a folder above it, or its name where no other file has it."""
    results = REPO / 'benchmarks' / 'results'
    files = [path.relative_to(results).as_posix() for path in results.rglob('*') if path.is_file()]
    reports = '\n'.join(path.read_text() for path in REPORTS)
    names = collections.Counter(os.path.basename(file) for file in files)

    def cited(file: str) -> bool:
        folders = [file.rsplit('/', depth)[0] + '/' for depth in range(1, file.count('/') + 1)]
        return any(text in reports for text in (file, *folders)) or (
            names[os.path.basename(file)] == 1 and os.path.basename(file) in reports)
    assert len(files) > 100
    assert [file for file in files if not cited(file)] == []


def readme_commands() -> dict[str, list[str]]:
    """The README's one-line jobs, by the file they run."""
    commands = [shlex.split(command) for command in JOB_COMMAND.findall((REPO / 'README.md').read_text())]
    return {next(word for word in words if word.endswith(('.py', '.sbatch'))): words for words in commands}


def test_the_readme_jobs_are_the_ones_this_test_runs():
    assert sorted(readme_commands()) == ['data_prep/convert_to_mds.py', 'scripts/convert_checkpoint.py',
                                         'scripts/evaluate.py', 'scripts/plan.py', 'scripts/slurm/nvidia.sbatch',
                                         'train.py']


@pytest.mark.slow
@pytest.mark.parametrize('script, rc, last_line', [
    ('data_prep/convert_to_mds.py', 2, 'error: /data/finemath/finemath-3plus: no files match **/*.parquet'),
    ('scripts/plan.py', 0, '1T tokens: 4.8 days on 256 GPUs (29,595 GPU-hours)'),
    ('scripts/convert_checkpoint.py', 2, 'error: checkpoints/my-run: no latest-rank0.pt link and not a checkpoint; '
     'give the save folder of a run or one checkpoint (ep0-ba100/ or ep0-ba100-rank0.pt)'),
    ('scripts/evaluate.py', 2, 'error: checkpoints/llama1b-frontier-mix: no latest-rank0.pt link and not a '
     'checkpoint; give the save folder of a run or one checkpoint (ep0-ba100/ or ep0-ba100-rank0.pt)'),
])
def test_a_readme_job_runs_as_written_to_its_first_check_against_this_machine(script, rc, last_line):
    """Run here, where its data, checkpoint and network are absent: it parses, and stops at the first thing this
    machine lacks, in one line (the plan, which needs nothing, runs to its end)."""
    words = readme_commands()[script]
    assert words[0] == 'python'
    run = subprocess.run([sys.executable, *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'})
    assert (run.returncode, (run.stdout + run.stderr).strip().splitlines()[-1]) == (rc, last_line)


def test_the_readme_training_jobs_read_their_yaml_and_overrides():
    """Under ``composer`` (or ``sbatch``) the YAML and overrides after the script are what train.py reads: here they
    resolve to a whole config (the GPUs and data they need are the launch tests')."""
    for script in ('train.py', 'scripts/slurm/nvidia.sbatch'):
        words = readme_commands()[script]
        yaml, *overrides = words[words.index(script) + 1:]
        config = build(TrainConfig, read_yaml(str(REPO / yaml), overrides), '')
        assert config.data.train.streams['dclm'].local == '/lustre/mds/zyda2/dclm_crossdeduped/train'
    assert subprocess.run(['bash', '-n', str(REPO / 'scripts/slurm/nvidia.sbatch')]).returncode == 0
