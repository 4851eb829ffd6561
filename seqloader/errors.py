"""The exceptions seqloader raises: one hierarchy, exported at top level.

Every class derives from :class:`SeqloaderError` and from the built-in class it was
before the hierarchy existed (``ValueError``, ``RuntimeError``, ``OSError``,
``TimeoutError``), so ``except`` clauses written against those keep working::

    SeqloaderError
      FormatError (ValueError)          IncompleteError, EmptyDatabaseError,
                                        DamagedArchiveError, UnsafePickleError
      NotFoundError (FileNotFoundError) a database, split, source or labels file is missing
      OutputExistsError (FileExistsError)  an output is in the way
      MissingExtraError (ImportError)   an optional extra (e.g. remote) is not installed
      NoRecordsError (ValueError)
      BadImageError (ValueError)
      RemoteError (OSError)             a remote read failed for good; by cause:
        RemoteTimeoutError (TimeoutError)     no answer within the time budget
        RemoteUnreachableError                connection refused / reset / DNS
        RemoteAccessError (PermissionError)   401/403: credentials or permissions
        RemoteNotFoundError (NotFoundError)   404: no such bucket, key or split
        RemoteChangedError                    the file changed since it was opened
        RemoteDataError                       bytes that fail the format's checks
      DeviceError (RuntimeError)        decode="gpu" cannot run here (torchvision, nvJPEG, memory)
      WorkerError (RuntimeError)        the work of the worker pool failed
        RecordError                     one record / datapoint failed (any num_workers)
        WorkerDiedError                 a worker process died
          WorkerTimeoutError (TimeoutError)   a worker sent nothing for `timeout` s

NOTE [ one error contract ]: a function that fails on a record raises
:class:`RecordError` whatever the number of workers (0 included): it carries the record
``index``, its source ``path`` (None when unknown), the original exception's type name
(``exc_type``) and message (``exc_message``), the traceback where it was raised
(``worker_traceback``, a string) and the ``worker`` (None in the caller's process).  In
the caller it is raised *from* a :class:`RemoteTraceback` holding that traceback, as
:mod:`concurrent.futures` does, so the worker's frames show under it.
"""
from __future__ import annotations

import traceback
from typing import Any

__all__ = ["SeqloaderError", "FormatError", "IncompleteError", "EmptyDatabaseError",
           "DamagedArchiveError", "NotFoundError", "OutputExistsError", "MissingExtraError",
           "NoRecordsError", "BadImageError", "RemoteError", "RemoteTimeoutError",
           "RemoteUnreachableError", "RemoteAccessError", "RemoteNotFoundError",
           "RemoteChangedError", "RemoteDataError", "DeviceError", "WorkerError", "RecordError",
           "WorkerDiedError", "WorkerTimeoutError", "RemoteTraceback", "USER_ERRORS", "one_line"]


class SeqloaderError(Exception):
    """Base of every exception seqloader raises on purpose."""


class FormatError(SeqloaderError, ValueError):
    """A file is not a seqloader database this version can read."""


class IncompleteError(FormatError):
    """A database whose writer has not finished (crashed, killed, or still running)."""


class EmptyDatabaseError(FormatError):
    """A complete database with no records (older writers left one when every source
    image of a split was undecodable); nothing can be read from it."""


class DamagedArchiveError(FormatError):
    """A source archive (tar, gzip, webdataset shard, foreign LMDB) is damaged or cut
    short: the message names the archive, the byte offset and the last member read."""


class NotFoundError(SeqloaderError, FileNotFoundError):
    """What was named does not exist: a database or one of its splits, a source, a dataset
    folder, a labels file.  The message names the path and what to give instead."""


class OutputExistsError(SeqloaderError, FileExistsError):
    """An output is in the way: it exists and this command did not write it (or wrote it
    with other settings, or in another layout).  The message says how to proceed
    (``--overwrite``, the same command as before, or another output)."""


class MissingExtraError(SeqloaderError, ImportError):
    """An optional extra is needed and not installed; the message names the install
    command (``pip install 'seqloader[remote]'``)."""


class OutputError(SeqloaderError, OSError):
    """An output cannot be created where it was asked (a missing, read-only or special
    folder).  The message names the path, the system's reason and what to give instead."""


class NoRecordsError(SeqloaderError, ValueError):
    """Not one source image of a split could be stored (all undecodable or unreadable):
    no database is left, only its bad-files report."""


class BadImageError(SeqloaderError, ValueError):
    """An undecodable source image, raised in ``strict`` mode."""


class RemoteError(SeqloaderError, OSError):
    """A remote read failed for good (after retries, or a permanent error).  The
    same class whatever ``num_workers`` (NOTE [ one error contract ]); its message
    names the URL without credentials or query.  ``reason``: ``"refused"`` (connection
    refused), ``"no credentials"`` (none found) or None (the class says it all)."""

    reason: str | None = None


class RemoteTimeoutError(RemoteError, TimeoutError):
    """The server did not answer (or stopped sending) within the time budget
    (``RemoteOptions.connect_timeout`` / ``timeout`` / ``deadline``)."""


