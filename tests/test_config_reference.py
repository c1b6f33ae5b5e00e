"""docs/config.md: generated from the config classes, a line for every key, every shipped YAML's keys in it."""
import pathlib

import pytest

from llmfoundry_ext.config import read_yaml
from llmfoundry_ext.config_reference import comments_in_source, missing_lines, reference

REPO = pathlib.Path(__file__).resolve().parent.parent
FREE_FORM = ('optimizer', 'scheduler', 'callbacks', 'algorithms', 'loggers', 'variables')  # name -> arguments


def test_every_key_has_a_line():
    assert missing_lines() == []


def test_docs_config_md_is_the_generated_reference():
    assert (REPO / 'docs' / 'config.md').read_text() == reference(), 'run python scripts/config_reference.py'


def test_a_field_comment_runs_on_over_its_comment_lines_and_stops_at_a_blank_line():
    source = ('class A:\n    a: int = 1  # first\n    #           and more\n    b: str = "x"\n\n    # not b\'s\n'
              '    c: int = 2  # c\'s\n')
    assert comments_in_source(source) == {'a': 'first and more', 'c': "c's"}


def yaml_keys(data: dict, prefix: str = '') -> list[str]:
    keys = []
    for key, value in data.items():
        path = f'{prefix}{key}'
        if path in FREE_FORM:
            keys.append(path)
        elif prefix.endswith('streams.'):  # a stream's own name
            keys += yaml_keys(value, f'{prefix}<name>.')
        else:
            keys += yaml_keys(value, f'{path}.') if isinstance(value, dict) else [path]
    return keys


@pytest.mark.parametrize('path', sorted((REPO / 'yamls').glob('*.yaml')), ids=lambda path: path.name)
def test_every_key_of_a_shipped_yaml_is_in_the_reference(path):
    reference_text = reference()
    keys = set(yaml_keys(read_yaml(str(path))))  # with the files it includes
    assert len(keys) > 10
    assert sorted(key for key in keys if f'`{key}' not in reference_text) == []
