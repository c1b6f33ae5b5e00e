"""Errors a user can act on: one line naming the problem and the fix, printed without a traceback."""

RESUBMIT = 'Re-submit the job to resume from its last checkpoint.'  # the fix where a job over nodes ends


class ConfigError(ValueError):
    """A user error in the run configuration or its environment; one line naming the key and the fix."""


class CheckpointError(ValueError):
    """Weights or a checkpoint that do not fit: one line naming the tensor or file and what was expected."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (a non-finite loss, a full disk, no complete checkpoint to resume from); the
    message is one line saying what happened and what to do."""
