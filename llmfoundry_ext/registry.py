"""YAML names -> classes: Composer's own callbacks, algorithms, loggers, optimizers and schedulers, plus ours
(gradient_clipping: Composer's, folded into a fused optimizer's step; speed_monitor and tensorboard: Composer's,
without a host sync a batch; garbage_collection: Python's collection at batch boundaries, which Composer has not).

A YAML entry ``name: {kwargs}`` is checked against the class's signature before training starts, so a
misspelt name or argument is one line naming it and the nearest valid choice.
"""
import collections.abc
import dataclasses
import enum
import importlib.util
import inspect
import numbers
import types
import typing

import torch
from composer import algorithms, callbacks, loggers, optim
from composer.core import Time

from llmfoundry_ext.callbacks.garbage_collection import GarbageCollection
from llmfoundry_ext.callbacks.sample_ledger import SampleLedger
from llmfoundry_ext.callbacks.speed_monitor import SpeedMonitor
from llmfoundry_ext.callbacks.step_monitor import StepMonitor
from llmfoundry_ext.callbacks.stop_after import StopAfter
from llmfoundry_ext.callbacks.tensorboard import TensorboardLogger
from llmfoundry_ext.clipping import GradientClipping
from llmfoundry_ext.config import OPTIMIZER_DEFAULT, SCHEDULER_DEFAULT, describe, first_line, suggest
from llmfoundry_ext.config_reference import type_text
from llmfoundry_ext.errors import ConfigError

CALLBACKS = {
    'speed_monitor': SpeedMonitor,
    'lr_monitor': callbacks.LRMonitor,
    'memory_monitor': callbacks.MemoryMonitor,
    'memory_snapshot': callbacks.MemorySnapshot,
    'system_metrics_monitor': callbacks.SystemMetricsMonitor,
    'runtime_estimator': callbacks.RuntimeEstimator,
    'optimizer_monitor': callbacks.OptimizerMonitor,
    'activation_monitor': callbacks.ActivationMonitor,
    'nan_monitor': callbacks.NaNMonitor,
    'oom_observer': callbacks.OOMObserver,
    'early_stopper': callbacks.EarlyStopper,
    'threshold_stopper': callbacks.ThresholdStopper,
    'stop_after': StopAfter,
    'sample_ledger': SampleLedger,
    'step_monitor': StepMonitor,
    'garbage_collection': GarbageCollection,
}
ALGORITHMS = {
    'gradient_clipping': GradientClipping,
    'ema': algorithms.EMA,
    'low_precision_layernorm': algorithms.LowPrecisionLayerNorm,
    'seq_length_warmup': algorithms.SeqLengthWarmup,
}
LOGGERS = {
    'tensorboard': TensorboardLogger,
    'wandb': loggers.WandBLogger,
    'mlflow': loggers.MLFlowLogger,
    'file': loggers.FileLogger,
    'in_memory': loggers.InMemoryLogger,
}
LOGGER_PACKAGES = {'wandb': 'wandb', 'mlflow': 'mlflow'}  # what Composer's logger imports when it is built
OPTIMIZERS = {
    'decoupled_adamw': optim.DecoupledAdamW,
    'adamw': torch.optim.AdamW,
    'decoupled_sgdw': optim.DecoupledSGDW,
}
SCHEDULERS = {
    'cosine_with_warmup': optim.CosineAnnealingWithWarmupScheduler,
    'linear_with_warmup': optim.LinearWithWarmupScheduler,
    'constant_with_warmup': optim.ConstantWithWarmupScheduler,
    'polynomial_with_warmup': optim.PolynomialWithWarmupScheduler,
    'cosine': optim.CosineAnnealingScheduler,
    'constant': optim.ConstantScheduler,
}
KINDS = {'callbacks': CALLBACKS, 'algorithms': ALGORITHMS, 'loggers': LOGGERS,
         'optimizer': OPTIMIZERS, 'scheduler': SCHEDULERS}


DEFAULT_ARGUMENTS = {'optimizer': OPTIMIZER_DEFAULT, 'scheduler': SCHEDULER_DEFAULT}


def with_default_arguments(config):
    """``config`` whose optimizer and scheduler hold what the default's hold (``config.OPTIMIZER_DEFAULT``'s name and
    lr, ``SCHEDULER_DEFAULT``'s name and t_warmup) where the YAML sets none and the component takes it, and the names
    of those it gained, by section: a YAML (or ``scheduler.t_warmup=...``) that names a section replaces the default
    dict whole, and without this an optimizer trained at its class's own lr (torch's AdamW 1e-3) while the reference
    said 3e-4. An unknown name is left to ``check_all``."""
    sections, defaulted = {}, {}
    for kind, default in DEFAULT_ARGUMENTS.items():
        section = getattr(config, kind)
        name = section.get('name', default['name']) if isinstance(section, dict) else None
        if not isinstance(name, str) or name not in KINDS[kind]:
            continue
        takes = inspect.signature(KINDS[kind][name]).parameters
        missing = {key: value for key, value in default.items()
                   if key not in section and (key == 'name' or key in takes)}
        if missing:
            sections[kind], defaulted[kind] = {**section, **missing}, list(missing)
    return dataclasses.replace(config, **sections), defaulted


def lookup(kind: str, name: str, path: str):
    """The class registered under ``name``; an unknown name raises one line listing the valid ones."""
    table = KINDS[kind]
    if name not in table:
        raise ConfigError(f"{path}: unknown {kind} name '{name}'{suggest(name, table, 'names')}")
    return table[name]