class RemoteUnreachableError(RemoteError, ConnectionError):
    """The server could not be reached for the whole ``deadline`` (refused, reset,
    unknown host, 5xx)."""


class RemoteAccessError(RemoteError, PermissionError):
    """401/403: the credentials are wrong or lack permission."""


class RemoteNotFoundError(RemoteError, NotFoundError):
    """404: no such bucket, key or database split."""


class RemoteChangedError(RemoteError):
    """A remote file differs from the one whose metadata was read (ETag, size or
    content)."""


class RemoteDataError(RemoteError):
    """Bytes read over the network fail the format's checks (a record that does not
    unpack, or whose label differs from the metadata's)."""


class DeviceError(SeqloaderError, RuntimeError):
    """The device cannot decode here: torchvision missing or older than 0.19, no nvJPEG,
    the device out of memory (``decode="gpu"``, NOTE [ GPU setup ]) -- a fault of the
    setup, not of a record."""


class WorkerError(SeqloaderError, RuntimeError):
    """The work of the worker pool failed: a record (:class:`RecordError`), a worker
    process (:class:`WorkerDiedError`) or the reader thread feeding the workers."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, as the ``__cause__`` of the
    error the caller sees (its ``str`` is the traceback)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class RecordError(WorkerError):
    """Processing one record (or datapoint) failed; see NOTE [ one error contract ].

    ``str(e)`` names the record, the original exception's type and message and, from a
    worker process, the worker and its traceback."""

    def __init__(self, message: str, index: int, tb: str | None = None, *,
                 path: str | None = None, exc_type: str = "", exc_message: str = "",
                 worker: int | None = None):
        super().__init__(message)
        self.index, self.path, self.worker = index, path, worker
        self.exc_type, self.exc_message = exc_type, exc_message
        self.worker_traceback = tb

    @property
    def tb(self) -> str | None:
        """The traceback where the original exception was raised (``worker_traceback``)."""
        return self.worker_traceback

    def __reduce__(self) -> Any:
        return (_rebuild_record_error, (type(self), str(self), self.index, self.worker_traceback,
                                        self.path, self.exc_type, self.exc_message, self.worker))

    @classmethod
    def of(cls, e: BaseException, index: int, path: Any = None, *,
           where: str | None = None) -> "RecordError":
        """The error for ``e``, raised (and being handled) while processing record
        ``index`` of source ``path``: call it inside the ``except`` block (it keeps the
        current traceback).  ``where`` replaces the ``record N (path)`` prefix."""
        where = where or (f"record {index}" + (f" ({path})" if path else ""))
        return cls(f"{where}: {type(e).__name__}: {e}", index, traceback.format_exc(),
                   path=None if path is None else str(path), exc_type=type(e).__name__,
                   exc_message=str(e))

    def in_worker(self, worker: int, pid: int | None) -> "RecordError":
        """This error as the caller re-raises it for worker ``worker`` (process ``pid``):
        the message gains the worker and its traceback (raise it ``from``
        :meth:`remote_cause`)."""
        who = f"seqloader worker {worker}" + (f" (pid {pid})" if pid else "")
        msg = f"{self}\n[in {who}]\n\nWorker traceback:\n{self.worker_traceback or ''}"
        return type(self)(msg, self.index, self.worker_traceback, path=self.path,
                          exc_type=self.exc_type, exc_message=self.exc_message, worker=worker)

    def remote_cause(self) -> RemoteTraceback:
        return RemoteTraceback(self.worker_traceback or "")


def _rebuild_record_error(cls: type, message: str, index: int, tb: str | None, path: Any,
                          exc_type: str, exc_message: str, worker: int | None) -> RecordError:
    return cls(message, index, tb, path=path, exc_type=exc_type, exc_message=exc_message,
               worker=worker)


class WorkerDiedError(WorkerError):
    """A worker process exited unexpectedly (killed, out of memory, crashed); ``worker``
    and ``pid`` name it, ``exitcode`` is its exit status (negative: the signal; None:
    still running but unresponsive)."""

    def __init__(self, message: str, *, worker: int | None = None, pid: int | None = None,
                 exitcode: int | None = None):
        super().__init__(message)
        self.worker, self.pid, self.exitcode = worker, pid, exitcode

    def __reduce__(self) -> Any:
        return (_rebuild_died, (type(self), str(self), self.worker, self.pid, self.exitcode))


class WorkerTimeoutError(WorkerDiedError, TimeoutError):
    """A worker sent nothing for the pool's ``timeout`` seconds (stuck or far too slow);
    it was killed."""


def _rebuild_died(cls: type, message: str, worker: Any, pid: Any, exitcode: Any) -> WorkerDiedError:
    return cls(message, worker=worker, pid=pid, exitcode=exitcode)


# NOTE [ one error boundary ]: what a user gave (files, archives, options, the disk, a
# server) fails as one line and exit 2 at a command's boundary; anything else is a bug in
# seqloader and keeps its traceback.
USER_ERRORS = (SeqloaderError, OSError, ValueError, RuntimeError)


def one_line(e: BaseException) -> str:
    """``e``'s message on one line: its first line (a worker's error carries the worker's
    traceback after it), or its type when it has none."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__
