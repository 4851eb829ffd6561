"""The multi-process prefetcher: start workers, feed them epochs, collect batches in
plan order, shut everything down.

NOTE [ worker lifecycle ]
* Start: the parent creates ``num_workers * prefetch`` shared-memory batch
  buffers, starts daemonic workers (fork, spawn or forkserver) and waits for each
  to attach them and report ready; then it *unlinks* every buffer name, so nothing
  is left in ``/dev/shm`` whatever happens later (the mappings stay valid).
  Workers ignore SIGINT (Ctrl-C is the parent's to handle), die with the parent
  (``PR_SET_PDEATHSIG`` plus a parent liveness check every second) and run
  single-threaded OpenCV/torch.
* Epoch: a reader thread in the parent (:class:`~seqloader.dataflow.feeder.Feeder`, see
  NOTE [ one reader per rank ]) takes a free buffer per batch, copies the batch's
  encoded records into it and sends ``batch`` to worker ``j % W`` over its pipe
  (and, told the next epoch's plan, goes on into it when this one's records are
  handed out: the workers start on the next epoch while the last batches are
  consumed, instead of idling at every epoch boundary while the shuffle buffer
  refills; a next epoch that is not the one expected cancels that work);
  the worker decodes into the same buffer and answers ``done``; the parent takes
  the answers in plan order and hands the buffer to the caller, who either copies
  it out or *leases* it (:meth:`WorkerPool.lease`: the batch tensor is a view of
  the buffer, which returns to the pool when the tensor is garbage-collected).
  Only small messages cross the pipes; bytes and pixels stay in shared memory (a
  batch too large for its buffer's input region goes by pipe).
* Every wait is a 1-second poll of the pipe *and* the process sentinel: a dead
  worker is reported by name, pid and signal within a second, never a hang;
  ``timeout`` bounds how long one batch may take.
* Errors: a worker that fails on a record sends the message and its traceback;
  the parent cancels the epoch and raises :class:`WorkerError` with both.
* Break/``close``/GC: an unfinished epoch is cancelled: the reader thread stops,
  a shared generation counter makes workers skip queued batches, and each worker
  acknowledges, so the next epoch starts clean.  ``close`` sends
  ``stop``, joins, then terminates and kills stragglers; a ``weakref.finalize``
  does the same at garbage collection and interpreter exit.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import queue
import select
import signal
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Iterator

import numpy as np

from .feeder import Feeder, Stopped
from ..read.plan import EpochPlan
from .batch import ProducerSpec, batch_rng, decode_batch, slot_views
from ..errors import RecordError
from .threads import forking_single_threaded, prepare_worker
from ..errors import WorkerDiedError, WorkerError

__all__ = ["WorkerPool", "WorkerError", "WorkerDiedError"]

_POLL = 1.0


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

def _get(conn: Connection, main_pid: int) -> Any:
    """Blocking receive with a parent liveness check every second."""
    while not conn.poll(_POLL):
        try:
            os.kill(main_pid, 0)
        except ProcessLookupError:
            raise _Stop from None
    return conn.recv()


def _worker_main(spec: ProducerSpec, worker: int, conn: Connection, names: list[str],
                 generation: Any, main_pid: int) -> None:
    prepare_worker(torch_ops=spec.transform is not None or spec.target_transform is not None)
    shms = [SharedMemory(name) for name in names]
    conn.send(("ready", os.getpid()))
    try:
        while True:
            msg = _get(conn, main_pid)
            if msg[0] == "stop":
                return
            if msg[0] == "cancel":
                conn.send(("cancelled", msg[1]))
                continue
            _, gen, epoch, j, slot, n, offsets, indices, inline = msg
            if gen != generation.value:  # the epoch was cancelled: skip queued work fast
                continue
            conn.send(_decode(spec, shms[slot].buf, epoch, j, slot, n, offsets, indices, inline))
    except (_Stop, EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    finally:
        for shm in shms:
            try:
                shm.close()
            except BufferError:  # a view is still referenced (an error's frame): exiting
                _unmap_later(shm)


def _decode(spec: ProducerSpec, buf: Any, epoch: int, j: int, slot: int, n: int,
            offsets: list[int], indices: list[int], inline: list[bytes] | None) -> tuple:
    labels, samples, whole = slot_views(buf, spec, n)
    try:
        values = inline if inline is not None else [
            whole[offsets[i]:offsets[i + 1]].data for i in range(n)]
        decode_batch(spec, values, indices, labels, samples,
                     batch_rng(spec.seed, epoch, spec.rank, j))
        return ("done", epoch, j, slot)
    except RecordError as e:
        return ("error", epoch, j, slot, str(e), e.tb)
    except Exception as e:  # pragma: no cover - decode_batch wraps per-record errors
        return ("error", epoch, j, slot, f"{type(e).__name__}: {e}", traceback.format_exc())
    finally:
        del labels, samples, whole


# ------------------------------------------------------------------ parent side

def _writable(conn: Connection) -> bool:
    """Whether a short message to ``conn`` cannot block: a worker that stopped reading
    (stuck in a transform) leaves its pipe full, and a send would wait forever."""
    try:
        return bool(select.select([], [conn.fileno()], [], 0)[1])
    except (OSError, ValueError):  # closed
        return False


def _kill(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()


def _shutdown(procs: list, conns: list[Connection], shms: list[SharedMemory],
              force: bool = False) -> None:
    """Stop the workers -- asked to ("stop"), or with ``force`` killed at once (a worker
    that timed out is stuck, and a reader thread may be blocked sending to it) -- and
    free the shared memory."""
    if force:
        _kill(procs)
    for c in conns:
        if not force and _writable(c):
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
            _unmap_later(shm)
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def _unmap_later(shm: SharedMemory) -> None:
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
def _frozen_gc() -> Iterator[None]:
    """Around forking workers: move the parent's objects to the collector's permanent
    generation, so the children's collections never write to them -- otherwise every
    page of the parent's heap they touch becomes a private copy (measured: ~40 MB of
    PSS less over 2 workers).  The parent unfreezes right after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _ReaderThread(threading.Thread):
    """Feeds batches of encoded records into free buffers and hands them to workers: the
    batches of ``plan`` from ``first`` on, then those of each plan :meth:`extend` adds
    (the next epochs, NOTE [ worker lifecycle ])."""

    def __init__(self, pool: "WorkerPool", feeder: Feeder, plan: EpochPlan, first: int,
                 free: "queue.Queue[int]"):
        super().__init__(name="seqloader-reader", daemon=True)
        self.pool, self.feeder, self.free = pool, feeder, free
        self.todo: list[tuple[EpochPlan, int]] = [(plan, first)]
        self.finished = False
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.error: tuple[BaseException, str] | None = None
        self.error_epoch: int | None = None  # the epoch being read when it failed

    def extend(self, plan: EpochPlan) -> bool:
        """Read ``plan`` (from its first batch) after the plans given so far; False if
        this thread has already finished them (start another)."""
        with self._lock:
            if self.finished:
                return False
            self.todo.append((plan, 0))
            return True

    def _slot(self) -> int | None:
        while not self.stop.is_set():
            try:
                return self.free.get(timeout=0.2)
            except queue.Empty:
                pass
        return None

    def run(self) -> None:
        gen = self.pool._generation.value
        plan = None
        try:
            while True:
                with self._lock:
                    if not self.todo or self.stop.is_set():
                        self.finished = True
                        return
                    plan, first = self.todo.pop(0)
                if not self._feed(plan, first, gen):
                    return
        except Stopped:  # stopped while reading (e.g. filling the shuffle buffer)
            return
        except BaseException as e:  # reported by the consumer, with this traceback
            self.error_epoch = None if plan is None else plan.epoch
            self.error = (e, traceback.format_exc())
        finally:
            with self._lock:
                self.finished = True

    def _feed(self, plan: EpochPlan, first: int, gen: int) -> bool:
        pool, spec = self.pool, self.pool.spec
        copy_into = self.feeder.reader.copy_into
        for j, recs in self.feeder.batches(plan, first, release=False, stop=self.stop):
            slot = self._slot()
            if slot is None:
                return False
            _, _, whole = slot_views(pool._shms[slot].buf, spec, 0)
            start = spec.input_start([len(v) for _, v in recs])
            offsets, inline = [start], None
            if start is not None:  # NOTE [ batch buffer layout ]
                for _, v in recs:  # pread from the page cache: maps no file pages
                    copy_into(v, whole[offsets[-1]:offsets[-1] + len(v)])
                    offsets.append(offsets[-1] + len(v))
            else:
                inline = [bytes(v) for _, v in recs]
            del whole
            w = plan.worker_of(j)
            with pool._locks[w]:
                pool._conns[w].send(("batch", gen, plan.epoch, j, slot, len(recs),
                                     offsets, [i for i, _ in recs], inline))
        return True