def check_arguments(cls, kwargs: dict, path: str, positional=()) -> None:
    """Each YAML argument must be a parameter of ``cls`` whose type it has (a duration: one Composer parses);
    required ones (but ``positional``) must be given."""
    parameters = inspect.signature(cls).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    for key in kwargs:
        if key not in parameters and not takes_any:
            raise ConfigError(f'{path}.{key}: not an argument of {cls.__name__}'
                              f'{suggest(key, parameters, "arguments")}')
    types_ = argument_types(cls)
    for key, value in kwargs.items():
        if key in types_ and not fits(value, types_[key]):
            raise ConfigError(f'{path}.{key}: {cls.__name__} takes {expected_text(types_[key])}, got '
                              f'{describe(value)}')
    for name, parameter in parameters.items():
        required = parameter.default is parameter.empty and parameter.kind in (
            parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        if required and name not in kwargs and name not in positional:
            raise ConfigError(f'{path}.{name}: missing required argument of {cls.__name__}')


def argument_types(cls) -> dict:
    """The annotations of ``cls``'s constructor, resolved; {} where they cannot be (then only names are checked)."""
    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation naming what its module does not import: nothing to check against
        return {}


def fits(value, annotation) -> bool:
    """Whether a YAML value (numbers, strings, booleans, lists, mappings, null) is of ``annotation``; a string where
    a Composer ``Time`` is taken must parse as a duration. A type YAML cannot spell (a tensor, a callable) fits."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if Time in args and isinstance(value, str):
            return is_duration(value)
        return any(fits(value, arg) for arg in [arg for arg in args if spellable(arg)] or args)
    if origin is typing.Literal:
        return value in args
    if annotation is Time:
        return isinstance(value, str) and is_duration(value)
    if annotation in SCALARS:
        return SCALARS[annotation](value)
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        return isinstance(value, (list, tuple)) and items_fit(value, origin, args)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return isinstance(value, annotation) or value in {member.value for member in annotation}
    return True


SCALARS = {type(None): lambda value: value is None, bool: lambda value: isinstance(value, bool),
           int: lambda value: isinstance(value, int) and not isinstance(value, bool),
           float: lambda value: is_number(value), str: lambda value: isinstance(value, str)}


def spellable(annotation) -> bool:
    """Whether YAML can give a value of ``annotation`` (not a tensor, a path object or a callable)."""
    return annotation in SCALARS or annotation is Time or typing.get_origin(annotation) in (
        list, tuple, dict, typing.Literal, collections.abc.Sequence, collections.abc.Mapping)


def items_fit(items, origin, args: tuple) -> bool:
    """A list's items of its type; a fixed-length tuple's (``betas: tuple[float, float]``) also its length."""
    if origin is tuple and args and args[-1] is not Ellipsis:
        return len(items) == len(args) and all(fits(item, arg) for item, arg in zip(items, args))
    return not args or all(fits(item, args[0]) for item in items)


def is_duration(text: str) -> bool:
    try:
        Time.from_timestring(text)
    except (ValueError, TypeError):
        return False
    return True


def expected_text(annotation) -> str:
    """What the argument takes, in the configuration reference's words ('float', 'a duration (e.g. 100ba)')."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if Time in args or annotation is Time:
        return 'a duration (e.g. 100ba, 2ep, 0.1dur)'
    if origin in (typing.Union, types.UnionType):  # but what YAML cannot spell (a tensor, a callable)
        return ' | '.join(expected_text(arg) for arg in args if spellable(arg))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} ({', '.join(map(expected_text, args))})"
    return type_text(annotation)


def build(kind: str, name: str, kwargs: dict, *args):
    """An instance of the class registered as ``name`` (``args`` first, e.g. parameters for an optimizer)."""
    return KINDS[kind][name](*args, **kwargs)


def named_entries(section: dict, path: str):
    """``{'name': ..., **kwargs}`` (optimizer, scheduler) -> (name, kwargs)."""
    if 'name' not in section:
        raise ConfigError(f'{path}.name: missing; e.g. {path}.name={next(iter(KINDS[path]))}')
    kwargs = dict(section)
    return kwargs.pop('name'), kwargs


def check_all(config) -> None:
    """Check every registry-backed YAML section of a TrainConfig."""
    for kind in ('callbacks', 'algorithms', 'loggers'):
        for name, kwargs in getattr(config, kind).items():
            path = f'{kind}.{name}'
            check_arguments(lookup(kind, name, path), kwargs or {}, path)
    for name in config.loggers:
        check_installed(name)
    name, kwargs = named_entries(config.optimizer, 'optimizer')
    optimizer_class = lookup('optimizer', name, 'optimizer.name')
    check_arguments(optimizer_class, kwargs, 'optimizer', positional=('params',))
    check_optimizer_values(optimizer_class, kwargs)
    if config.scheduler is not None:
        name, kwargs = named_entries(config.scheduler, 'scheduler')
        check_arguments(lookup('scheduler', name, 'scheduler.name'), kwargs, 'scheduler')


def check_installed(logger: str) -> None:
    package = LOGGER_PACKAGES.get(logger)
    if package and importlib.util.find_spec(package) is None:
        raise ConfigError(f'loggers.{logger}: needs the {package} package, which is not installed; pip install '
                          f'{package}, or remove loggers.{logger}')


def check_optimizer_values(cls, kwargs: dict) -> None:
    """The optimizer built over one scalar parameter, so that its own checks of lr, betas, eps and weight decay speak
    now, in one line, not as a traceback when training starts (their types: ``check_arguments``)."""
    probe = {key: value for key, value in kwargs.items() if key not in ('fused', 'foreach')}  # kernels, not values
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **probe)
    except (ValueError, TypeError) as error:
        raise ConfigError(f'optimizer: {cls.__name__} refuses its arguments ({first_line(error)}); fix the '
                          f'optimizer keys') from None


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
