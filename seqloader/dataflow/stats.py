"""Counters of a running pipeline, near-free: what the caller waited for, what each stage
did, per epoch (NOTE [ pipeline counters ]).

NOTE [ pipeline counters ]
Three places count, each in the thread that does the work, with two clock reads per
batch (``time.perf_counter`` for wall time, ``time.thread_time``/``process_time`` for
CPU):
* the **workers** time each batch they decode (wall and process CPU) and send the two
  figures back in their ``done`` message; the parent adds them up as it takes the
  answers (:meth:`StageCounters.decoded`, in the consuming thread);
* the **feed thread** times, per batch, getting the records from the reader stages
  (the disk or the network, and the shuffle buffer), waiting for a free batch buffer,
  and copying the records into it (:meth:`StageCounters.fed`); its CPU time over the
  same span tells how much of it was *blocked* (wall minus CPU: waiting for I/O);
* the **Loader** times each ``next()`` from the caller's side: the wait inside it, and
  the share of that spent delivering (copying, pinning, moving) the batch
  (:class:`EpochMeter`).
The counters only grow; an epoch's figures (and the diagnosis window's,
:mod:`seqloader.dataflow.diagnosis`) are differences of two :meth:`StageCounters.snapshot`
s.  The feed thread writes its counters while the caller reads them: single float
additions under the GIL, so a reader sees each value whole, at worst one batch old.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["StageCounters", "Snapshot", "EpochMeter", "LoaderMeter", "format_stats", "STAT_KEYS",
           "epoch_figures", "pipeline_figures"]


@dataclass(frozen=True)
class Snapshot:
    """The cumulative counters at one moment (``t``: ``time.perf_counter()``)."""

    t: float = 0.0
    work_s: float = 0.0  # workers: wall time decoding, summed over workers
    work_cpu_s: float = 0.0  # workers: process CPU time decoding
    work_images: int = 0  # images the workers decoded
    read_s: float = 0.0  # feed thread: getting records from the reader stages
    copy_s: float = 0.0  # feed thread: copying them into batch buffers
    feed_cpu_s: float = 0.0  # feed thread: CPU over read + copy (+ submitting)
    slot_wait_s: float = 0.0  # feed thread: waiting for a free batch buffer
    read_bytes: int = 0  # encoded bytes the feed thread handed out
    waited_s: float = 0.0  # the caller: inside next(), summed
    deliver_s: float = 0.0  # the caller: of which delivering (copy, pin, to device)
    batches: int = 0  # delivered to the caller
    images: int = 0  # delivered to the caller

    def minus(self, other: "Snapshot") -> "Snapshot":
        """The counts between ``other`` (earlier) and this one."""
        return Snapshot(*(a - b for a, b in zip(self._values(), other._values())))

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in self.__dataclass_fields__)


class StageCounters:
    """The stages' counters (NOTE [ pipeline counters ]); one per Loader, kept across
    worker restarts.  Not locked: each field has one writing thread."""

    def __init__(self) -> None:
        self.work_s = self.work_cpu_s = 0.0
        self.work_images = 0
        self.read_s = self.copy_s = self.feed_cpu_s = self.slot_wait_s = 0.0
        self.read_bytes = 0
        self.waited_s = self.deliver_s = 0.0
        self.batches = self.images = 0

    def decoded(self, images: int, wall_s: float, cpu_s: float) -> None:
        """A worker's batch (or part of one): ``images`` in ``wall_s`` s, ``cpu_s`` of CPU."""
        self.work_s += wall_s
        self.work_cpu_s += cpu_s
        self.work_images += images

    def fed(self, read_s: float, slot_wait_s: float, copy_s: float, cpu_s: float,
            nbytes: int) -> None:
        """The feed thread's batch: the times of NOTE [ pipeline counters ]."""
        self.read_s += read_s
        self.slot_wait_s += slot_wait_s
        self.copy_s += copy_s
        self.feed_cpu_s += cpu_s
        self.read_bytes += nbytes

    def snapshot(self) -> Snapshot:
        return Snapshot(time.perf_counter(), self.work_s, self.work_cpu_s, self.work_images,
                        self.read_s, self.copy_s, self.feed_cpu_s, self.slot_wait_s,
                        self.read_bytes, self.waited_s, self.deliver_s, self.batches,
                        self.images)


