"""Random-token data for a run's YAML: what a profile or a benchmark of the model needs, without a dataset."""
import numpy as np
from omegaconf import OmegaConf

from llmfoundry_ext.config import apply_preset, read_yaml
from llmfoundry_ext.data.mds import write_mds

LLAMA3_EOS = 128001  # <|end_of_text|>
LOADER_KEYS = ('num_workers', 'prefetch_factor')  # the YAML's: its run reads batches ahead in worker processes


def synthetic_run_yaml(yaml_path: str, overrides: list[str], folder: str, batches: int,
                       mean_document_tokens: int = 0) -> str:
    """The run's YAML with its data replaced by random tokens (enough for ``batches`` steps) read by its loader's
    workers, no downstream tasks, no checkpoints and no loggers. With ``mean_document_tokens``, EOS ends documents
    of random lengths (geometric, that mean), so document masking has documents to keep apart. The tokens depend
    only on the arguments, so rows of a benchmark train on the same data. Returns the YAML's path."""
    raw = read_yaml(yaml_path, overrides)
    apply_preset(raw)  # the vocabulary may come from the preset
    vocab = raw['model']['vocab_size']
    eos = min(LLAMA3_EOS, vocab - 1)
    windows = random_windows(batches * raw['global_batch_size'], raw['max_seq_len'], vocab, eos, mean_document_tokens)
    write_mds(f'{folder}/tokens', windows, {'source': 'synthetic', 'window': raw['max_seq_len']})
    data = raw.get('data', {})
    loader = {key: value for key, value in data.get('train', {}).items() if key in LOADER_KEYS}
    raw['data'] = {'train': {'streams': {'synthetic': {'local': f'{folder}/tokens'}}, **loader},
                   'document_masking': data.get('document_masking', False), 'eos_token_id': eos}
    raw['checkpoint'] = {'save_folder': None, 'autoresume': False}
    raw['callbacks'] = {name: args for name, args in (raw.get('callbacks') or {}).items() if name != 'stop_after'}
    raw['loggers'] = {}
    raw['downstream'] = None  # its tasks read text through a tokenizer; synthetic tokens have none
    path = f'{folder}/run.yaml'
    OmegaConf.save(raw, path)
    return path


def random_windows(count: int, window: int, vocab: int, eos: int, mean_document_tokens: int):
    """``count`` uint32 windows of random non-EOS tokens, seeded; EOS after each document if a mean is given."""
    rng = np.random.default_rng(0)
    for _ in range(count):
        tokens = rng.integers(0, vocab - 1, window, dtype=np.uint32)
        tokens[tokens >= eos] += 1  # every id but EOS
        if mean_document_tokens:
            ends = np.cumsum(rng.geometric(1 / mean_document_tokens, window)) - 1
            tokens[ends[ends < window]] = eos
        yield tokens
