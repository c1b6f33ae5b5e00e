"""Under torchrun's elastic agent, one line after a restarted worker group's first batch: the world it restarted at
and the one before, the batch the group before got to, the checkpoint resumed from, the batches trained again and
the time from the last batch before to the first one now. Our own code: torchrun restarts the workers and Composer
resumes, and neither says what the restart cost.

Global rank 0 keeps ``elastic-progress.json`` in the checkpoint folder (its last batch, the time and the world, written
atomically after each batch); a restarted group reads it before its first batch."""
import json
import os
import time
from typing import Optional

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from llmfoundry_ext.atomic import write_atomically
from llmfoundry_ext.machine import Machine

PROGRESS = 'elastic-progress.json'


class RecoveryLine(Callback):
    def __init__(self, folder: str, machine: Machine):
        self.path, self.machine = os.path.join(folder, PROGRESS), machine
        self.before: Optional[dict] = None
        self.resumed = 0

    def fit_start(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() == 0 and os.path.exists(self.path):
            with open(self.path) as file:
                self.before = json.load(file)
        self.resumed = int(state.timestamp.batch)

    def batch_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        progress = {'batch': int(state.timestamp.batch), 'time': time.time(), 'world': self.machine.world}
        if self.before is not None:
            print(recovery_line(self.before, self.resumed, progress, self.machine), flush=True)
            self.before = None
        write_atomically(self.path, json.dumps(progress))


def recovery_line(before: dict, resumed: int, now: dict, machine: Machine) -> str:
    """'recovery: restart 1 of 3 at 2 ranks on 1 node (before: 4 ranks on 2 nodes, to batch 17); resumed from the
    checkpoint of batch 15, 2 batches trained again; batch 16 trained 21.4 s after batch 17 was'."""
    again = max(0, before['batch'] - resumed)
    return (f"recovery: restart {machine.restart} of {machine.max_restarts} at {now['world']} (before: "
            f"{before['world']}, to batch {before['batch']}); resumed from "
            + (f'the checkpoint of batch {resumed}' if resumed else 'scratch')
            + f", {again} batch{'es' if again != 1 else ''} trained again; batch {now['batch']} trained "
            f"{now['time'] - before['time']:.1f} s after batch {before['batch']} was")