@dataclass
class EpochMeter:
    """One epoch as the caller saw it: started at ``start`` (its ``iter()``), the wait of
    each ``next()`` (seconds) and the counters at the start and at the first batch."""

    epoch: int
    start: Snapshot
    waits: list[float] = field(default_factory=list)
    first_batch_s: float | None = None
    first: Snapshot | None = None  # after the first batch (the steady state starts)
    end: Snapshot | None = None  # when the epoch ended (None: in progress)


class LoaderMeter:
    """The Loader's side: epochs, the caller's waits, a rolling window of snapshots for
    the diagnosis.  ``window`` batches are kept (the diagnosis window)."""

    def __init__(self, counters: StageCounters, window: int = 50) -> None:
        self.counters = counters
        self.current: EpochMeter | None = None
        self.last: EpochMeter | None = None
        self.recent: deque[Snapshot] = deque(maxlen=window + 1)

    def begin(self, epoch: int) -> EpochMeter:
        """An iteration starts (its ``iter()``): the epoch's clock starts now."""
        self.finish()
        self.current = EpochMeter(epoch, self.counters.snapshot())
        self.recent.clear()
        return self.current

    def batch(self, images: int, waited_s: float, deliver_s: float) -> None:
        """The caller got a batch of ``images`` after waiting ``waited_s`` inside
        ``next()`` (of which ``deliver_s`` delivering it)."""
        c, m = self.counters, self.current
        c.waited_s += waited_s
        c.deliver_s += deliver_s
        c.batches += 1
        c.images += images
        m.waits.append(waited_s)
        snap = c.snapshot()
        if m.first is None:
            m.first, m.first_batch_s = snap, snap.t - m.start.t
        else:
            self.recent.append(snap)

    def finish(self) -> None:
        """The iteration in progress ended (its last batch, a break, a close)."""
        if self.current is not None:
            self.current.end = self.counters.snapshot()
            self.last, self.current = self.current, None

    def waited_over(self, share: float) -> bool:
        """Whether the caller waited more than ``share`` of the wall time over the full
        window (cheap: called at every batch)."""
        r = self.recent
        return (len(r) == r.maxlen
                and r[-1].waited_s - r[0].waited_s > share * (r[-1].t - r[0].t))

    def figures(self, last: bool, workers: int, engine: Any) -> dict[str, float]:
        """The figures of the epoch in progress (between epochs or with ``last``: the
        last that ended) and of the pipeline ``engine`` now; {} before any epoch."""
        ep = self.last if last or self.current is None else self.current
        if ep is None:
            return {}
        out = epoch_figures(ep, self.counters.snapshot(), workers)
        out.update(pipeline_figures(engine))
        return out

    def steady(self) -> Snapshot | None:
        """The counts to diagnose: during an epoch over the window (or all after its
        first batch, before the window is full); between epochs over the last one after
        its first batch (its end, when the stages run dry, would hide which one was
        behind).  None before a second batch."""
        ep = self.current or self.last
        d = self.window() if self.current is not None else None
        if d is None and ep is not None and ep.first is not None:
            d = (ep.end or self.counters.snapshot()).minus(ep.first)
        return None if d is None or d.batches == 0 else d

    def window(self) -> Snapshot | None:
        """The counts over the diagnosis window (the last ``window`` batches after the
        first), or None before it is full."""
        r = self.recent
        if len(r) < r.maxlen:
            return None
        return r[-1].minus(r[0])


#: The keys of :meth:`~seqloader.Loader.stats`, in the order :func:`format_stats` prints them.
STAT_KEYS = ("epoch", "batches", "images", "seconds", "images_per_s", "wait_s", "wait_share",
             "wait_p50_ms", "wait_p95_ms", "first_batch_s", "workers", "workers_busy",
             "images_per_cpu_s", "read_mb_per_s", "read_busy", "read_blocked", "feed_busy",
             "delivery_share", "shuffle_fill", "slots_free", "cache_hit_rate")


