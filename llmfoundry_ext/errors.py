"""Errors a run stops with that a user can act on: one line, printed by ``train.main`` without a traceback."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (a non-finite loss, a full disk, no complete checkpoint to resume from); the
    message is one line saying what happened and what to do."""
