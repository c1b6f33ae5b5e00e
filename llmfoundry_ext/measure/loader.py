"""The training loader's throughput (``scripts/measure_loader.py``: what it measures is there)."""
import json
import tempfile
import time

import numpy as np

from llmfoundry_ext.config import LoaderConfig, StreamConfig
from llmfoundry_ext.data.collate import Collator
from llmfoundry_ext.data.dataloader import build_dataloader
from llmfoundry_ext.data.mds import write_mds

H100_1B_TOKENS_PER_SECOND = 50_000
TARGET = 20 * H100_1B_TOKENS_PER_SECOND


def time_loader(folder: str, seq_len: int, batch_size: int, batches: int, workers: int) -> float:
    """Tokens per second over ``batches`` batches, after 5 warm-up batches."""
    loader = LoaderConfig(streams={'bench': StreamConfig(local=folder)}, num_workers=workers,
                          prefetch_factor=4 if workers else None, shuffle_seed=workers)
    data = build_dataloader(loader, batch_size, Collator(max_seq_len=seq_len)).dataloader
    iterator = iter(data)
    for _ in range(5):
        next(iterator)
    start = time.perf_counter()
    tokens = sum(next(iterator)['input_ids'].numel() for _ in range(batches))
    return tokens / (time.perf_counter() - start)


def loader_rows(args) -> int:
    """``scripts/measure_loader.py``'s arguments -> tokens/s of the loader at 0, 1 and 2 workers over random windows, a
    table and optionally JSON."""
    rng = np.random.default_rng(0)
    samples = args.batch_size * (args.batches + 10)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        folder = f'{root}/mds'
        write_mds(folder, (rng.integers(0, 128256, args.seq_len, dtype=np.uint32) for _ in range(samples)),
                  {'source': 'bench', 'window': args.seq_len})
        for workers in (0, 1, 2):
            speed = time_loader(folder, args.seq_len, args.batch_size, args.batches, workers)
            per_worker = speed / max(workers, 1)
            rows.append({'workers': workers, 'tokens_per_second': round(speed),
                         'tokens_per_second_per_worker': round(per_worker),
                         'x_h100_1b': per_worker / H100_1B_TOKENS_PER_SECOND})
    print(f"{'workers':>7} {'tokens/s':>12} {'per worker':>12} {'x H100 1B':>10}  (target >= {TARGET:,} per worker)")
    for row in rows:
        print(f"{row['workers']:>7} {row['tokens_per_second']:>12,} {row['tokens_per_second_per_worker']:>12,} "
              f"{row['x_h100_1b']:>10.1f}")
    if args.json:
        with open(args.json, 'w') as file:
            json.dump({'seq_len': args.seq_len, 'batch_size': args.batch_size, 'rows': rows}, file, indent=2)
    return 0