def epoch_figures(m: EpochMeter, now: Snapshot, workers: int) -> dict[str, float]:
    """The figures of epoch ``m`` up to ``now`` (its end if it ended): rates over its
    wall time from ``iter()`` on; the stage shares as fractions (0-1) of that time."""
    end = m.end or now
    d = end.minus(m.start)
    wall = max(d.t, 1e-9)
    waits = np.asarray(m.waits) if m.waits else np.zeros(1)
    p50, p95 = np.percentile(waits, [50, 95]) if m.waits else (0.0, 0.0)
    w = max(1, workers)
    return {
        "epoch": m.epoch, "batches": d.batches, "images": d.images, "seconds": round(wall, 3),
        "images_per_s": round(d.images / wall, 1),
        "wait_s": round(d.waited_s, 3), "wait_share": round(d.waited_s / wall, 3),
        "wait_p50_ms": round(1e3 * float(p50), 2), "wait_p95_ms": round(1e3 * float(p95), 2),
        "first_batch_s": round(m.first_batch_s, 3) if m.first_batch_s is not None else -1.0,
        "workers": workers,
        "workers_busy": round(d.work_s / (w * wall), 3) if workers else 0.0,
        "images_per_cpu_s": round(d.work_images / d.work_cpu_s, 1) if d.work_cpu_s > 0 else 0.0,
        "read_mb_per_s": round(d.read_bytes / wall / 1e6, 1),
        "read_busy": round((d.read_s + d.copy_s) / wall, 3),
        "read_blocked": round(max(0.0, d.read_s + d.copy_s - d.feed_cpu_s) / wall, 3),
        "feed_busy": round(1 - d.slot_wait_s / wall, 3) if workers else 0.0,
        "delivery_share": round(d.deliver_s / wall, 3),
    }


def format_stats(stats: dict[str, Any], keys: tuple[str, ...] | None = None) -> str:
    """``stats`` (a :meth:`~seqloader.Loader.stats` dict) as one line: shares as per cent,
    the rest as numbers, e.g. ``epoch 3 | 120 batches | 30720 img | 812 img/s | wait 4.1 %
    (p50 0.2 ms, p95 31 ms) | first batch 0.45 s | workers 2 at 97 % busy, 410 img/cpu-s |
    read 92 MB/s, 3 % blocked | delivery 1 % | shuffle 100 % | 2 slots free``."""
    s = stats
    g = s.get
    parts = [f"epoch {g('epoch', '?')}", f"{g('batches', 0)} batches", f"{g('images', 0)} img",
             f"{g('images_per_s', 0):.0f} img/s",
             f"wait {100 * g('wait_share', 0):.1f} % (p50 {g('wait_p50_ms', 0):.1f} ms, "
             f"p95 {g('wait_p95_ms', 0):.1f} ms)"]
    if g("first_batch_s", -1) >= 0:
        parts.append(f"first batch {g('first_batch_s'):.2f} s")
    if g("workers"):
        parts.append(f"workers {g('workers')} at {100 * g('workers_busy', 0):.0f} % busy, "
                     f"{g('images_per_cpu_s', 0):.0f} img/cpu-s")
    parts.append(f"read {g('read_mb_per_s', 0):.0f} MB/s, {100 * g('read_blocked', 0):.0f} % "
                 "blocked")
    parts.append(f"delivery {100 * g('delivery_share', 0):.0f} %")
    if "shuffle_fill" in s:
        parts.append(f"shuffle {100 * g('shuffle_fill'):.0f} %")
    if "slots_free" in s:
        parts.append(f"{g('slots_free')} slots free")
    if "cache_hit_rate" in s:
        parts.append(f"cache hits {100 * g('cache_hit_rate'):.0f} %")
    return " | ".join(parts)


def pipeline_figures(engine: Any) -> dict[str, float]:
    """What the pipeline holds now: the shuffle buffer's fill (0-1), the free batch
    buffers and, reading remotely with a block cache, its hit rate (0-1) -- each only
    where the pipeline has it."""
    out: dict[str, float] = {}
    df = getattr(engine, "df", None)
    while df is not None:  # (the stages down to the reader)
        buf = getattr(df, "buffer", None)
        if buf is not None:
            out["shuffle_fill"] = round(len(buf.items) / buf.buffer_size, 3)
            break
        df = getattr(df, "df", None)
    pool = getattr(engine, "pool", None)
    if pool is not None:
        out["slots_free"] = pool.free_slots
    try:
        source = engine.source.reader.byte_source
    except RuntimeError:  # (not iterated yet: nothing open)
        source = None
    cache = getattr(source, "cache", None)
    if cache is not None:
        n = cache.hits + cache.misses
        out["cache_hit_rate"] = round(cache.hits / n, 3) if n else 0.0
    return out
