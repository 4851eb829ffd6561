"""The multi-process prefetcher: start workers, feed them epochs, collect batches in
plan order, shut everything down.

NOTE [ worker lifecycle ]
* Start: the parent creates ``prefetch`` shared-memory batch buffers per worker,
  starts daemonic workers (fork, spawn or forkserver) and waits for each to attach
  its buffers and report ready; then it *unlinks* every buffer name, so nothing is
  left in ``/dev/shm`` whatever happens later (the mappings stay valid).  Workers
  ignore SIGINT (Ctrl-C is the parent's to handle), die with the parent
  (``PR_SET_PDEATHSIG`` plus a parent liveness check every second) and run
  single-threaded OpenCV/torch.
* Epoch: one duplex pipe per worker.  The parent sends ``epoch`` (the worker's
  stream and batch sizes); the worker fills a free buffer per batch and sends
  ``batch``; the parent takes batch ``j`` from worker ``j % W`` (plan order), lets
  the caller copy it out, and sends ``free``.  Only small messages cross the pipe;
  pixels stay in shared memory.  (Raw encoded bytes, ``transform=None``, travel
  through the pipe: they are what a batch *is* in that mode.)
* Every wait is a 1-second poll of the pipe *and* the process sentinel: a dead
  worker is reported by name, pid and signal within a second, never a hang;
  ``timeout`` bounds how long one batch may take.
* Errors: a worker that fails on a record sends the message and its traceback;
  the parent cancels the epoch and raises :class:`WorkerError` with both.
* Break/``close``/GC: an unfinished epoch is cancelled (workers acknowledge and
  reclaim their buffers), so the next epoch starts clean.  ``close`` sends
  ``stop``, joins, then terminates and kills stragglers; a ``weakref.finalize``
  does the same at garbage collection and interpreter exit.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Iterator

from .plan import EpochPlan
from .producer import Producer, ProducerSpec, RecordError, batch_views

__all__ = ["WorkerPool", "WorkerError", "WorkerDiedError"]

_POLL = 1.0


class WorkerError(RuntimeError):
    """A worker failed; the message names the worker and the record, and ends with the
    worker's traceback."""


class WorkerDiedError(RuntimeError):
    """A worker process exited unexpectedly (killed, out of memory, crashed)."""


class _Stop(Exception):
    pass


def _describe_exit(code: int | None) -> str:
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


# ------------------------------------------------------------------ worker side

