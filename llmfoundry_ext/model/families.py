"""Model families: ``model.family`` in the YAML -> its architecture config, presets, module and HF adapter.

A family's module is built as ``module(architecture, kernels)`` and uses HF's parameter names for its family where
it can, so its adapter (``hf``: ``to_hf``, ``from_hf`` for tensors, ``hf_config``, ``config_from_hf``,
``MODEL_TYPE``) is mostly a rename plus the config.json translation.
"""
from dataclasses import dataclass
from types import ModuleType

from torch import nn

from llmfoundry_ext.model import llama, llama_hf, mixtral, mixtral_hf


@dataclass(frozen=True)
class Family:
    name: str
    config: type              # the architecture dataclass
    presets: dict             # preset name -> architecture
    module: type[nn.Module]   # module(architecture, kernels)
    hf: ModuleType            # the HF adapter


FAMILIES = {family.name: family for family in (
    Family('llama', llama.LlamaConfig, llama.PRESETS, llama.Transformer, llama_hf),
    Family('mixtral', mixtral.MixtralConfig, mixtral.PRESETS, mixtral.Mixtral, mixtral_hf),
)}
