"""What every process of ours skips of its dependencies' start-up: imports no run uses, and py-cpuinfo's subprocess.

Composer 0.32.1 imports far more than a run uses, and each process of a launch pays for it: importing the trainer
took ~7.8 s of CPU (2-core machine, torch 2.11), ~3 s of it for
  - torchmetrics' text metrics (BERTScore imports transformers' ``AutoModel``: with it sklearn, pandas, accelerate),
    its plots (matplotlib) and the ``scipy.signal`` alias its audio metrics want;
  - Composer's optional integrations: PEFT (``composer.models.huggingface``), transformers' BERT for the
    gated-linear-units algorithm, and the MosaicML platform client ``mcli`` (prompt_toolkit) of its MosaicML logger;
  - sklearn, which transformers imports whenever it is installed (lm-evaluation-harness installs it).
No run builds those metrics, fine-tunes with PEFT, edits BERT or logs to the MosaicML platform. Installed on
importing the package (``llmfoundry_ext/__init__``, before any of its modules imports Composer), this module makes
them look absent to the module that probes for them while that module executes, or loads them on first use; nothing
is changed on disk, and a package a run's own code imports later (transformers for downstream tasks, matplotlib for
plots) imports as usual. Composer has no setting for any of it.

mosaicml-streaming imports transformers (~0.6 s of CPU a process) for two names its loader checks batches against
(``BatchEncoding``, ``BatchFeature``: dicts here) and the tokenizer of its C4 and Pile datasets: while streaming
executes it gets stand-ins for those (``STAND_INS_WHILE_IMPORTING``), removed once it has, so that transformers
itself imports as usual where a run uses it.

Composer also asks py-cpuinfo for the CPU's name (checkpoint metadata) once a process, which starts a Python
subprocess (~1.2 s of CPU); on Linux the same name is /proc/cpuinfo's ``model name``.
"""
import contextlib
import functools
import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Iterator

# module -> packages that look absent while it executes (each probes with find_spec or a guarded import)
ABSENT_WHILE_IMPORTING = {
    'composer.models.huggingface': ('peft',),
    'composer.algorithms.gated_linear_units.gated_linear_units': ('transformers',),
    # transformers 4.x probes with find_spec; 5.x (the GPU machines' 5.17) imports sklearn all the same
    'transformers.utils.import_utils': ('sklearn',),
}
# torchmetrics' answers for its optional dependencies, read by its modules as they import
TORCHMETRICS_FLAGS = ('_TRANSFORMERS_AVAILABLE', '_TRANSFORMERS_GREATER_EQUAL_4_4',
                      '_TRANSFORMERS_GREATER_EQUAL_4_10', '_MATPLOTLIB_AVAILABLE', '_SCIPY_AVAILABLE',
                      '_SCIPY_GREATER_EQUAL_1_8', '_SCIPI_AVAILABLE')
LOADED_ON_FIRST_USE = ('mcli',)


class BatchEncoding(dict):
    """Stands in for transformers' class of that name in streaming's loader (whose batches here are dicts)."""


class BatchFeature(dict):
    """Likewise."""


# module -> modules (with the names it takes from them) that stand in while it executes
STAND_INS_WHILE_IMPORTING = {'streaming': {
    'transformers': {}, 'transformers.models': {}, 'transformers.models.auto': {},
    'transformers.feature_extraction_utils': {'BatchFeature': BatchFeature},
    'transformers.tokenization_utils_base': {'BatchEncoding': BatchEncoding},
    'transformers.models.auto.tokenization_auto': {'AutoTokenizer': None},  # its C4 and Pile datasets' (unused)
}}


@contextlib.contextmanager
def standing_in(modules: dict) -> Iterator[None]:
    """``modules`` (name -> attributes) in ``sys.modules`` inside, unless their package is imported already."""
    if not modules or any(name.split('.')[0] in sys.modules for name in modules):
        yield
        return
    for name, attributes in modules.items():
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__path__ = []  # a package: its stand-in submodules import under it
        vars(sys.modules[name]).update(attributes)
    try:
        yield
    finally:
        for name in modules:
            del sys.modules[name]


@contextlib.contextmanager
def absent(packages) -> Iterator[None]:
    """``packages`` not imported yet look uninstalled (``import`` fails, ``find_spec`` answers None) inside."""
    hidden = [name for name in packages if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in hidden:
            del sys.modules[name]


def torchmetrics_without_optional_dependencies(module) -> None:
    """After ``torchmetrics.utilities.imports`` executes: its flags say transformers, matplotlib and SciPy are
    absent."""
    for flag in TORCHMETRICS_FLAGS:
        setattr(module, flag, False)


def scipy_absent_to_torchmetrics(module) -> None:
    """After ``lightning_utilities.core.imports`` executes: its cached ``package_available('scipy')``, which
    torchmetrics' ``__init__`` asks before importing ``scipy.signal``, answers False (torchmetrics alone uses it)."""
    with absent(['scipy']):
        module.package_available('scipy')


def cpu_model_from_proc(module) -> None:
    """After ``composer.utils.collect_env`` executes: its ``get_cpu_model`` reads /proc/cpuinfo, py-cpuinfo's
    subprocess only where that has no ``model name`` line; once a process, as Composer's own (every checkpoint asks)."""
    subprocess_lookup = module.get_cpu_model

    @functools.lru_cache(maxsize=1)
    def get_cpu_model() -> str:
        try:
            with open('/proc/cpuinfo') as file:
                names = [line.split(':', 1)[1].strip() for line in file if line.startswith('model name')]
        except OSError:
            names = []
        return names[0] if names else subprocess_lookup()

    module.get_cpu_model = get_cpu_model


AFTER_IMPORT = {
    'torchmetrics.utilities.imports': torchmetrics_without_optional_dependencies,
    'lightning_utilities.core.imports': scipy_absent_to_torchmetrics,
    'composer.utils.collect_env': cpu_model_from_proc,
}
ADJUSTED = frozenset({*ABSENT_WHILE_IMPORTING, *STAND_INS_WHILE_IMPORTING, *AFTER_IMPORT, *LOADED_ON_FIRST_USE})


class AdjustedLoader(importlib.abc.Loader):
    """The module's own loader, with ``ABSENT_WHILE_IMPORTING`` and ``STAND_INS_WHILE_IMPORTING`` around its execution
    and ``AFTER_IMPORT`` after."""

    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        stand_ins = STAND_INS_WHILE_IMPORTING.get(self.name, {})
        with absent(ABSENT_WHILE_IMPORTING.get(self.name, ())), standing_in(stand_ins):
            self.loader.exec_module(module)
        if self.name in AFTER_IMPORT:
            AFTER_IMPORT[self.name](module)


class StartupFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: finds the modules named above as the other finders do, then adjusts their loader."""

    def find_spec(self, name, path, target=None):
        if name not in ADJUSTED:  # every import asks: one set lookup
            return None
        spec = next(filter(None, (finder.find_spec(name, path, target) for finder in sys.meta_path
                                  if finder is not self and hasattr(finder, 'find_spec'))), None)
        if spec is None or spec.loader is None:
            return spec
        lazy = name in LOADED_ON_FIRST_USE
        spec.loader = importlib.util.LazyLoader(spec.loader) if lazy else AdjustedLoader(spec.loader, name)
        return spec


def install() -> None:
    """Idempotent; modules imported before it are left as they are."""
    if not any(isinstance(finder, StartupFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, StartupFinder())
