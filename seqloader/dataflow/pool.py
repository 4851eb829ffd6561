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
* Epoch: a feed thread in the parent (:class:`~seqloader.dataflow.feedthread.FeedThread`
  over the reader stages, see NOTE [ one reader per rank ]) takes a free buffer per batch, copies the batch's
  encoded records into it and sends ``batch`` to worker ``j % W`` over its pipe
  (and, told the next epoch's plan, goes on into it when this one's records are
  handed out: the workers start on the next epoch while the last batches are
  consumed, instead of idling at every epoch boundary while the shuffle buffer
  refills; a next epoch that is not the one expected cancels that work);
  the worker decodes into the same buffer and answers ``done`` with its wall and CPU
  time (NOTE [ pipeline counters ]); the first batch a new feed thread sends goes to
  every worker in parts (NOTE [ first batch split ]); the parent takes
  the answers in plan order and hands the buffer to the caller, who either copies
  it out or *leases* it (:meth:`WorkerPool.lease`: the batch tensor is a view of
  the buffer, which returns to the pool when the tensor is garbage-collected).
  Only small messages cross the pipes; bytes and pixels stay in shared memory (a
  batch too large for its buffer's input region goes by pipe).
* Waits, dead and stuck workers, shutdown: :class:`~seqloader.workers.processgroup.ProcessGroup`
  (NOTE [ pool shutdown ]); ``timeout`` bounds how long one batch may take.
* Errors: a worker that fails on a record sends the :class:`RecordError`'s fields;
  the parent cancels the epoch and raises it (NOTE [ one error contract ]).
* Break/``close``/GC: an unfinished epoch is cancelled: the feed thread stops,
  a shared generation counter makes workers skip queued batches, and each worker
  acknowledges, so the next epoch starts clean.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Iterator

import numpy as np

from ..errors import RecordError, SeqloaderError, WorkerDiedError, WorkerError
from ..read.plan import EpochPlan
from .batch import BatchSpec, slot_views
from .decode import batch_rng
from .feedthread import Feed, FeedThread
from .firstbatch import splittable
from ..workers.processgroup import ProcessGroup, kill, serve, unmap_later
from ..workers.threads import prepare_worker
from .stats import StageCounters

__all__ = ["WorkerPool", "WorkerError", "WorkerDiedError"]


# ------------------------------------------------------------------ worker side

def _worker_main(spec: BatchSpec, names: list[str], generation: Any, conn: Connection,
                 main_pid: int) -> None:
    prepare_worker(torch_ops=spec.transform is not None or spec.target_transform is not None)
    shms = [SharedMemory(name) for name in names]

    def handle(msg: tuple) -> None:
        if msg[0] == "cancel":
            conn.send(("cancelled", msg[1]))
            return
        _, gen, epoch, j, slot, n, offsets, indices, inline, *part = msg
        if gen == generation.value:  # (else the epoch was cancelled: skip queued work fast)
            conn.send(_decode(spec, shms[slot].buf, epoch, j, slot, n, offsets, indices, inline,
                              *part))
    try:
        serve(conn, main_pid, handle)
    finally:
        for shm in shms:
            try:
                shm.close()
            except BufferError:  # a view is still referenced (an error's frame): exiting
                unmap_later(shm)


def _decode(spec: BatchSpec, buf: Any, epoch: int, j: int, slot: int, n: int,
            offsets: list[int], indices: list[int], inline: list[bytes] | None,
            part: tuple | None = None) -> tuple:
    """Decode batch ``j`` (or records ``[a, b)`` of it, ``part = (a, b, generator,
    parts)``: NOTE [ first batch split ]) into its buffer; the answer for the parent."""
    t, cpu = time.perf_counter(), time.process_time()  # NOTE [ pipeline counters ]
    labels, samples, whole = slot_views(buf, spec, n)
    a, b, rng, parts = part if part is not None else (0, n, None, 1)
    try:
        values = inline if inline is not None else [
            whole[offsets[i]:offsets[i + 1]].data for i in range(b - a)]
        if part is not None:  # (rng None: an earlier record's draw failed, this part waits)
            if rng is not None:
                spec.mode.fill(spec, whole, values, indices, labels[a:b], samples[a:b], rng)
            return ("done", epoch, j, slot, b - a, time.perf_counter() - t,
                    time.process_time() - cpu, parts)
        rng = batch_rng(spec.seed, epoch, spec.rank, j)
        spec.mode.fill(spec, whole, values, indices, labels, samples, rng)  # NOTE [ decode modes ]
        return ("done", epoch, j, slot, n, time.perf_counter() - t, time.process_time() - cpu)
    except RecordError as e:
        return ("error", epoch, j, slot, e)
    except Exception as e:  # pragma: no cover - decode_batch wraps per-record errors
        return ("error", epoch, j, slot, RecordError.of(e, indices[0] if indices else -1,
                                                         where=f"batch {j}"))
    finally:
        del labels, samples, whole


# ------------------------------------------------------------------ parent side

def _weak_call(method: Any, *args: Any) -> Any:
    """``method(*args)`` as a callable that does not keep ``method``'s object alive."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        m = ref()
        if m is not None:
            m(*args)
    return call


class WorkerPool:
    """``num_workers`` decode processes fed by a feed thread, yielding batches in plan order.

    Created in the parent; processes start on first use and persist across epochs
    until :meth:`close`.  Not thread-safe, not reentrant: one epoch at a time (a new
    :meth:`epoch` cancels an unfinished one).  The spec must be picklable for the
    ``spawn``/``forkserver`` start methods.  The feed thread uses only the public
    :meth:`slot_buffer`, :meth:`submit` and :attr:`generation`.
    """

    def __init__(self, spec: BatchSpec, num_workers: int, *, prefetch: int = 2,
                 start_method: str | None = None, timeout: float = 0,
                 start_timeout: float = 120):
        if prefetch < 1:
            raise ValueError(f"prefetch (batches per worker in flight) must be >= 1, got {prefetch}")
        if not timeout >= 0:  # (NaN, which would silently mean no limit, fails too)
            raise ValueError(f"timeout must be >= 0 seconds (0 = no limit), got {timeout}")
        self.group = ProcessGroup(num_workers, start_method=start_method,
                                  start_timeout=start_timeout)
        self.group.on_failure = _weak_call(self._stop_reader, True)
        self.spec, self.num_workers, self.prefetch = spec, num_workers, prefetch
        self.timeout = timeout
        self._generation: Any = None
        self._reader: FeedThread | None = None
        self._active: int | None = None  # epoch with batches possibly in flight
        self._ahead: tuple[EpochPlan, Feed] | None = None  # read ahead after an epoch
        self._consuming: int | None = None  # the epoch whose batches the caller takes
        self._slot_lock = threading.Lock()
        self._free: queue.Queue[int] | None = None
        self._leased: set[int] = set()  # buffers the caller holds as batch tensors
        self._run = 0  # counts closes: a lease token (slot numbers are reused by restarts)
        self._sent: dict[tuple[int, int], float] = {}  # (epoch, batch) -> when submitted
        #: the stages' counters the workers' and the feed thread's figures go to
        #: (NOTE [ pipeline counters ])
        self.counters = StageCounters()

    # ------------------------------------------------ the feed thread's API
    @property
    def generation(self) -> int:
        """The current epoch generation (workers skip batches of older ones)."""
        return self._generation.value

    def slot_buffer(self, slot: int) -> Any:
        """The shared-memory buffer of batch slot ``slot``."""
        return self.group.shms[slot].buf

    def submit(self, w: int, msg: tuple) -> None:
        """Send ``msg`` (a ``batch`` message) to worker ``w``."""
        self._sent[(msg[2], msg[3])] = time.monotonic()
        self.group.send(w, msg)

    # ------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        return self.group.started

    @property
    def pids(self) -> list[int]:
        return self.group.pids

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.prefetch

    @property
    def shared_memory_names(self) -> list[str]:
        """The names of the batch buffers (unlinked once every worker has attached)."""
        return [s.name.lstrip("/") for s in self.group.shms]

    @property
    def leased(self) -> frozenset[int]:
        """The slots whose buffers the caller holds as batch tensors."""
        return frozenset(self._leased)

    @property
    def ahead(self) -> EpochPlan | None:
        """The plan of the epoch the workers went on into after the last one, or None."""
        return None if self._ahead is None else self._ahead[0]

    @property
    def free_slots(self) -> int:
        """Buffers waiting for the reader (all of them before it starts an epoch)."""
        return self.num_slots if self._free is None else self._free.qsize()

    def start(self) -> None:
        if self.started:
            return
        self.close()  # a pool closed by its finalizer or a dead worker starts afresh
        shms = []
        try:
            shms = [SharedMemory(create=True, size=self.spec.slot_nbytes)
                    for _ in range(self.num_slots)]
            self._generation = self.group.ctx.RawValue("q", 0)
        except BaseException:
            for shm in shms:
                shm.close()
                shm.unlink()
            raise
        names = [s.name for s in shms]
        self.group.start(_worker_main, lambda w: (self.spec, names, self._generation), shms)

    def _check_reader(self, doing: str) -> None:
        reader = self._reader
        # a failure while reading ahead into the next epoch is that epoch's to report
        if (reader is not None and reader.error is not None
                and reader.error_epoch in (None, self._consuming)):
            err, tb = reader.error
            self._cancel()
            if isinstance(err, SeqloaderError) and not isinstance(err, WorkerError):
                # a domain error (RemoteError, FormatError...) keeps its type, whatever
                # num_workers (NOTE [ one error contract ]); its own traceback is the
                # reader thread's, kept as `reader_traceback` too
                if getattr(err, "reader_traceback", None) is None:
                    err.reader_traceback = tb
                    err.add_note(f"(raised in the seqloader reader thread during {doing})")
                raise err
            raise WorkerError(f"seqloader reader thread failed during {doing}: "
                              f"{type(err).__name__}: {err}\n\nReader traceback:\n{tb}") from err

    def _recv(self, w: int, timeout: float, doing: str, batch: tuple[int, int] | None = None
              ) -> Any:
        since = None if batch is None else (lambda: self._sent.get(batch))
        msg = self.group.recv(w, timeout, doing, check=lambda: self._check_reader(doing),
                              since=since)
        if batch is not None:
            self._sent.pop(batch, None)
        return msg

    def _feed(self, feed: Feed, plan: EpochPlan, first: int, free: "queue.Queue[int]",
              then: EpochPlan | None = None) -> None:
        self._reader = FeedThread(self, feed, plan, first, free)
        if splittable(self.spec, self.num_workers):  # NOTE [ first batch split ]
            self._reader.split = self.num_workers
        if then is not None:
            self._reader.extend(then)
        self._reader.start()

    def epoch(self, plan: EpochPlan, feed: Feed, first_batch: int = 0,
              next_plan: EpochPlan | None = None
              ) -> Iterator[tuple[int, int, tuple[np.ndarray, np.ndarray], int]]:
        """Yield ``(j, n, (labels, samples) views, slot)`` for batches ``j >= first_batch`` in
        plan order, the batches' records read by ``feed``.  The views are valid until the
        next item is requested -- copy them out -- unless the caller leases the slot
        (:meth:`lease`).  Finite; cancels itself if closed early.  With ``next_plan`` the
        feed goes on into that epoch once this one's records are handed out, so the
        workers never wait at the epoch boundary; a next call for ``next_plan`` from its
        first batch continues that work, any other call cancels it."""
        if plan.num_workers != self.num_workers:
            raise ValueError(f"plan is for {plan.num_workers} workers, pool has {self.num_workers}")
        self.start()
        ahead, self._ahead = self._ahead, None
        reader = self._reader
        go_on = (ahead is not None and ahead[0] == plan and ahead[1] is feed
                 and first_batch == 0 and reader is not None and self._free is not None)
        if go_on and next_plan is not None and not reader.extend(next_plan):
            # the reader is done (its error, if any, is set before it says so): a new one
            # reads the epoch after this, unless this one's reading failed
            go_on = reader.error is None
            if go_on:
                self._feed(feed, next_plan, 0, self._free)
        if go_on and reader.error is None:
            free = self._free  # this epoch is already being read: go on
        else:
            self._cancel()
            with self._slot_lock:
                free = queue.Queue()
                for s in range(self.num_slots):
                    if s not in self._leased:
                        free.put(s)
                self._free = free
            self._feed(feed, plan, first_batch, free, next_plan)
        self._active = self._consuming = plan.epoch
        finished = False
        try:
            for j in range(first_batch, plan.num_batches):
                w = plan.worker_of(j)
                msg = self._recv(w, self.timeout, f"batch {j} of epoch {plan.epoch}",
                                 (plan.epoch, j))
                for k in range(msg[7] if len(msg) > 7 else 1):  # NOTE [ first batch split ]
                    if k:
                        w = (plan.worker_of(j) + k) % self.num_workers
                        msg = self._recv(w, self.timeout, f"batch {j} of epoch {plan.epoch}")
                    if msg[0] == "error":
                        err: RecordError = msg[4]
                        self._cancel()
                        raise err.in_worker(w, self.group.pid(w)) from err.remote_cause()
                    self.counters.decoded(*msg[4:7])
                kind, epoch, got, slot = msg[:4]
                if (kind, epoch, got) != ("done", plan.epoch, j):  # pragma: no cover - invariant
                    raise AssertionError(f"expected batch {j} of epoch {plan.epoch} from worker "
                                         f"{w}, got {msg[:3]}")
                labels, samples, _ = slot_views(self.slot_buffer(slot), self.spec,
                                                plan.batch_sizes[j])
                try:
                    yield j, plan.batch_sizes[j], (labels, samples), slot
                finally:
                    del labels, samples
                    with self._slot_lock:
                        if slot not in self._leased:
                            free.put(slot)
            finished = True
            if next_plan is not None:  # its batches may be in flight already
                self._ahead, self._active = (next_plan, feed), next_plan.epoch
            else:
                self._active = None
        finally:
            if not finished and self._active is not None and self.started:  # closed early
                try:
                    self._cancel()
                except Exception:
                    self.close()

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

    def _stop_reader(self, force: bool) -> bool:
        """NOTE [ pool shutdown ] step 1: stop and join the feed thread; False if it is
        still blocked (sending to a worker that reads nothing)."""
        reader, self._reader = self._reader, None
        if reader is None:
            return True
        reader.stop.set()
        if force:
            kill(self.group.procs)
        reader.join(30)
        return not reader.is_alive()

    def _cancel(self) -> None:
        """Stop an unfinished epoch: stop the reader, make workers skip queued batches and
        wait until every worker has acknowledged."""
        self._ahead = None
        self._sent.clear()
        if not self._stop_reader(force=False):  # blocked sending to a stuck worker
            self.close(force=True)
            return
        if self._active is None or not self.started:
            self._active = None
            return
        epoch, self._active = self._active, None
        self._generation.value += 1
        for w in range(self.num_workers):
            self.group.send(w, ("cancel", epoch))
        for w in range(self.num_workers):
            while self._recv(w, 30, "cancel")[0] != "cancelled":
                pass

    def close(self, force: bool = False) -> None:
        """Stop the feed thread and the workers and free the shared memory (NOTE [ pool
        shutdown ]).  Idempotent.  ``force`` (after a timeout or a dead worker) kills the
        workers first: a stuck one reads nothing, and the feed thread may be blocked
        sending to it."""
        self._stop_reader(force)
        self.group.close(force)
        self._active, self._ahead = None, None
        with self._slot_lock:  # leases of this run's buffers are void (see release)
            self._free, self._leased = None, set()
            self._run += 1
