"""Random-token data for benchmarks and profiles."""
import numpy as np

from llmfoundry_ext.measure.synthetic import random_windows


def test_synthetic_documents_have_the_asked_mean_length_and_no_stray_eos():
    plain = list(random_windows(4, 4096, 1000, 999, 0))
    assert all(not (w == 999).any() and w.max() < 1000 for w in plain)
    windows = np.concatenate(list(random_windows(4, 4096, 1000, 999, 128)))
    assert abs(len(windows) / (windows == 999).sum() - 128) < 128 * 0.15
    again = np.concatenate(list(random_windows(4, 4096, 1000, 999, 128)))
    assert np.array_equal(windows, again)
