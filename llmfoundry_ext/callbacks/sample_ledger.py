"""Append, per rank and batch, the loss and the ids of the samples trained on: a record to audit resumption."""
import json
import os

from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist


class SampleLedger(Callback):
    """Writes ``{folder}/ledger-rank{r}.jsonl``: one line per batch, {"batch", "loss", "sample_ids"}.

    After a crash, batches past the last checkpoint appear twice; the later line is the one that counts.
    ``folder`` may use ``{run_name}``.
    """

    def __init__(self, folder: str):
        self.folder = folder
        self.path = None

    def fit_start(self, state: State, logger: Logger) -> None:
        folder = self.folder.format(run_name=state.run_name)
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f'ledger-rank{dist.get_global_rank()}.jsonl')

    def batch_end(self, state: State, logger: Logger) -> None:
        loss = state.loss['total'] if isinstance(state.loss, dict) else state.loss
        line = {'batch': int(state.timestamp.batch), 'loss': float(loss.detach()),
                'sample_ids': state.batch['sample_ids'].tolist()}
        with open(self.path, 'a') as file:
            file.write(json.dumps(line) + '\n')
            file.flush()


def read_ledger(path: str) -> dict[int, dict]:
    """batch -> its last recorded line (a torn last line from a kill is ignored)."""
    entries = {}
    with open(path) as file:
        for text in file:
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            entries[line['batch']] = line
    return entries
