"""The measurement loop: time the batches of any iterable after a warm-up, with the
memory and CPU of the process tree and the disk's reads over the measured window."""
from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Iterable

from .machine import TreeMonitor, disk_read_bytes, major_faults, process_tree, usable_cores

__all__ = ["measure", "MB", "MIN_CPU_WINDOW"]

MB = 1e6
#: Shortest measured window with a CPU figure (CPU times have clock-tick resolution).
MIN_CPU_WINDOW = 1.0


def _mb_kb(kb: int | None) -> float | None:
    return None if kb is None else round(kb * 1024 / MB, 1)


def _default_count(batch: Any) -> tuple[int, int]:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(first, list) and (not first or isinstance(first[0], (bytes, memoryview))):
        return len(first), sum(len(b) for b in first)
    return len(first), 0


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


def measure(make_iterable: Callable[[], Iterable], *, batches: int | None = None,
            seconds: float | None = None, warmup: int = 2,
            count: Callable[[Any], tuple[int, int]] | None = None,
            progress: bool = False, desc: str | None = None,
            interval: float = 1.0, disk: str | None = None) -> dict[str, Any]:
    """Time the batches of ``make_iterable()``; return a dict of figures.

    ``make_iterable`` is called inside the timing (construct the loader in it, so the
    time to the first batch includes construction, ``iter()`` and worker start-up);
    ``measure`` owns the result and calls ``close()`` on the iterator and the
    iterable (when they have one) before returning, also on error.  The first
    ``warmup`` batches are excluded from the rates (with ``warmup=0`` the measured
    time starts before ``make_iterable()``); then it counts until ``batches``
    measured batches or ``seconds`` measured seconds (whichever comes first; both
    None: until the iterable ends).  ``count(batch) -> (images, encoded bytes)``
    (default: a list of bytes first -> its length and total size, else
    ``len(batch[0])`` and 0 bytes).

    Returns ``images, batches, bytes, seconds, images_per_s, mb_per_s, first_batch_s,
    warmup_batches, stopped`` ("batches", "seconds" or "exhausted"), ``disk_mb_per_s``
    (bytes block device ``disk`` -- e.g. ``"/dev/vda"`` -- delivered over the measured
    window; None without ``disk``), ``major_faults`` (page faults served from disk over
    that window, machine-wide: on a cold run, code or data faulted in at random),
    ``peak_rss_mb, peak_pss_mb, peak_uss_mb, peak_anon_mb`` (sums over this process
    and the processes started during the call, sampled every ``interval`` s -- each
    sample reads ``smaps_rollup``, which walks the page tables: ~9 ms of CPU per
    process of a full-pipeline Loader, so sampling every 0.2 s took ~6 % of a
    2-core machine; the monitor's own CPU is left out of ``cpu_*``),
    ``base_rss_mb, base_pss_mb`` (this process at the start), ``peak_processes``,
    ``cpu_seconds`` and ``cpu_percent`` (utime+stime of that tree over the measured
    wall time; 100 = one core busy; None for windows under :data:`MIN_CPU_WINDOW`
    seconds, since CPU times come in clock ticks) and ``cores`` (usable by this
    process).  Rates are None when no batch was measured.
    """
    from ...progress import progress_bar

    if batches is not None and batches < 1:
        raise ValueError(f"batches must be >= 1 (or None), got {batches}")
    if seconds is not None and not 0 < seconds < math.inf:  # (NaN fails too)
        raise ValueError(f"seconds must be finite and > 0 (or None), got {seconds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    count = count or _default_count
    monitor = TreeMonitor(exclude=process_tree()[1:], interval=interval).start()
    bar = progress_bar(total=(warmup + batches) if batches else None, desc=desc, unit="batch",
                       leave=False, progress=progress, dynamic_ncols=True)
    iterable = iterator = None
    n_img = n_bytes = n_batches = warm = 0
    first_batch_s = None
    stopped = "exhausted"
    cpu = 0.0
    t0 = time.perf_counter()
    t_start = t_end = t0
    cpu_start, own_start = monitor.cpu_snapshot(), monitor.own_cpu
    disk_start = disk_end = disk_read_bytes(disk)
    faults_start = faults_end = major_faults()
    try:
        iterable = make_iterable()
        iterator = iter(iterable)
        for batch in iterator:
            now = time.perf_counter()
            if first_batch_s is None:
                first_batch_s = now - t0
                monitor.sample()
            bar.update(1)
            if warm < warmup:
                warm += 1
                del batch
                if warm == warmup:
                    t_start = t_end = time.perf_counter()
                    cpu_start, own_start = monitor.cpu_snapshot(), monitor.own_cpu
                    disk_start = disk_read_bytes(disk)
                    faults_start = major_faults()
                continue
            i, b = count(batch)
            del batch
            n_img, n_bytes, n_batches, t_end = n_img + i, n_bytes + b, n_batches + 1, now
            elapsed = now - t_start
            if n_batches % 8 == 0 and elapsed > 0:
                bar.set_postfix_str(f"{n_img / elapsed:.0f} img/s", refresh=False)
            if batches is not None and n_batches >= batches:
                stopped = "batches"
                break
            if seconds is not None and elapsed >= seconds:
                stopped = "seconds"
                break
        disk_end = disk_read_bytes(disk)
        faults_end = major_faults()
        monitor.sample()
        cpu = monitor.cpu_since(cpu_start, own_start)
    finally:
        bar.close()
        try:
            if iterator is not None and iterator is not iterable:
                _close(iterator)
            if iterable is not None:
                _close(iterable)
        finally:
            monitor.stop()
    dt = t_end - t_start
    rate = n_img / dt if n_batches and dt > 0 else None
    base = monitor.base or {}
    return {
        "images": n_img, "batches": n_batches, "bytes": n_bytes, "seconds": round(dt, 4),
        "images_per_s": None if rate is None else round(rate, 2),
        "mb_per_s": None if rate is None else round(n_bytes / dt / MB, 3),
        "first_batch_s": None if first_batch_s is None else round(first_batch_s, 4),
        "warmup_batches": warm, "stopped": stopped,
        "disk_mb_per_s": (None if disk_start is None or disk_end is None or not n_batches
                          or dt <= 0 else round((disk_end - disk_start) / dt / MB, 3)),
        "major_faults": (None if faults_start is None or faults_end is None or not n_batches
                         else faults_end - faults_start),
        "peak_rss_mb": _mb_kb(monitor.peak["rss"]), "peak_pss_mb": _mb_kb(monitor.peak["pss"]),
        "peak_uss_mb": _mb_kb(monitor.peak["uss"]), "peak_anon_mb": _mb_kb(monitor.peak["anon"]),
        "base_rss_mb": _mb_kb(base.get("rss")), "base_pss_mb": _mb_kb(base.get("pss")),
        "peak_processes": monitor.peak_processes, "cpu_seconds": round(cpu, 3),
        "cpu_percent": round(100 * cpu / dt, 1) if n_batches and dt >= MIN_CPU_WINDOW else None,
        "cores": usable_cores(),
    }

