"""The Mixtral family's HF adapter: transformers' ``MixtralForCausalLM`` config.json <-> our MixtralConfig, and
tensors. HF's checkpoints hold each expert's projections apart (``block_sparse_moe.experts.{e}.w1.weight``
[F, dim]); ours stacks them (``mlp.experts.w1`` [E, F, dim]) for the grouped GEMM, and the router is
``mlp.gate`` for HF's ``block_sparse_moe.gate``. Everything else is named as in Llama."""
import dataclasses
import re
from collections import defaultdict

import torch

from llmfoundry_ext.errors import CheckpointError
from llmfoundry_ext.model import llama_hf
from llmfoundry_ext.model.mixtral import MixtralConfig

MODEL_TYPE = 'mixtral'
HF_EXPERT = re.compile(r'model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight')
OUR_EXPERTS = re.compile(r'layers\.(\d+)\.mlp\.experts\.(w[123])')
HF_ROUTER, OUR_ROUTER = '.block_sparse_moe.gate.', '.mlp.gate.'


def to_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors under HF's names, the stacked experts split into one tensor per expert."""
    hf = {}
    for name, tensor in tensors.items():
        experts = OUR_EXPERTS.fullmatch(name)
        if experts:
            layer, projection = experts.groups()
            for expert, weight in enumerate(tensor.unbind(0)):
                hf[f'model.layers.{layer}.block_sparse_moe.experts.{expert}.{projection}.weight'] = weight
        else:
            hf[llama_hf.to_hf_name(name.replace(OUR_ROUTER, HF_ROUTER))] = tensor
    return hf


def from_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF Mixtral checkpoint's tensors under our names, each layer's experts stacked in expert order."""
    ours, experts = {}, defaultdict(dict)
    for name, tensor in tensors.items():
        expert = HF_EXPERT.fullmatch(name)
        if expert:
            layer, index, projection = expert.groups()
            experts[f'layers.{layer}.mlp.experts.{projection}'][int(index)] = tensor
        else:
            ours[llama_hf.from_hf_name(name).replace(HF_ROUTER, OUR_ROUTER)] = tensor
    for name, by_index in experts.items():
        if sorted(by_index) != list(range(len(by_index))):
            missing = min(set(range(max(by_index) + 1)) - set(by_index))
            raise CheckpointError(f'checkpoint has no expert {missing} for {name}: the checkpoint is incomplete')
        ours[name] = torch.stack([by_index[index] for index in range(len(by_index))])
    return ours


def hf_config(config: MixtralConfig, dtype: torch.dtype) -> dict:
    """transformers' MixtralConfig (config.json) for our architecture."""
    return {**llama_hf.hf_config(config, dtype), 'architectures': ['MixtralForCausalLM'], 'model_type': MODEL_TYPE,
            'num_local_experts': config.n_experts, 'num_experts_per_tok': config.experts_per_token,
            'router_aux_loss_coef': config.router_aux_loss_coef, 'sliding_window': None}


def config_from_hf(hf: dict) -> MixtralConfig:
    """Our MixtralConfig from an HF Mixtral config.json (full attention only)."""
    window = hf.get('sliding_window')
    if window is not None and window < hf.get('max_position_embeddings', 32768):
        raise CheckpointError(f'config.json: sliding_window {window} is not supported (full attention only)')
    llama = llama_hf.config_from_hf(hf)
    return MixtralConfig(**dataclasses.asdict(llama), n_experts=hf['num_local_experts'],
                         experts_per_token=hf['num_experts_per_tok'],
                         router_aux_loss_coef=hf.get('router_aux_loss_coef', 0.001))  # HF's default
