"""``composer -n N tests/meta_on_cpu_worker.py RUN [RUN ...]``: tests/training_runs_worker.py's runs with Composer's
meta build materialised on the CPU: its ``meta_init`` names ``cuda`` (Composer 0.32), which this machine lacks."""
import sys

import torch

from tests.training_runs_worker import train_each

to_empty = torch.nn.Module.to_empty


def to_empty_here(module: torch.nn.Module, *, device, recurse: bool = True) -> torch.nn.Module:
    return to_empty(module, device='cpu' if str(device) == 'cuda' else device, recurse=recurse)


if __name__ == '__main__':
    torch.nn.Module.to_empty = to_empty_here
    train_each(sys.argv[1:])
