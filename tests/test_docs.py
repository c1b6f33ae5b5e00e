"""The README and docs/: the README stays a front door (at most 15 KB), and every relative link resolves."""
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = [REPO / 'README.md', *sorted((REPO / 'docs').glob('*.md'))]
LINK = re.compile(r'\]\(([^)\s]+)\)')


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
