"""The exceptions seqloader raises: one hierarchy, exported at top level."""


class FormatError(ValueError):
    """A file is not a seqloader database this version can read."""


class IncompleteError(FormatError):
    """A database whose writer has not finished (crashed, killed, or still running)."""


class RecordError(RuntimeError):
    """Processing one record failed; carries the record index and the original traceback."""

    def __init__(self, message: str, index: int, tb: str):
        super().__init__(message)
        self.index = index
        self.tb = tb


class WorkerError(RuntimeError):
    """A worker failed; the message names the worker and the record, and ends with the
    worker's traceback."""


class WorkerDiedError(RuntimeError):
    """A worker process exited unexpectedly (killed, out of memory, crashed)."""


class BadImageError(ValueError):
    """An undecodable source image, raised in ``strict`` mode."""
