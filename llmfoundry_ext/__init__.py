"""llmfoundry_ext: YAML-driven Llama pretraining on Composer and mosaicml-streaming."""
import os

from llmfoundry_ext import startup

ALLOCATOR_SETTINGS = ('PYTORCH_ALLOC_CONF', 'PYTORCH_CUDA_ALLOC_CONF', 'PYTORCH_HIP_ALLOC_CONF')


def use_expandable_segments() -> None:
    """PyTorch's allocator in growable segments (``expandable_segments``, as torchtitan's launcher sets it) unless
    the user gave allocator settings of their own. PyTorch reads them when it is imported, so this runs on importing
    the package, before any of its modules imports torch (``train.py`` and the scripts import the package first).
    Without it llama1b.yaml on one H100 ran out of memory at its second micro-batch with 6.9 GiB cached in blocks too
    small for the 7.8 GiB of logits; tokens/s is the same (docs/performance.md)."""
    if not any(name in os.environ for name in ALLOCATOR_SETTINGS):
        os.environ['PYTORCH_ALLOC_CONF'] = 'expandable_segments:True'


use_expandable_segments()
startup.install()
