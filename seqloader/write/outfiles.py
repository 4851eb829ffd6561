"""The writer's files beside a database: locks, unfinished ``.partial`` files, the
bad-files report."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path


from ..format.files import bad_files_path, is_shard_name

__all__ = ["WARNED", "bad_files_said", "BAD_FILES_SAID", "lock_or_fail", "lock_file", "partials", "remove_partial", "remove_db",
           "report_path", "read_regular", "write_report"]


def lock_or_fail(lockf, partial: Path, patience: float = 5.0) -> None:
    """Take the writer's exclusive lock on ``partial``.  A killed writer's decode workers
    hold it for a moment after it dies (they die with it), hence a little patience."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"another process is writing {partial}; wait for it or "
                                   "stop it before re-running") from None
            time.sleep(0.05)


def lock_file(path: Path) -> Path:
    """The lock file LMDB keeps beside a database file."""
    return path.with_name(path.name + "-lock")


def partials(out: Path) -> list[Path]:
    """The unfinished writes of output ``out`` (``X.lmdb``) in any layout that exist:
    ``X.lmdb.partial`` and ``X-NNNNN-of-NNNNN.lmdb.partial``."""
    single = out.with_name(out.name + ".partial")
    shards = [p for p in out.parent.glob("*.lmdb.partial")
              if is_shard_name(p.name[:-len(".partial")], out)]
    return ([single] if single.exists() else []) + sorted(shards)


def remove_partial(partial: Path) -> None:
    """Remove an unfinished write (and LMDB's lock file), unless a writer holds it."""
    try:
        f = open(partial, "rb")
    except FileNotFoundError:
        return
    with f:
        lock_or_fail(f, partial)
        remove_db(partial)


def remove_db(path: Path) -> None:
    for p in (path, lock_file(path)):
        p.unlink(missing_ok=True)


def _tsv(field: str) -> str:
    """A field of the bad-files report: backslash, tab and line breaks escaped."""
    return (field.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def report_path(final: Path) -> Path:
    return bad_files_path(final)


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file; OSError for anything else named like an image -- a
    FIFO would block the reader forever, so it is opened without blocking and refused
    (the scan lists names only, and a stat per name there would cost a metadata round
    trip per image on network file systems)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device named "
                          "like an image)")
        return f.read()


#: How the bad-files report marks a file that was stored although a decoder warned.
WARNED = "stored, but a decoder warned: "


def write_report(final: Path, bad_files: list[list[str]],
                  warned_files: list[list[str]] = ()) -> None:
    """The bad-files report of ``final`` (none if there are none): the skipped files,
    then those stored although a decoder warned (reason ``WARNED`` + the warning);
    replaced atomically and synced: written before ``final`` appears, so a complete
    database never lacks it (the rename's directory sync covers its name too)."""
    report = report_path(final)
    rows = list(bad_files) + [[p, WARNED + w] for p, w in warned_files]
    if not rows:
        report.unlink(missing_ok=True)
        return
    tmp = report.with_name(report.name + ".partial")
    with open(tmp, "w") as f:
        f.write("".join(f"{_tsv(p)}\t{_tsv(r)}\n" for p, r in rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, report)


# the words of the bad-files warning, which the uploader recognises to say it again with URLs
BAD_FILES_SAID = ("were skipped as bad", "decoded with a warning")


def bad_files_said(num_bad: int, num_warned: int) -> str:
    """The bad-files warning's count clause: what was skipped (undecodable, or over the
    pixel limit: the report says which) and what was stored with a decoder warning."""
    said = [f"{num_bad} file(s) {BAD_FILES_SAID[0]} (undecodable or over the pixel limit)"
            * bool(num_bad),
            f"{num_warned} file(s) {BAD_FILES_SAID[1]} and were stored" * bool(num_warned)]
    return "; ".join(s for s in said if s)
