"""Every key of the config schema, and every argument of every named component, given values it must refuse: each is
refused by preflight (what ``train.py`` runs before any process group: ``config error: <line>``, exit status 2) in
one line naming the key, or accepted by design (ACCEPTED says why). The keys are read from the schema itself
(``config_reference.value_fields``) and the arguments from each registered class's signature, so a key or component
added later is swept without a test of its own: a value it lets through that ACCEPTED does not list fails here."""
import copy
import json
import os
import types
import typing

import pytest
import torch

from data_prep.train_tokenizer import train_bpe
from llmfoundry_ext import registry
from llmfoundry_ext.config_reference import sections, value_fields
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.model.llama import LlamaConfig, Transformer
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.weights import save_hf
from tests.conftest import write_yaml
from tests.test_downstream import CHOICE_TASK, arithmetic_questions, write_jsonl

NUMBER, FLAG, TEXT, LIST = (-1, 0, 'word'), ('word',), ('no_such_name', 7), ((), ('no_such_name',), 'word')

# (key, value) -> why the run takes it
ACCEPTED = {
    ('run_name', 'no_such_name'): 'any text names a run',
    ('seed', 0): 'a seed',
    ('eval_subset_num_batches', -1): '-1: all of data.eval',
    ('data.train.shuffle_seed', 0): 'a seed',
    ('data.eval.shuffle_seed', 0): 'a seed',
    ('data.train.num_workers', 0): 'the batches are read in the training process',
    ('data.eval.num_workers', 0): 'the batches are read in the training process',
    ('data.eos_token_id', 0): 'an id of the vocabulary',
    ('objective.mask_token_id', 0): 'an id of the vocabulary',
    ('checkpoint.save_folder', 'no_such_name'): 'a folder the run creates',
    ('checkpoint.save_num_checkpoints_to_keep', -1): '-1: all',
    ('downstream.num_fewshot', 0): 'zero-shot',
    ('model.fused_kernels', ()): 'no fused kernel',
    ('model.init_skip', ()): 'every tensor from model.init_from',
    ('model.router_aux_loss_coef', 0): 'no load-balancing loss',
}
# what a key is read under (the others: the base run below)
CONTEXT = {
    'data.eos_token': {'data': {'document_masking': True}},
    'data.eos_token_id': {'data': {'document_masking': True}},
    'objective.mask_token': {'objective': {'name': 'mlm'}, 'model': {'causal': False}},
    'objective.mask_token_id': {'objective': {'name': 'mlm'}, 'model': {'causal': False}},
    'model.init_skip': {'model': {'init_from': '{weights}'}},
}
def bad_values(annotation) -> tuple:
    """The values a key of this type must refuse: numbers -1, 0 and a word; a flag a word; a name or text an unknown
    name and a number; a list none, an unknown item and a word (a list as a tuple: a case is hashable)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None, X | 'auto'
        annotation = next(arg for arg in typing.get_args(annotation)
                          if arg not in (type(None), typing.Literal['auto']))
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is list:
        return LIST
    if typing.get_origin(annotation) is dict or annotation is typing.Any:
        return ()  # a component's name and arguments: test_every_argument_of_every_component_is_checked
    return {int: NUMBER, float: NUMBER, bool: FLAG}.get(annotation, TEXT)


def schema_cases() -> list[tuple[str, str, object]]:
    """(family, key, value) for every key of the schema (the model's of each family) and each of its bad values."""
    cases, seen = [], set()
    for heading, prefix, cls in sections():
        family = 'mixtral' if 'mixtral' in heading else 'llama'
        for key, _, spec in value_fields(prefix, cls):
            if key not in seen and not key.endswith('.streams'):
                seen.add(key)
                cases += [(family, key, value) for value in bad_values(spec.type)]
    return cases


@pytest.fixture(scope='module')
def bases(tmp_path_factory, tiny_streams) -> dict:
    """The runs the keys are swept from: the tiny run with held-out data and downstream tasks, its tokenizer (with
    the EOS and mask tokens) and weights of its architecture to start from; the same as a Mixtral."""
    root = tmp_path_factory.mktemp('sweep')
    bpe = train_bpe(['some text'] * 10, vocab_size=300)
    bpe.add_special_tokens(['<|end_of_text|>', '<|reserved_special_token_100|>'])
    os.makedirs(root / 'tokenizer')
    bpe.save(str(root / 'tokenizer' / 'tokenizer.json'))
    (root / 'tokenizer' / 'tokenizer_config.json').write_text(json.dumps(
        {'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': '<|end_of_text|>'}))
    (root / 'task.yaml').write_text(CHOICE_TASK.format(data=write_jsonl(root / 'task.jsonl', arithmetic_questions(4))))
    model = {'preset': 'debug', 'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'ffn_dim': 128,
             'vocab_size': 512, 'max_seq_len': 64}
    llama = {
        'run_name': 'tiny', 'max_seq_len': 32, 'global_batch_size': 8, 'max_duration': '20ba', 'precision': 'fp32',
        'model': model, 'optimizer': {'name': 'decoupled_adamw', 'lr': 1.0e-3},
        'data': {'tokenizer': str(root / 'tokenizer'),
                 'train': {'streams': {'a': {'local': tiny_streams['a']}}},
                 'eval': {'streams': {'a': {'local': tiny_streams['b']}}}},
        'checkpoint': {'save_folder': str(root / 'checkpoints' / '{run_name}')},
        'downstream': {'tasks': ['arithmetic_choice'], 'include': [str(root / 'task.yaml')], 'interval': '10ba'},
        'loggers': {}, 'progress_bar': False}
    architecture = LlamaConfig(**{k: v for k, v in model.items() if k != 'preset'}, rope_theta=10000.0,
                               rope_scaling_factor=1.0, tie_embeddings=True)
    save_hf(Transformer(architecture).state_dict(), architecture, str(root / 'weights'), torch.float32)
    mixtral = copy.deepcopy(llama)
    mixtral['model'].update(family='mixtral', n_experts=4, experts_per_token=2)
    return {'llama': llama, 'mixtral': mixtral, 'weights': str(root / 'weights'), 'folder': root}


def merged(base: dict, extra: dict) -> dict:
    merged_ = copy.deepcopy(base)
    for key, value in extra.items():
        merged_[key] = merged(merged_.get(key, {}), value) if isinstance(value, dict) else value
    return merged_


def refusal(config: dict, folder, name: str = 'run.yaml') -> str | None:
    """The one line preflight refuses ``config`` with, or None where it takes it."""
    try:
        prepare(write_yaml(config, folder / name))
    except ConfigError as error:
        return str(error)
    return None


def test_every_key_of_the_schema_refuses_its_bad_values_in_one_line_or_takes_them_by_design(bases):
    cases = schema_cases()
    assert len(cases) >= 230  # ~100 keys (the model's of both families) x their bad values
    accepted, wrong = set(), []
    base_run = refusal(bases['llama'], bases['folder'])
    assert base_run is None, base_run  # the base runs as it is
    for family, key, value in cases:
        extra = json.loads(json.dumps(CONTEXT.get(key, {})).replace('{weights}', bases['weights']))
        config = merged(bases[family], extra)
        parent = config
        *parents, last = key.replace('<name>', 'a').split('.')
        for part in parents:
            parent = parent.setdefault(part, {})
        parent[last] = list(value) if isinstance(value, tuple) else value
        line = refusal(config, bases['folder'])
        if line is None:
            accepted.add((key, value))
        elif '\n' in line or key.replace('<name>', 'a') not in line:
            wrong.append(f'{key}={value!r}: {line!r}')
    assert wrong == [], '\n'.join(wrong)
    assert accepted == set(ACCEPTED)
    print(f'{len({key for _, key, _ in cases})} keys, {len(cases)} values: {len(cases) - len(accepted)} refused in '
          f'one line naming the key, {len(accepted)} accepted by design')


def component_cases() -> list[tuple[str, str, str, object]]:
    """(section, component name, argument, bad value) for each typed argument of each registered component: a word
    for a number, a flag or a duration, a number for a text or a list."""
    cases = []
    for kind, table in registry.KINDS.items():
        for name, cls in table.items():
            for argument, annotation in registry.argument_types(cls).items():
                wrong = 7 if registry.fits('word', annotation) else 'word'
                if argument != 'params' and not registry.fits(wrong, annotation):
                    cases.append((kind, name, argument, wrong))
    return cases


def test_every_argument_of_every_component_is_checked_against_its_type(bases):
    """...durations among them: a scheduler's t_warmup that Composer would parse at its first step."""
    cases = component_cases()
    assert len(cases) >= 100
    wrong = []
    for kind, name, argument, value in cases:
        if kind in ('optimizer', 'scheduler'):
            section, path = {'name': name, argument: value}, f'{kind}.{argument}'
        else:
            section, path = {name: {argument: value}}, f'{kind}.{name}.{argument}'
        line = refusal({**bases['llama'], kind: section}, bases['folder'])
        if line is None or '\n' in line or not line.startswith(f'{path}: '):
            wrong.append(f'{path}={value!r}: {line!r}')
    assert wrong == []
    assert refusal({**bases['llama'], 'scheduler': {'name': 'cosine_with_warmup', 't_warmup': '10 batches'}},
                   bases['folder']) == ("scheduler.t_warmup: CosineAnnealingWithWarmupScheduler takes a duration "
                                        "(e.g. 100ba, 2ep, 0.1dur), got str '10 batches'")
    print(f'{len(cases)} arguments of {sum(map(len, registry.KINDS.values()))} components, each refused in one line')