def _prepare_process(main_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.environ["OMP_NUM_THREADS"] = "1"
    import cv2
    cv2.setNumThreads(1)
    import sys
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


class _Inbox:
    """Blocking receive with a parent liveness check."""

    def __init__(self, conn: Connection, main_pid: int):
        self.conn, self.main_pid = conn, main_pid

    def get(self, block: bool = True) -> Any:
        while True:
            if self.conn.poll(_POLL if block else 0):
                return self.conn.recv()
            if not block:
                return None
            try:
                os.kill(self.main_pid, 0)
            except ProcessLookupError:
                raise _Stop from None


def _worker_main(spec: ProducerSpec, worker: int, conn: Connection, names: list[str],
                 main_pid: int) -> None:
    _prepare_process(main_pid)
    shms = [SharedMemory(name) for name in names]
    producer = Producer(spec, worker)
    inbox = _Inbox(conn, main_pid)
    conn.send(("ready", os.getpid()))
    free = list(range(len(shms)))
    try:
        while True:
            msg = inbox.get()
            if msg[0] == "stop":
                return
            if msg[0] == "free":
                free.append(msg[1])
            elif msg[0] == "cancel":
                free[:] = range(len(shms))
                conn.send(("cancelled", msg[1]))
            elif msg[0] == "epoch":
                _run_epoch(producer, spec, worker, conn, inbox, shms, free, *msg[1:])
    except (_Stop, EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    finally:
        producer.close()
        for shm in shms:
            shm.close()


def _run_epoch(producer: Producer, spec: ProducerSpec, worker: int, conn: Connection,
               inbox: _Inbox, shms: list[SharedMemory], free: list[int], epoch: int,
               ranges: list, sizes: list, first: int, num_workers: int) -> None:
    def handle(msg: Any) -> bool:
        """Apply a message received mid-epoch; True if the epoch is cancelled."""
        if msg[0] == "free":
            free.append(msg[1])
            return False
        if msg[0] == "cancel":
            free[:] = range(len(shms))
            conn.send(("cancelled", msg[1]))
            return True
        if msg[0] == "stop":
            raise _Stop
        raise AssertionError(f"unexpected message {msg[0]!r} during an epoch")

    batches = producer.epoch(epoch, ranges, sizes, first, lambda k: k * num_workers + worker)
    k = first
    try:
        for k, n, fill in batches:
            while not free:
                if handle(inbox.get()):
                    return
            while (msg := inbox.get(block=False)) is not None:
                if handle(msg):
                    return
            slot = free.pop(0)
            images, labels = batch_views(shms[slot].buf, spec, n)
            try:
                raw = fill((images, labels))
            finally:
                del images, labels
            conn.send(("batch", epoch, k, slot, n, raw))
    except RecordError as e:
        conn.send(("error", epoch, k, str(e), e.tb))
    except _Stop:
        raise
    except Exception as e:  # I/O or format errors outside a record
        import traceback
        conn.send(("error", epoch, k, f"{type(e).__name__}: {e}", traceback.format_exc()))


# ------------------------------------------------------------------ parent side

def _shutdown(procs: list, conns: list[Connection], shms: list[SharedMemory]) -> None:
    for c in conns:
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
        except BufferError:  # a caller still holds a view; the OS frees it at exit
            pass
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


class WorkerPool:
    """``num_workers`` processes producing batches for :meth:`epoch`.

    Created in the parent; processes start on first use and persist across epochs
    until :meth:`close`.  Not thread-safe, not reentrant: one epoch at a time (a new
    :meth:`epoch` cancels an unfinished one).  The spec must be picklable for the
    ``spawn``/``forkserver`` start methods.
    """

    def __init__(self, spec: ProducerSpec, num_workers: int, *, prefetch: int = 2,
                 start_method: str | None = None, timeout: float = 0,
                 start_timeout: float = 120):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 for a WorkerPool, got {num_workers}")
        if prefetch < 1:
            raise ValueError(f"prefetch (batches per worker in flight) must be >= 1, got {prefetch}")
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds (0 = no limit), got {timeout}")
        self.spec, self.num_workers, self.prefetch = spec, num_workers, prefetch
        self.ctx = mp.get_context(start_method)
        self.timeout, self.start_timeout = timeout, start_timeout
        self._procs: list = []
        self._conns: list[Connection] = []
        self._shms: list[SharedMemory] = []
        self._finalizer: weakref.finalize | None = None
        self._active: int | None = None  # epoch with batches possibly in flight

    @property
    def started(self) -> bool:
        """Workers are running (not closed, also not by the exit-time finalizer)."""
        return bool(self._procs) and self._finalizer is not None and self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> None:
        if self.started:
            return
        self.close()  # a pool closed by its finalizer or a dead worker starts afresh
        nbytes = max(1, self.spec.slot_nbytes())
        try:
            for w in range(self.num_workers):
                shms = [SharedMemory(create=True, size=nbytes) for _ in range(self.prefetch)]
                self._shms.extend(shms)
                parent, child = self.ctx.Pipe(duplex=True)
                p = self.ctx.Process(target=_worker_main, name=f"seqloader-worker-{w}", daemon=True,
                                     args=(self.spec, w, child, [s.name for s in shms], os.getpid()))
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns, self._shms)
            for w in range(self.num_workers):
                msg = self._recv(w, self.start_timeout, "start")
                if msg[0] != "ready":
                    raise RuntimeError(f"worker {w} sent {msg[0]!r} instead of 'ready'")
        except BaseException:
            self.close()
            raise
        for shm in self._shms:  # see NOTE [ worker lifecycle ]: nothing left in /dev/shm
            shm.unlink()

    def _recv(self, w: int, timeout: float, doing: str) -> Any:
        conn, proc = self._conns[w], self._procs[w]
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            ready = wait([conn, proc.sentinel], _POLL)
            if conn in ready or conn.poll():
                try:
                    return conn.recv()
                except (EOFError, ConnectionResetError):  # the worker is gone: see below
                    proc.join(1)
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(1)
                self.close()
                raise WorkerDiedError(f"seqloader worker {w} (pid {proc.pid}) {_describe_exit(proc.exitcode)} "
                                      f"during {doing}; the pool was shut down")
            if deadline is not None and time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"seqloader worker {w} (pid {proc.pid}) sent nothing for "
                                   f"{timeout:.0f} s during {doing}; raise `timeout` if batches "
                                   "are legitimately this slow")

    def epoch(self, plan: EpochPlan, first_batch: int = 0
              ) -> Iterator[tuple[int, int, Any, list[bytes] | None]]:
        """Yield ``(j, n, (images, labels) views, raw)`` for batches ``j >= first_batch`` in
        plan order.  The views are valid only until the next item is requested: copy
        them out.  Finite; cancels itself if closed early."""
        if len(plan.streams) != self.num_workers:
            raise ValueError(f"plan is for {len(plan.streams)} workers, pool has {self.num_workers}")
        self.start()
        self._cancel()
        W = self.num_workers
        for w in range(W):
            first_k = len(range(w, first_batch, W))
            self._conns[w].send(("epoch", plan.epoch, list(plan.streams[w]),
                                 list(plan.worker_batches[w]), first_k, W))
        self._active = plan.epoch
        try:
            yield from self._collect(plan, first_batch)
        finally:
            if self._active is not None and self.started:  # closed early: break, error, GC
                try:
                    self._cancel()
                except Exception:
                    self.close()

    def _collect(self, plan: EpochPlan, first_batch: int
                 ) -> Iterator[tuple[int, int, Any, list[bytes] | None]]:
        for j in range(first_batch, plan.num_batches):
            w, k = plan.worker_of(j)
            msg = self._recv(w, self.timeout, f"batch {j} of epoch {plan.epoch}")
            if msg[0] == "error":
                _, _, _, text, tb = msg
                self._cancel()
                raise WorkerError(f"seqloader worker {w} (pid {self._procs[w].pid}) failed on "
                                  f"{text}\n\nWorker traceback:\n{tb}")
            kind, epoch, got_k, slot, n, raw = msg
            if (kind, epoch, got_k) != ("batch", plan.epoch, k):  # pragma: no cover - invariant
                raise AssertionError(f"expected batch {k} of epoch {plan.epoch} from worker {w}, "
                                     f"got {msg[:3]}")
            views = batch_views(self._shms[w * self.prefetch + slot].buf, self.spec, n)
            try:
                yield j, n, views, raw
            finally:
                del views
                if self.started:
                    self._conns[w].send(("free", slot))
        self._active = None

    def _cancel(self) -> None:
        """Stop an unfinished epoch and wait until every worker has acknowledged."""
        if self._active is None or not self.started:
            self._active = None
            return
        epoch, self._active = self._active, None
        for c in self._conns:
            c.send(("cancel", epoch))
        for w in range(self.num_workers):
            while True:
                msg = self._recv(w, 30, "cancel")
                if msg[0] == "cancelled":
                    break

    def close(self) -> None:
        """Stop the workers and free the shared memory.  Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        else:
            _shutdown(self._procs, self._conns, self._shms)
        self._procs, self._conns, self._shms = [], [], []
        self._finalizer = None
        self._active = None