class WorkerPool:
    """``num_workers`` decode processes fed by a reader thread, yielding batches in plan order.

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
        if not timeout >= 0:  # (NaN, which would silently mean no limit, fails too)
            raise ValueError(f"timeout must be >= 0 seconds (0 = no limit), got {timeout}")
        self.spec, self.num_workers, self.prefetch = spec, num_workers, prefetch
        self.ctx = mp.get_context(start_method)
        self.timeout, self.start_timeout = timeout, start_timeout
        self._procs: list = []
        self._conns: list[Connection] = []
        self._locks: list[threading.Lock] = []
        self._shms: list[SharedMemory] = []
        self._generation: Any = None
        self._finalizer: weakref.finalize | None = None
        self._reader: _ReaderThread | None = None
        self._active: int | None = None  # epoch with batches possibly in flight
        self._ahead: tuple[EpochPlan, Feeder] | None = None  # read ahead after an epoch
        self._consuming: int | None = None  # the epoch whose batches the caller takes
        self._slot_lock = threading.Lock()
        self._free: queue.Queue[int] | None = None
        self._leased: set[int] = set()  # buffers the caller holds as batch tensors
        self._run = 0  # counts closes: a lease token (slot numbers are reused by restarts)

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
        try:
            self._shms = [SharedMemory(create=True, size=self.spec.slot_nbytes)
                          for _ in range(self.num_workers * self.prefetch)]
            self._generation = self.ctx.RawValue("q", 0)
            names = [s.name for s in self._shms]
            with forking_single_threaded(self.ctx.get_start_method()), _frozen_gc():
                for w in range(self.num_workers):
                    parent, child = self.ctx.Pipe(duplex=True)
                    p = self.ctx.Process(target=_worker_main, name=f"seqloader-worker-{w}",
                                         daemon=True, args=(self.spec, w, child, names,
                                                            self._generation, os.getpid()))
                    p.start()
                    child.close()
                    self._procs.append(p)
                    self._conns.append(parent)
                    self._locks.append(threading.Lock())
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
                self.close(force=True)
                raise WorkerDiedError(f"seqloader worker {w} (pid {proc.pid}) {_describe_exit(proc.exitcode)} "
                                      f"during {doing}; the pool was shut down")
            reader = self._reader
            # a failure while reading ahead into the next epoch is that epoch's to report
            if (reader is not None and reader.error is not None
                    and reader.error_epoch in (None, self._consuming)):
                err, tb = reader.error
                self._cancel()
                raise WorkerError(f"seqloader reader thread failed during {doing}: "
                                  f"{type(err).__name__}: {err}\n\nReader traceback:\n{tb}") from err
            if deadline is not None and time.monotonic() > deadline:
                self.close(force=True)
                raise TimeoutError(f"seqloader worker {w} (pid {proc.pid}) sent nothing for "
                                   f"{timeout:.0f} s during {doing}; raise `timeout` if batches "
                                   "are legitimately this slow")

    def epoch(self, plan: EpochPlan, feeder: Feeder, first_batch: int = 0,
              next_plan: EpochPlan | None = None
              ) -> Iterator[tuple[int, int, tuple[np.ndarray, np.ndarray], int]]:
        """Yield ``(j, n, (labels, samples) views, slot)`` for batches ``j >= first_batch`` in
        plan order.  The views are valid until the next item is requested -- copy them
        out -- unless the caller leases the slot (:meth:`lease`).  Finite; cancels itself if
        closed early.  With ``next_plan`` the reader goes on into that epoch once this
        one's records are handed out, so the workers never wait at the epoch boundary; a
        next call for ``next_plan`` from its first batch continues that work, any other
        call cancels it."""
        if plan.num_workers != self.num_workers:
            raise ValueError(f"plan is for {plan.num_workers} workers, pool has {self.num_workers}")
        self.start()
        ahead, self._ahead = self._ahead, None
        reader = self._reader
        go_on = (ahead is not None and ahead[0] == plan and ahead[1] is feeder
                 and first_batch == 0 and reader is not None and self._free is not None)
        if go_on and next_plan is not None and not reader.extend(next_plan):
            # the reader is done (its error, if any, is set before it says so): a new one
            # reads the epoch after this, unless this one's reading failed
            go_on = reader.error is None
            if go_on:
                self._reader = _ReaderThread(self, feeder, next_plan, 0, self._free)
                self._reader.start()
        if go_on and reader.error is None:
            free = self._free  # this epoch is already being read: go on
        else:
            self._cancel()
            with self._slot_lock:
                free = queue.Queue()
                for s in range(len(self._shms)):
                    if s not in self._leased:
                        free.put(s)
                self._free = free
            self._reader = _ReaderThread(self, feeder, plan, first_batch, free)
            if next_plan is not None:
                self._reader.extend(next_plan)
            self._reader.start()
        self._active = self._consuming = plan.epoch
        finished = False
        try:
            for j in range(first_batch, plan.num_batches):
                w = plan.worker_of(j)
                msg = self._recv(w, self.timeout, f"batch {j} of epoch {plan.epoch}")
                if msg[0] == "error":
                    _, _, _, _, text, tb = msg
                    self._cancel()
                    raise WorkerError(f"seqloader worker {w} (pid {self._procs[w].pid}) failed on "
                                      f"{text}\n\nWorker traceback:\n{tb}")
                kind, epoch, got, slot = msg
                if (kind, epoch, got) != ("done", plan.epoch, j):  # pragma: no cover - invariant
                    raise AssertionError(f"expected batch {j} of epoch {plan.epoch} from worker "
                                         f"{w}, got {msg[:3]}")
                labels, samples, _ = slot_views(self._shms[slot].buf, self.spec, plan.batch_sizes[j])
                try:
                    yield j, plan.batch_sizes[j], (labels, samples), slot
                finally:
                    del labels, samples
                    with self._slot_lock:
                        if slot not in self._leased:
                            free.put(slot)
            finished = True
            if next_plan is not None:  # its batches may be in flight already
                self._ahead, self._active = (next_plan, feeder), next_plan.epoch
            else:
                self._active = None
        finally:
            if not finished and self._active is not None and self.started:  # closed early
                try:
                    self._cancel()
                except Exception:
                    self.close()

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.prefetch

    def lease(self, slot: int) -> int | None:
        """Keep ``slot`` out of circulation until :meth:`release`; returns the lease's
        token for ``release``.  Refused (None) when it would leave fewer than one buffer
        per worker circulating.  (A ``for`` loop holds two batches for a moment: the one
        it is about to rebind and the new one.)"""
        with self._slot_lock:
            if len(self._leased) + 1 > self.num_slots - self.num_workers:
                return None
            self._leased.add(slot)
            return self._run

    def release(self, slot: int, token: int) -> None:
        """Return a leased buffer (called when its batch tensor is garbage-collected).
        A lease from before a :meth:`close` (its batch outlived a worker failure and
        the pool was restarted) is ignored: slot numbers name new buffers now, which
        must not be handed out twice."""
        with self._slot_lock:
            if token == self._run and slot in self._leased:
                self._leased.discard(slot)
                if self._free is not None:
                    self._free.put(slot)

    def _cancel(self) -> None:
        """Stop an unfinished epoch: stop the reader, make workers skip queued batches and
        wait until every worker has acknowledged."""
        reader, self._reader = self._reader, None
        self._ahead = None
        if reader is not None:
            reader.stop.set()
            reader.join(30)
            if reader.is_alive():  # blocked sending to a worker that does not read: stuck
                self.close(force=True)
                return
        if self._active is None or not self.started:
            self._active = None
            return
        epoch, self._active = self._active, None
        self._generation.value += 1
        for w, c in enumerate(self._conns):
            with self._locks[w]:
                c.send(("cancel", epoch))
        for w in range(self.num_workers):
            while self._recv(w, 30, "cancel")[0] != "cancelled":
                pass

    def close(self, force: bool = False) -> None:
        """Stop the reader and the workers and free the shared memory.  Idempotent.
        ``force`` (after a timeout or a dead worker) kills the workers first instead of
        asking them to stop: a stuck one reads nothing, and the reader thread may be
        blocked sending to it."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop.set()
            if force:
                _kill(self._procs)
            reader.join(30)
        fin = self._finalizer  # (a dead one has shut this run down at exit already)
        if fin is None or fin.detach() is not None:
            _shutdown(self._procs, self._conns, self._shms, force)
        self._procs, self._conns, self._locks, self._shms = [], [], [], []
        self._finalizer = None
        self._active, self._ahead = None, None
        with self._slot_lock:  # leases of this run's buffers are void (see release)
            self._free, self._leased = None, set()
            self._run += 1
