"""The evaluation set reads the same samples at every evaluation; the training set moves on each epoch."""
from llmfoundry_ext.config import LoaderConfig, StreamConfig
from llmfoundry_ext.data.dataloader import build_dataset


def first_samples(dataset, count: int) -> list[int]:
    samples = iter(dataset)
    return [next(samples)['sample_id'] for _ in range(count)]


def test_every_pass_over_the_held_out_set_reads_the_same_samples_and_training_passes_do_not(tiny_streams):
    loader = LoaderConfig(streams={name: StreamConfig(local=path, proportion=share)
                                   for (name, path), share in zip(tiny_streams.items(), (0.7, 0.3))}, shuffle_seed=5)
    held_out = build_dataset(loader, device_batch_size=8, held_out=True)
    passes = [first_samples(held_out, 64) for _ in range(3)]
    assert passes[0] == passes[1] == passes[2]
    assert 0 < sum(sample >= 400 for sample in passes[0]) < 64  # a mix of both streams (b's ids start at 400)
    training = build_dataset(loader, device_batch_size=8)
    assert first_samples(training, 64) == passes[0]  # both start at epoch 0 ...
    assert first_samples(training, 64) != passes[0]  # ... and training's next pass is epoch 1
