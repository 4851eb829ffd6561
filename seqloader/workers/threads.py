"""Single-threaded OpenCV/torch in worker processes, safely under every start method.

NOTE [ OpenCV threads and fork ]
Calling ``cv2.setNumThreads()`` in a *forked* child hangs forever when the parent has
already run a multi-threaded OpenCV operation (the child inherits the thread pool's
state but not its threads; seen with OpenCV 5.0).  So: while forking workers, the
parent's OpenCV runs single-threaded (the children inherit that) and is restored
right after; only children started by ``spawn``/``forkserver`` -- fresh interpreters
-- call ``setNumThreads`` themselves.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

__all__ = ["forking_single_threaded", "limit_worker_threads", "die_with_parent", "prepare_worker"]


@contextlib.contextmanager
def forking_single_threaded(start_method: str | None) -> Iterator[None]:
    """Around starting worker processes: see NOTE [ OpenCV threads and fork ]."""
    import multiprocessing as mp

    method = start_method or mp.get_start_method(allow_none=False)
    if method != "fork":
        yield
        return
    import cv2

    n = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(n)


_FORKED = False  # set in children created by fork


def _mark_forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_mark_forked)


def limit_worker_threads(torch_ops: bool = True) -> None:
    """In a worker process: one OpenCV/torch/OpenMP thread (one process per core).
    A forked child already inherited single-threaded OpenCV from
    :func:`forking_single_threaded` and must not touch it.  ``torch_ops=False``: the
    worker runs no torch operations (seqloader's fused transforms, raw records), so
    torch's thread pool is left alone -- setting it faults in torch code, which on a
    cold page cache costs a second of disk reads."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if not _FORKED:
        import cv2
        cv2.setNumThreads(1)
    if torch_ops and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def die_with_parent() -> None:
    """In a worker process: get SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``),
    so a killed parent leaves no orphans (nor the file locks they inherited)."""
    import ctypes
    import signal
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def prepare_worker(torch_ops: bool = True) -> None:
    """First thing in a decode/preprocessing worker process: ignore SIGINT (Ctrl-C is
    the parent's to handle), die with the parent, and run single-threaded
    (:func:`limit_worker_threads`, ``torch_ops`` as there)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    limit_worker_threads(torch_ops)
