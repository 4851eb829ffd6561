"""The feed thread of a :class:`~seqloader.dataflow.pool.WorkerPool`: it pulls the
batches of encoded records from the reader stages, copies each into a free
shared-memory slot and hands it to its worker (NOTE [ worker lifecycle ])."""
from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Iterator, Protocol

from ..read.plan import EpochPlan
from .batch import BatchSpec, slot_views
from .firstbatch import part_layout, part_rngs
from .stats import StageCounters

__all__ = ["Feed", "FeedThread", "SlotPool", "Stopped"]


class Stopped(Exception):
    """Raised by a feed's ``batches`` when its ``stop`` event is set (checked at every
    record, so a reader filling a shuffle buffer from a slow disk stops promptly)."""


class Feed(Protocol):
    """What a feed thread reads from (``BatchData`` over the reader stages)."""

    def batches(self, plan: EpochPlan, first: int = 0, *, release: bool = True,
                stop: Any = None) -> Iterator[tuple[int, list[tuple[int, memoryview]]]]: ...

    def copy_into(self, value: memoryview, out: memoryview) -> None: ...


class SlotPool(Protocol):
    """What a feed thread fills (the :class:`~seqloader.dataflow.pool.WorkerPool`): shared
    buffers by slot, and its workers' queues."""

    #: the batch layout of every slot
    spec: BatchSpec
    #: the current epoch generation: workers skip batches of older ones
    generation: int
    #: where the feed thread's times go (NOTE [ pipeline counters ])
    counters: StageCounters

    def slot_buffer(self, slot: int) -> memoryview: ...

    def submit(self, worker: int, message: tuple) -> None: ...


class FeedThread(threading.Thread):
    """Feeds the batches of ``plan`` from ``first`` on, then those of each plan
    :meth:`extend` adds (the next epochs), into free buffers and to their workers.
    Uses only what :class:`SlotPool` declares."""

    def __init__(self, pool: SlotPool, feed: Feed, plan: EpochPlan, first: int,
                 free: "queue.Queue[int]"):
        super().__init__(name="seqloader-reader", daemon=True)
        self.pool, self.feed, self.free = pool, feed, free
        self.todo: list[tuple[EpochPlan, int]] = [(plan, first)]
        self.finished = False
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.error: tuple[BaseException, str] | None = None
        self.error_epoch: int | None = None  # the epoch being read when it failed
        #: cut the first batch fed across ``split`` workers (NOTE [ first batch split ])
        self.split = 0

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
        gen = self.pool.generation
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
        copy_into = self.feed.copy_into
        counters = pool.counters  # NOTE [ pipeline counters ]
        t, cpu = time.perf_counter(), time.thread_time()
        for j, recs in self.feed.batches(plan, first, release=False, stop=self.stop):
            got = time.perf_counter()
            slot = self._slot()
            if slot is None:
                return False
            free = time.perf_counter()
            _, _, whole = slot_views(pool.slot_buffer(slot), spec, 0)
            split, self.split = self.split, 0
            if split and self._split(plan, gen, j, recs, slot, whole, split, counters,
                                     (t, cpu, got, free)):
                t, cpu = time.perf_counter(), time.thread_time()
                continue
            start = spec.input_start([len(v) for _, v in recs])
            offsets, inline = [start], None
            if start is not None:  # NOTE [ batch buffer layout ]
                for _, v in recs:  # pread from the page cache: maps no file pages
                    copy_into(v, whole[offsets[-1]:offsets[-1] + len(v)])
                    offsets.append(offsets[-1] + len(v))
            else:
                inline = [bytes(v) for _, v in recs]
            del whole
            # (counted before it is sent: once the batch is out, the epoch may end)
            t, cpu = self._count(counters, t, cpu, got, free, recs)
            pool.submit(plan.worker_of(j), ("batch", gen, plan.epoch, j, slot, len(recs),
                                            offsets, [i for i, _ in recs], inline))
        return True

    @staticmethod
    def _count(counters: StageCounters, t: float, cpu: float, got: float, free: float,
               recs: list) -> tuple[float, float]:
        """Count a batch fed (NOTE [ pipeline counters ]); the clocks now."""
        now, now_cpu = time.perf_counter(), time.thread_time()
        counters.fed(got - t, free - got, now - free, now_cpu - cpu,
                     sum(len(v) for _, v in recs))
        return now, now_cpu

    def _split(self, plan: EpochPlan, gen: int, j: int, recs: list, slot: int, whole: Any,
               parts: int, counters: StageCounters, clocks: tuple) -> bool:
        """Feed batch ``j`` as ``parts`` parts, one per worker from ``j``'s own on (NOTE
        [ first batch split ]); False (nothing sent) when its records do not fit so."""
        spec = self.pool.spec
        layout = part_layout(spec, [len(v) for _, v in recs], parts)
        if layout is None:
            return False
        offsets = []
        for a, b, start in layout:
            off = [start]
            for _, v in recs[a:b]:
                self.feed.copy_into(v, whole[off[-1]:off[-1] + len(v)])
                off.append(off[-1] + len(v))
            offsets.append(off)
        values = [whole[o[i]:o[i + 1]] for o in offsets for i in range(len(o) - 1)]
        rngs = part_rngs(spec, values, layout, plan.epoch, j)
        del values
        w0, indices = plan.worker_of(j), [i for i, _ in recs]
        self._count(counters, *clocks, recs)
        for k, ((a, b, _), off, rng) in enumerate(zip(layout, offsets, rngs)):
            self.pool.submit((w0 + k) % plan.num_workers,
                             ("batch", gen, plan.epoch, j, slot, len(recs), off, indices[a:b],
                              None, (a, b, rng, parts)))
        return True
