"""The worker processes under every process pool of seqloader: start, message, watch,
shut down.  :class:`~seqloader.dataflow.pool.WorkerPool` (the Loader's batches and
``MultiProcessMapAndBatchData``) and :func:`~seqloader.workers.processmap.process_map` (the
DataFlow map stage, the writer's decode checks, ``verify``) both run on a
:class:`ProcessGroup`, so they share one shutdown protocol and one error contract.

NOTE [ pool shutdown ]
Whoever stops a group -- :meth:`ProcessGroup.close`, its ``weakref.finalize`` (garbage
collection, interpreter exit) or a user's generator ``finally`` through them -- runs
:func:`shutdown`, in this order:
1. the owner sets its own done event and joins its feed thread (the owner's job;
   a feed thread blocked sending to a stuck worker is unblocked by step 2's kill);
2. each worker whose pipe has room gets a ``("stop",)`` sentinel; with ``force``
   (a worker died or timed out: it may read nothing) every worker is killed first;
3. join all, 5 s in all;
4. ``terminate`` (SIGTERM) the stragglers, join 2 s; ``kill`` (SIGKILL), join 2 s;
5. close the pipes;
6. close and unlink the shared memory (a mapping a caller still uses as a batch is
   left to it: :func:`unmap_later`).  Buffers are unlinked as soon as every worker has
   attached them, so nothing is left in ``/dev/shm`` even after a SIGKILL.
Workers are daemonic, ignore SIGINT, get SIGKILL when the parent dies
(``PR_SET_PDEATHSIG``) and check the parent every second while waiting (``worker_get``):
no orphans.  Every wait in the parent is a 1-second poll of the pipe *and* the
process sentinel: a dead worker raises :class:`~seqloader.errors.WorkerDiedError`
within a second, a silent one :class:`~seqloader.errors.WorkerTimeoutError` after
``timeout``, never a hang.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import select
import signal
import threading
import time
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Callable, Iterator, Sequence

from ..errors import WorkerDiedError, WorkerTimeoutError
from .threads import forking_single_threaded

__all__ = ["ProcessGroup", "Stop", "serve", "worker_get", "describe_exit", "shutdown", "unmap_later"]

POLL = 1.0


class Stop(Exception):
    """Raised in a worker by :func:`worker_get` when its parent is gone."""


def worker_get(conn: Connection, main_pid: int) -> Any:
    """In a worker: blocking receive with a parent liveness check every second."""
    while not conn.poll(POLL):
        try:
            os.kill(main_pid, 0)
        except ProcessLookupError:
            raise Stop from None
    return conn.recv()


def serve(conn: Connection, main_pid: int, handle: Callable[[tuple], None]) -> None:
    """In a worker: say ``ready``, then ``handle`` each message until ``stop``, the pipe
    closes or the parent is gone."""
    conn.send(("ready", os.getpid()))
    try:
        while True:
            msg = worker_get(conn, main_pid)
            if msg[0] == "stop":
                return
            handle(msg)
    except (Stop, EOFError, BrokenPipeError, KeyboardInterrupt):
        return


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is unresponsive"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory? check `dmesg`)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


def writable(conn: Connection) -> bool:
    """Whether a short message to ``conn`` cannot block: a worker that stopped reading
    (stuck in a transform) leaves its pipe full, and a send would wait forever."""
    try:
        return bool(select.select([], [conn.fileno()], [], 0)[1])
    except (OSError, ValueError):  # closed
        return False


def kill(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()


def shutdown(procs: list, conns: list[Connection], shms: list[SharedMemory],
             force: bool = False) -> None:
    """Steps 2-6 of NOTE [ pool shutdown ]."""
    if force:
        kill(procs)
    for c in conns:
        if not force and writable(c):
            try:
                c.send(("stop",))
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(2)
        if p.is_alive():
            p.kill()
            p.join(2)
    for c in conns:
        c.close()
    for shm in shms:
        try:
            shm.close()
        except BufferError:  # the caller still holds a batch in it
            unmap_later(shm)
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def unmap_later(shm: SharedMemory) -> None:
    """Close ``shm`` except for its mapping, which views of it still use (``close()``
    raised BufferError: ``slot_views`` arrays hold an export): the mapping is unmapped
    when the last of them goes (they keep its memoryview, hence its mmap, alive).  The
    object forgets both, so its own ``__del__`` does not try -- and fail -- again."""
    fd = getattr(shm, "_fd", -1)
    shm._buf = shm._mmap = None  # type: ignore[attr-defined]
    if isinstance(fd, int) and fd >= 0:
        os.close(fd)
        shm._fd = -1  # type: ignore[attr-defined]


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Around forking workers: move the parent's objects to the collector's permanent
    generation, so the children's collections never write to them -- otherwise every
    page of the parent's heap they touch becomes a private copy (measured: ~40 MB of
    PSS less over 2 workers).  The parent unfreezes right after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class ProcessGroup:
    """``num_workers`` daemonic processes, each with a duplex pipe to this one.

    :meth:`start` runs ``target(*args(w), conn, main_pid)`` in worker ``w``, which must
    first send ``("ready", pid)``.  :meth:`send` and :meth:`recv` talk to one worker;
    :meth:`recv` raises :class:`WorkerDiedError` / :class:`WorkerTimeoutError` after
    calling ``on_failure`` (default: close the group, forcibly; an owner with a feed
    thread stops that first, NOTE [ pool shutdown ]).  ``shms`` are owned from :meth:`start` on and freed by
    :meth:`close` (NOTE [ pool shutdown ]).  Used from one thread, except :meth:`send`,
    which may be called from a feed thread too."""

    def __init__(self, num_workers: int, *, start_method: str | None = None,
                 name: str = "seqloader worker", start_timeout: float = 120):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 for a worker pool, got {num_workers}")
        self.num_workers, self.name, self.start_timeout = num_workers, name, start_timeout
        self.ctx = mp.get_context(start_method)
        self.procs: list = []
        self.conns: list[Connection] = []
        self.locks: list[threading.Lock] = []
        self.shms: list[SharedMemory] = []
        self._finalizer: weakref.finalize | None = None
        self.on_failure: Callable[[], None] | None = None  # (held weakly by owners: no cycle)

    @property
    def started(self) -> bool:
        """Workers are running (not closed, also not by the exit-time finalizer)."""
        return bool(self.procs) and self._finalizer is not None and self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def pid(self, w: int) -> int | None:
        return self.procs[w].pid if w < len(self.procs) else None

    def start(self, target: Callable[..., None], args: Callable[[int], tuple],
              shms: Sequence[SharedMemory] = ()) -> None:
        """Start the workers and wait until each is ready; then unlink ``shms``."""
        self.close()
        self.shms = list(shms)
        try:
            with forking_single_threaded(self.ctx.get_start_method()), frozen_gc():
                for w in range(self.num_workers):
                    parent, child = self.ctx.Pipe(duplex=True)
                    p = self.ctx.Process(target=target, daemon=True,
                                         name=f"{self.name.replace(' ', '-')}-{w}",
                                         args=(*args(w), child, os.getpid()))
                    p.start()
                    child.close()
                    self.procs.append(p)
                    self.conns.append(parent)
                    self.locks.append(threading.Lock())
            self._finalizer = weakref.finalize(self, shutdown, self.procs, self.conns, self.shms)
            for w in range(self.num_workers):
                msg = self.recv(w, self.start_timeout, "start")
                if msg[0] != "ready":
                    raise RuntimeError(f"worker {w} sent {msg[0]!r} instead of 'ready'")
        except BaseException:
            self.close(force=True)
            raise
        for shm in self.shms:  # NOTE [ pool shutdown ]: nothing left in /dev/shm
            shm.unlink()

    def send(self, w: int, msg: tuple) -> None:
        with self.locks[w]:
            self.conns[w].send(msg)

    def recv(self, w: int, timeout: float, doing: str,
             check: Callable[[], None] | None = None,
             since: Callable[[], float | None] | None = None) -> Any:
        """The next message from worker ``w``, waiting at most ``timeout`` s (0: no
        limit); ``check`` runs at every poll (a feed thread's error is raised from it).
        ``since`` gives when the awaited work was handed to the worker (None: not yet,
        so its silence is not the worker's fault); the ``timeout`` counts from then."""
        conn, proc = self.conns[w], self.procs[w]
        start = time.monotonic()
        deadline = start + timeout if timeout else None
        while True:
            ready = wait([conn, proc.sentinel], POLL)
            if conn in ready or conn.poll():
                try:
                    return conn.recv()
                except (EOFError, ConnectionResetError, OSError):  # gone: see below
                    proc.join(1)
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(1)
                code = proc.exitcode
                self._failed()
                raise WorkerDiedError(f"{self.name} {w} (pid {proc.pid}) {describe_exit(code)} "
                                      f"during {doing}; the pool was shut down",
                                      worker=w, pid=proc.pid, exitcode=code)
            if check is not None:
                check()
            if deadline is not None and since is not None:
                handed = since()
                deadline = None if handed is None else max(start, handed) + timeout
                if deadline is None:
                    continue
            if deadline is not None and time.monotonic() > deadline:
                self._failed()
                raise WorkerTimeoutError(f"{self.name} {w} (pid {proc.pid}) sent nothing for "
                                         f"{timeout:.0f} s during {doing}; raise `timeout` if "
                                         "this work is legitimately this slow",
                                         worker=w, pid=proc.pid, exitcode=None)

    def _failed(self) -> None:
        if self.on_failure is not None:
            self.on_failure()
        self.close(force=True)

    def close(self, force: bool = False) -> None:
        """NOTE [ pool shutdown ], steps 2-6.  Idempotent.  ``force`` (a worker died or
        timed out) kills the workers first instead of asking them to stop."""
        fin = self._finalizer  # (a dead one has shut this run down at exit already)
        if fin is None or fin.detach() is not None:
            shutdown(self.procs, self.conns, self.shms, force)
        self.procs, self.conns, self.locks, self.shms = [], [], [], []
        self._finalizer = None
