"""The Llama family's HF adapter: transformers' ``LlamaForCausalLM`` config.json <-> our LlamaConfig, and tensors.
Our Transformer uses HF's LlamaModel names, so conversion is one rename: HF puts ``model.`` before every
name but ``lm_head.weight``."""
import torch

from llmfoundry_ext.errors import CheckpointError
from llmfoundry_ext.model.llama import LlamaConfig

MODEL_TYPE = 'llama'
EXPORT_KEY = 'llmfoundry_ext'  # config.json's entry of ours: the RoPE range, and what the weights were trained for


def to_hf_name(name: str) -> str:
    return name if name == 'lm_head.weight' else f'model.{name}'


def from_hf_name(name: str) -> str:
    return name if name == 'lm_head.weight' else name.removeprefix('model.')


def to_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our tensors under HF's names."""
    return {to_hf_name(name): tensor for name, tensor in tensors.items()}


def from_hf(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF checkpoint's tensors under our names."""
    return {from_hf_name(name): tensor for name, tensor in tensors.items()}


def hf_config(config: LlamaConfig, dtype: torch.dtype) -> dict:
    """transformers' LlamaConfig (config.json) for our architecture."""
    rope_scaling = None
    if config.rope_scaling_factor != 1.0:
        rope_scaling = {'rope_type': 'llama3', 'factor': config.rope_scaling_factor,
                        'low_freq_factor': config.rope_low_freq_factor,
                        'high_freq_factor': config.rope_high_freq_factor,
                        'original_max_position_embeddings': config.rope_original_max_seq_len}
    return {
        'architectures': ['LlamaForCausalLM'], 'model_type': MODEL_TYPE, 'hidden_act': 'silu',
        'hidden_size': config.dim, 'intermediate_size': config.ffn_dim, 'num_hidden_layers': config.n_layers,
        'num_attention_heads': config.n_heads, 'num_key_value_heads': config.n_kv_heads,
        'head_dim': config.head_dim, 'vocab_size': config.vocab_size, 'rms_norm_eps': config.norm_eps,
        'rope_theta': config.rope_theta, 'rope_scaling': rope_scaling,
        'max_position_embeddings': position_range(config), 'tie_word_embeddings': config.tie_embeddings,
        'attention_bias': False, 'mlp_bias': False, 'torch_dtype': str(dtype).removeprefix('torch.'),
        EXPORT_KEY: {'max_seq_len': config.max_seq_len},
    }


def position_range(config: LlamaConfig) -> int:
    """config.json's max_position_embeddings: the RoPE range trained for (``max_seq_len``), or, where Llama 3's
    scaling stretches its original context past that, the range it stretches to (original x factor): transformers
    takes the range to lie beyond the scaling's original context and warns on every load otherwise (Llama 3.2-1B's
    own config: 131,072 over 8,192). What the weights were trained for is the export's ``llmfoundry_ext`` entry
    (``weights.save_hf``)."""
    if config.rope_scaling_factor == 1.0:
        return config.max_seq_len
    return max(config.max_seq_len, round(config.rope_original_max_seq_len * config.rope_scaling_factor))


def config_from_hf(hf: dict) -> LlamaConfig:
    """Our LlamaConfig from an HF Llama (or Mixtral) config.json (transformers 4's rope_theta/rope_scaling or 5's
    rope_parameters)."""
    rope = {**(hf.get('rope_parameters') or {}), **(hf.get('rope_scaling') or {})}
    rope_type = rope.get('rope_type', rope.get('type', 'default'))
    if rope_type not in ('default', 'llama3'):
        raise CheckpointError(f"config.json: rope type {rope_type!r} is not supported (only 'default' and 'llama3')")
    scaled = rope_type == 'llama3'
    return LlamaConfig(
        dim=hf['hidden_size'], n_layers=hf['num_hidden_layers'], n_heads=hf['num_attention_heads'],
        n_kv_heads=hf.get('num_key_value_heads', hf['num_attention_heads']), ffn_dim=hf['intermediate_size'],
        vocab_size=hf['vocab_size'], norm_eps=hf['rms_norm_eps'],
        rope_theta=hf.get('rope_theta', rope.get('rope_theta', 10000.0)),
        rope_scaling_factor=rope['factor'] if scaled else 1.0,
        rope_low_freq_factor=rope['low_freq_factor'] if scaled else 1.0,
        rope_high_freq_factor=rope['high_freq_factor'] if scaled else 4.0,
        rope_original_max_seq_len=rope['original_max_position_embeddings'] if scaled else 8192,
        max_seq_len=(hf.get(EXPORT_KEY) or {}).get('max_seq_len', hf.get('max_position_embeddings', 8192)),
        tie_embeddings=hf.get('tie_word_embeddings', False))
