"""Random-token data for benchmarks and profiles."""
import numpy as np
from omegaconf import OmegaConf

from llmfoundry_ext.measure.synthetic import random_windows, synthetic_run_yaml


def test_synthetic_documents_have_the_asked_mean_length_and_no_stray_eos():
    plain = list(random_windows(4, 4096, 1000, 999, 0))
    assert all(not (w == 999).any() and w.max() < 1000 for w in plain)
    windows = np.concatenate(list(random_windows(4, 4096, 1000, 999, 128)))
    assert abs(len(windows) / (windows == 999).sum() - 128) < 128 * 0.15
    again = np.concatenate(list(random_windows(4, 4096, 1000, 999, 128)))
    assert np.array_equal(windows, again)


def test_the_synthetic_run_keeps_the_yamls_loader_workers(tmp_path):
    """A benchmark of a shipped YAML reads its batches as the YAML's run would: in its 4 workers, 2 batches ahead."""
    path = synthetic_run_yaml('yamls/mixtral8x7b.yaml', ['global_batch_size=1', 'max_seq_len=64'], str(tmp_path), 2)
    train = OmegaConf.load(path).data.train
    assert (train.num_workers, train.prefetch_factor) == (4, 2)
    assert OmegaConf.to_container(train.streams) == {'synthetic': {'local': f'{tmp_path}/tokens'}}
