"""Importing the trainer skips what no run uses, and each skipped package still works when asked for later; what does
not train imports no Composer; Composer's CPU name comes from /proc/cpuinfo, as py-cpuinfo gives it, without a
subprocess."""
import subprocess
import sys

import pytest

from tests.conftest import REPO

# the heaviest packages each deferral keeps out (torchmetrics' text metrics: sklearn via transformers' AutoModel;
# its plots: matplotlib; its audio: scipy; Composer's PEFT and MosaicML-platform integrations: peft, prompt_toolkit;
# streaming's loader and text datasets: transformers)
SKIPPED = ('matplotlib', 'peft', 'prompt_toolkit', 'scipy', 'sklearn', 'transformers')


def test_the_trainer_imports_none_of_the_skipped_packages(trainer_import):
    assert [name for name in trainer_import['modules'] if name.split('.')[0] in SKIPPED] == []
    assert 'mcli' in trainer_import['modules']  # loaded on first use: Composer's MosaicML logger holds it


def test_evaluation_checkpoint_conversion_and_data_prep_import_no_composer():
    script = ('import sys, scripts.evaluate, scripts.convert_checkpoint, data_prep.convert_to_mds; '
              'print([name for name in ("composer", "torchmetrics") if name in sys.modules])')
    out = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout == '[]\n'


def test_each_skipped_package_works_when_used():
    import composer.loggers.mosaicml_logger
    import composer.models.huggingface
    import torchmetrics.utilities.imports

    from llmfoundry_ext.startup import StartupFinder
    assert isinstance(sys.meta_path[0], StartupFinder)
    assert composer.loggers.mosaicml_logger.mcli.get_run.__name__ == 'get_run'
    assert composer.models.huggingface.peft_installed is False
    assert not torchmetrics.utilities.imports._TRANSFORMERS_GREATER_EQUAL_4_4
    import scipy.signal
    from transformers import AutoModel, BatchEncoding
    assert scipy.signal.windows.hamming(3).tolist() == pytest.approx([0.08, 1.0, 0.08])
    assert AutoModel.__name__ == 'AutoModel'
    assert BatchEncoding.__module__ == 'transformers.tokenization_utils_base'  # the real one, not streaming's stand-in


def test_composer_reads_the_cpu_name_without_a_subprocess(monkeypatch):
    import cpuinfo
    from composer.utils import collect_env
    expected = cpuinfo.get_cpu_info()['brand_raw']
    monkeypatch.setattr(subprocess, 'Popen', None)  # any subprocess would fail
    assert collect_env.get_cpu_model() == expected
