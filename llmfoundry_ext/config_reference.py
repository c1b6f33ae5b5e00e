"""docs/config.md from the config classes: every YAML key with its type, default and one line, the line being the
comment beside the field in the source (``python scripts/config_reference.py`` writes it; a test fails when a key has
no line or the file is stale). Python keeps no field comments at run time, hence the reading of the source."""
import dataclasses
import functools
import inspect
import io
import tokenize
import types
import typing

from llmfoundry_ext.config import StreamConfig, TrainConfig, model_config_class
from llmfoundry_ext.model.families import FAMILIES

HEADER = """# Configuration reference

Every key a run's YAML takes (or `key=value` on the command line), generated from the config classes by
`python scripts/config_reference.py`: do not edit by hand. The model's architecture keys default to its `preset`'s
values. A number's range and a name's choices are part of its type (`int (positive)`, `'line' | 'full'`): a value
outside them is one line naming the key before training starts. Keys that hold a name and arguments (`optimizer`,
`scheduler`, `callbacks`, `algorithms`, `loggers`) are listed in `llmfoundry_ext/registry.py`; each argument is
checked against its class's signature and types (a duration such as `t_warmup` must parse). A YAML's `optimizer` or
`scheduler` replaces the default's dict but keeps its `lr` (3e-4) or `t_warmup` (100ba) where the component takes one
and the YAML sets none (the start summary marks them `default`); `callbacks`, `algorithms` and `loggers` are the
YAML's alone (naming `loggers` drops TensorBoard unless listed). A YAML may also hold two keys of its own:

- `variables:` values for `${variables.x}` anywhere in the run's YAML, resolved and then dropped.
- `include: [a.yaml, ...]` YAML files (paths relative to this one) merged under it in order: a later file's keys
  replace an earlier's and this file's replace all (a list is replaced whole). The shipped YAMLs include
  `yamls/common/pretraining.yaml` and `yamls/common/frontier_mixture.yaml`; a run writes the merged result, every
  key, to `config.yaml` in its checkpoint folder.
"""


@functools.cache
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment beside it and on the comment lines that follow it, over ``cls``'s dataclass bases."""
    comments = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            try:
                comments |= comments_in_source(inspect.getsource(klass))
            except (OSError, TypeError):  # a class made at run time (model_config_class): its bases hold the fields
                continue
    return comments


def comments_in_source(source: str) -> dict[str, str]:
    """The class body's ``name: type = ...  # comment`` lines (and comment lines continuing them)."""
    comments, current, previous = {}, None, None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.start[1] == 4 and token.line[4:].startswith(token.string + ':'):
            current = token.string
        elif token.type == tokenize.COMMENT and current:
            comments.setdefault(current, []).append(token.string.lstrip('#').strip())
        elif token.type == tokenize.NL and previous in (tokenize.NEWLINE, tokenize.NL):
            current = None  # a blank line ends the field's comment
        previous = token.type
    return {name: ' '.join(lines) for name, lines in comments.items()}


def sections() -> list[tuple[str, str, type]]:
    """(heading, key prefix, class): the run's keys, then each family's model keys."""
    return [('the run', '', TrainConfig)] + [(f'model (family: {family})', 'model', model_config_class(family))
                                             for family in FAMILIES]


def nested_class(annotation) -> type | None:
    """The config class a field holds (directly or Optional), or None for a value."""
    candidates = [annotation, *typing.get_args(annotation)]
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)


def value_fields(prefix: str, cls: type) -> list[tuple[str, type, dataclasses.Field]]:
    """(key, class, field) for each value field of ``cls`` under ``prefix``, nested classes' after: the schema's
    keys (a stream's under ``<name>``; the model's in a section of its family: ``sections``)."""
    values, nested = [], []
    for spec in dataclasses.fields(cls):
        key = f'{prefix}.{spec.name}' if prefix else spec.name
        inner = nested_class(spec.type)
        if spec.name == 'streams':  # name -> StreamConfig
            values.append((key, cls, spec))
            nested.append((f'{key}.<name>', StreamConfig))
        elif inner is not None and spec.name != 'model':
            nested.append((key, inner))
        elif inner is None:
            values.append((key, cls, spec))
    for key, inner in nested:
        values += value_fields(key, inner)
    return values


def rows(prefix: str, cls: type) -> list[tuple[str, str, str, str]]:
    """(key, type, default, line) for each value field of ``cls`` under ``prefix``, nested classes after."""
    return [(key, 'name -> stream' if spec.name == 'streams' else type_text(spec.type),
             'required' if spec.name == 'streams' else default_text(spec), field_comments(owner).get(spec.name, ''))
            for key, owner, spec in value_fields(prefix, cls)]


def type_text(annotation) -> str:
    """'int (positive)', "'line' \\| 'full'", "int (positive) \\| 'auto' \\| None", 'list[str]'."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return f"{type_text(args[0])} ({', '.join(bounds.text() for bounds in args[1:])})"
    if origin is typing.Literal:
        return ' | '.join(repr(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return ' | '.join(type_text(arg) for arg in args)
    if annotation is type(None):
        return 'None'
    if isinstance(annotation, type) and not args:
        return annotation.__name__
    return str(annotation).replace('typing.', '')


def cell(text: str) -> str:
    """``text`` inside a Markdown table cell (its pipes escaped)."""
    return text.replace('|', '\\|')


def default_text(spec: dataclasses.Field) -> str:
    if spec.default is not dataclasses.MISSING:
        return repr(spec.default)
    if spec.default_factory is not dataclasses.MISSING:
        return repr(spec.default_factory())
    return 'required'


def reference() -> str:
    """The Markdown of docs/config.md."""
    parts, listed = [HEADER], set()
    for heading, prefix, cls in sections():
        every = rows(prefix, cls)
        table = [row for row in every if row[0] not in listed]
        also = '\nThe keys of the family above, and:\n' if len(table) < len(every) else ''
        parts.append(f'\n## {heading}\n{also}\n| key | type | default | meaning |\n|---|---|---|---|\n')
        parts += [f'| `{key}` | `{cell(kind)}` | `{cell(default)}` | {cell(line)} |\n' for key, kind, default, line in table]
        listed |= {row[0] for row in table}
    return ''.join(parts)


def missing_lines() -> list[str]:
    """Keys without a line: each must have one."""
    return [key for _, prefix, cls in sections() for key, _, _, line in rows(prefix, cls) if not line]

