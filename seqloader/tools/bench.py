"""``seqloader bench``: measure loading throughput in modes that separate the costs.

    seqloader bench PATH [--split train] [--loader seqloader|files|both] [--files DIR]
                         [--mode raw|decode|full|cpu-limit|all] [--workers 1,2,4]
                         [--batch-size 256] [--batches N] [--seconds S] [--warmup 2]
                         [--cache 5000] [--cold] [--quality] [--json] [--no-progress]

(also ``python -m seqloader.tools.bench ...``).  ``PATH`` is a database (a ``.lmdb`` file,
one shard of a set, or the folder holding ``ILSVRC-<split>.lmdb``) or, for
``--loader files``, a class-folder tree (``<dir>/<class>/<image>``, or an ImageNet
root holding ``<split>/``).  With a database ``PATH``, ``--files DIR`` names the
tree the files loader reads (the same images as individual files).

Loaders
    ``seqloader``  :class:`seqloader.Loader` (shuffle=True, its fused pipeline for
                   the ImageNet recipe, used automatically).
    ``files``      a ``torch.utils.data.DataLoader`` (shuffle=True, persistent
                   workers, same ``num_workers``/batch size) over one file per image,
                   decoded with the same OpenCV code (``decode_rgb``) and the same
                   (unfused) seqloader transforms; see :mod:`seqloader.tools.bench_files`.
Modes
    ``raw``        read and batch the encoded bytes, no decode (seqloader
                   ``transform=None``; files: read each file, list collate).
    ``decode``     full-resolution decode plus a 64 px centre crop (``CenterCrop(64)``,
                   negligible next to the decode; needed for fixed-size batches).
    ``full``       the ImageNet training transform: RandomResizedCrop(224) +
                   RandomHorizontalFlip + ToTensor + Normalize(ImageNet mean/std).
    ``cpu-limit``  no loader: :func:`cpu_limit`, the ``full`` decode+transform code
                   run by one process over 3,000 records held in memory;
                   ``images_per_s`` = per-process rate x min(workers, usable cores).
    ``all``        raw, decode and full.

Measured per (loader, mode, workers), after ``--warmup`` batches (excluded):
images/s and MB/s of encoded bytes (exact for raw and for files; for seqloader
decode/full, images x the database's mean encoded size: ``bytes_exact`` false);
time to first batch (from constructing the loader and calling ``iter()`` to the
first batch: includes worker start-up and shuffle-buffer fill); peak memory of the
process tree (the main process and every process it starts during the run,
sampled from ``/proc/<pid>/smaps_rollup`` every 1 s: sums of Rss, Pss,
USS = Private_Clean + Private_Dirty, and Anonymous); CPU utilisation (utime+stime
of the tree over the measured wall time, in % of one core).  Rss/Pss/USS include
file pages a process has mapped (seqloader's workers map the database, so pages of
it they touched count, as reclaimable page cache); Anonymous is the part the
kernel cannot drop.  MB = 10^6 bytes everywhere.  Measuring stops after
``--batches`` measured batches or ``--seconds`` measured seconds, whichever comes
first (default: 20 s); both loaders loop over epochs if the data runs out.

``--cold`` evicts the data's pages from the page cache before each run, without
root: ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every database file or image
file.  Residency is checked with ``mincore`` (every page of a database, a sample of
up to 2000 image files); it is only knowable for files you own or may write
(Linux >= 5.2), else reported as null.  Pages mapped by another process, and
directory/inode caches, cannot be dropped this way.  Before evicting, each cold run
is rehearsed for one batch (same loader and settings; results discarded) so the
*code* it runs -- OpenCV's decoder, torch's tensor conversion, worker start-up -- is
in the page cache, as it is on a machine whose libraries live on another disk than
the data: the cold run then measures the data's disk, not first-use faults in
shared libraries (under ``hddsim`` those share the throttled disk and each costs a
``read_ahead_kb`` read).  ``--no-rehearsal`` skips it.

JSON (``--json``; the only thing printed to stdout)::

    {"conditions": {
        "date", "hostname", "kernel", "platform", "python", "seqloader_version",
        "torch_version", "opencv_version", "cpu_model", "cpu_count", "cpu_affinity",
        "mem_total_mb", "mem_available_mb", "loaders": [str], "modes": [str],
        "workers": [int], "batch_size", "warmup", "batches", "seconds",
        "cache_state": "warm"|"cold", "cold_method", "seqloader_cache", "seed",
        "start_method", "split", "images", "mean_encoded_bytes",
        "mean_resolution": [height, width], "units", "notes": [str],
        "database": null | {"path", "files", "num_records", "num_classes",
                            "size_mb", "image_mb", "fits_in_ram", "storage", "sample"},
        "files":    null | {"root", "num_images", "num_classes", "scan_s",
                            "excluded_bad_files", "size_mb_estimate", "storage", "sample"}},
     "results": [{"loader", "mode", "workers", "batch_size", "images", "batches",
                  "seconds", "images_per_s", "mb_per_s", "bytes", "bytes_exact",
                  "first_batch_s", "peak_rss_mb", "peak_pss_mb", "peak_uss_mb",
                  "peak_anon_mb", "base_rss_mb", "base_pss_mb", "peak_processes",
                  "cpu_percent" (null under 1 s), "cpu_seconds", "cores", "cold": bool, "evicted",
                  "resident_before", "pipeline", "stopped", "warmup_batches", "epochs",
                  "per_process_images_per_s", "scale", "rehearsal_first_batch_s"
                  (first batch of the --cold rehearsal, else null), "disk_mb_per_s" (what
                  the data's block device delivered over the measured window, from
                  sysfs: the disk's view, which a read-ahead window or a shuffle buffer
                  cannot inflate), "major_faults" (page faults served from disk in the
                  window, machine-wide), "sample_records", "sample_mean_bytes",
                  "data_mean_bytes" (cpu-limit: the records it decoded in memory, their
                  mean size and the data's, NOTE [ a representative sample ]), "io"
                  (seqloader rows: "buffered" or "direct", how the reader read)
                  [, "leftover_processes"]}, ...],
     "quality": null | {"seqloader": [{"workers", "distinct_ratio",
                                       "epoch_correlation", "batch_size",
                                       "cache_per_reader", "chunk_size"} | {"workers", "error"}],
                        "files": null | {"distinct_ratio", "epoch_correlation"} | {"error"}}}

``sample`` = ``{"n", "mean_bytes", "mean_height", "mean_width", "mean_megapixels"}``
from ~100 records spread over the data; ``storage`` = ``{"mount", "device",
"fstype", "rotational"}`` (best effort, null where unknown).  Rows are ordered
loader, mode, workers; fields that do not apply (e.g. ``first_batch_s`` of
``cpu-limit``) are null.

Library use: :func:`measure` (any iterable of batches) and :func:`cpu_limit`.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import socket
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..read.direct import IO_MODES

__all__ = ["add_bench_arguments", "run_bench", "main", "bench", "format_report", "measure",
           "cpu_limit", "evict", "residency", "process_tree", "imagenet_train_transform",
           "decode_transform", "MODES", "LOADERS", "RESULT_KEYS"]

LOADERS = ("seqloader", "files")
MODES = ("raw", "decode", "full", "cpu-limit")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DECODE_CROP = 64
MB = 1e6
#: The keys of every result row, in order (``leftover_processes`` is added only when a
#: run's worker processes outlived it, which should never happen).
RESULT_KEYS = ("loader", "mode", "workers", "batch_size", "images", "batches", "seconds",
               "images_per_s", "mb_per_s", "bytes", "bytes_exact", "first_batch_s",
               "peak_rss_mb", "peak_pss_mb", "peak_uss_mb", "peak_anon_mb", "base_rss_mb",
               "base_pss_mb", "peak_processes", "cpu_percent", "cpu_seconds", "cores", "cold",
               "evicted", "resident_before", "pipeline", "stopped", "warmup_batches", "epochs",
               "per_process_images_per_s", "scale", "rehearsal_first_batch_s",
               "disk_mb_per_s", "major_faults", "sample_records", "sample_mean_bytes",
               "data_mean_bytes", "io")
_SAMPLE = 100
_RESIDENCY_FILES = 2000
_DIRTY_S = 120
#: Shortest measured window with a CPU figure (CPU times have clock-tick resolution).
MIN_CPU_WINDOW = 1.0


def imagenet_train_transform():
    """RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize (ImageNet)."""
    from .. import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def decode_transform():
    """The ``decode`` mode's transform: a 64 px centre crop of the decoded image."""
    from .. import transforms as T

    return T.CenterCrop(DECODE_CROP)


def _transform_for(mode: str):
    if mode == "raw":
        return None
    if mode == "decode":
        return decode_transform()
    return imagenet_train_transform()


# =========================================================================== /proc sampling

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_SMAPS_KEYS = {b"Rss:": "rss", b"Pss:": "pss", b"Private_Clean:": "uss",
               b"Private_Dirty:": "uss", b"Anonymous:": "anon"}


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's ``children`` list)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def _children_by_scan(root: int) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


_HAVE_CHILDREN_FILE = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def process_tree(root: int | None = None) -> list[int]:
    """``root`` (default: this process) and all its live descendants."""
    root = os.getpid() if root is None else root
    if _HAVE_CHILDREN_FILE:
        get = _children
    else:
        table = _children_by_scan(root)
        get = lambda p: table.get(p, [])  # noqa: E731
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(get(p))
    return out


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime (fields 14, 15)


def _smaps(pid: int) -> dict[str, int] | None:
    """kB of Rss, Pss, USS (Private_Clean + Private_Dirty) and Anonymous of ``pid``."""
    out = {"rss": 0, "pss": 0, "uss": 0, "anon": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                key = _SMAPS_KEYS.get(line.split(None, 1)[0]) if line.strip() else None
                if key:
                    out[key] += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return out


class _TreeMonitor:
    """Samples the memory of this process plus its descendants (except ``exclude``) in
    a background thread; tracks peaks and each process's last CPU time.

    Sampling is not free: ``smaps_rollup`` walks a process's page tables (~7 ms of CPU
    for a worker of the warm benchmark, ~22 ms a sample for the tree), CPU the measured
    pipeline then lacks.  So the thread waits ``interval`` seconds or, when longer,
    1/``budget`` times what its last sample cost -- at most ``budget`` (1 %) of one
    core; :func:`measure` also samples at the first and the last batch."""

    def __init__(self, exclude: Iterable[int] = (), interval: float = 1.0,
                 budget: float = 0.01) -> None:
        self.root = os.getpid()
        self.exclude = set(exclude) - {self.root}
        self.interval = interval
        self.peak = {"rss": 0, "pss": 0, "uss": 0, "anon": 0}
        self.peak_processes = 0
        self.base: dict[str, int] | None = None
        self.last_cpu: dict[int, float] = {}
        self._lock = threading.Lock()
        self.own_cpu = 0.0  # CPU seconds spent sampling (smaps_rollup walks page tables)
        self.budget = budget
        self.last_cost = 0.0  # CPU seconds the last sample took
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pids(self) -> list[int]:
        return [p for p in process_tree(self.root) if p not in self.exclude]

    def sample(self) -> None:
        t0 = time.thread_time()
        try:
            self._sample()
        finally:
            cost = time.thread_time() - t0
            with self._lock:
                self.own_cpu += cost
                self.last_cost = cost

    def _sample(self) -> None:
        total = {"rss": 0, "pss": 0, "uss": 0, "anon": 0}
        n = 0
        for pid in self.pids():
            m = _smaps(pid)
            cpu = _cpu_seconds(pid)
            if m is None:
                continue
            n += 1
            for k in total:
                total[k] += m[k]
            if cpu is not None:
                with self._lock:
                    self.last_cpu[pid] = cpu
        with self._lock:
            if self.base is None:
                self.base = dict(total)
            for k in total:
                self.peak[k] = max(self.peak[k], total[k])
            self.peak_processes = max(self.peak_processes, n)

    def cpu_snapshot(self) -> dict[int, float]:
        snap = {}
        for pid in self.pids():
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                snap[pid] = cpu
        with self._lock:
            self.last_cpu.update(snap)
        return snap

    def cpu_since(self, start: dict[int, float], own_start: float = 0.0) -> float:
        """CPU seconds the tree used since ``start`` (processes that ended count up to
        their last sample), minus what this monitor spent sampling since its
        ``own_cpu`` was ``own_start``."""
        end = self.cpu_snapshot()
        total = sum(v - start.get(p, 0.0) for p, v in end.items())
        with self._lock:
            total += sum(self.last_cpu.get(p, v) - v for p, v in start.items() if p not in end)
            total -= self.own_cpu - own_start
        return max(0.0, total)

    def wait_s(self) -> float:
        """Seconds until the next background sample (see the class docstring)."""
        return max(self.interval, self.last_cost / self.budget)

    def _run(self) -> None:
        while not self._stop.wait(self.wait_s()):
            try:
                self.sample()
            except Exception:  # never let sampling kill a benchmark
                pass

    def start(self) -> "_TreeMonitor":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="seqloader-bench-monitor",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _mb_kb(kb: int | None) -> float | None:
    return None if kb is None else round(kb * 1024 / MB, 1)


# =========================================================================== measure

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
    from tqdm import tqdm

    if batches is not None and batches < 1:
        raise ValueError(f"batches must be >= 1 (or None), got {batches}")
    if seconds is not None and not 0 < seconds < math.inf:  # (NaN fails too)
        raise ValueError(f"seconds must be finite and > 0 (or None), got {seconds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    count = count or _default_count
    monitor = _TreeMonitor(exclude=process_tree()[1:], interval=interval).start()
    bar = tqdm(total=(warmup + batches) if batches else None, desc=desc, unit="batch",
               leave=False, disable=not progress, file=sys.stderr, dynamic_ncols=True)
    iterable = iterator = None
    n_img = n_bytes = n_batches = warm = 0
    first_batch_s = None
    stopped = "exhausted"
    cpu = 0.0
    t0 = time.perf_counter()
    t_start = t_end = t0
    cpu_start, own_start = monitor.cpu_snapshot(), monitor.own_cpu
    disk_start = disk_end = _disk_read_bytes(disk)
    faults_start = faults_end = _major_faults()
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
                    disk_start = _disk_read_bytes(disk)
                    faults_start = _major_faults()
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
        disk_end = _disk_read_bytes(disk)
        faults_end = _major_faults()
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
        "cores": _usable_cores(),
    }


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# =========================================================================== page cache

_libc: Any = None


def _get_libc() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _libc = lib
    return _libc


def _can_mincore(path: str) -> bool:
    """Linux (>= 5.2) reports page-cache residency of a file mapping only to its owner
    or to someone who may write it; for others mincore sees only its own mappings."""
    try:
        return os.stat(path).st_uid == os.geteuid() or os.access(path, os.W_OK)
    except OSError:
        return False


def _resident_pages(path: str, start: int = 0, stop: int | None = None
                    ) -> tuple[int, int] | None:
    """(resident pages, total pages) of ``path`` -- or of its bytes ``[start, stop)``,
    ``start`` page-aligned -- via mmap + mincore, or None."""
    if not sys.platform.startswith("linux") or not _can_mincore(path):
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    if start % page:
        raise ValueError(f"start must be a multiple of the page size ({page}), got {start}")
    libc = _get_libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size if stop is None else min(stop, os.fstat(fd).st_size)
        total = -(-(size - start) // page) if size > start else 0
        resident = 0
        window = 1 << 30
        for off in range(start, size, window):
            length = min(window, size - off)
            addr = libc.mmap(None, length, 1, 1, fd, off)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * (-(-length // page)))()
                if libc.mincore(ctypes.c_void_p(addr), length, vec) != 0:
                    return None
                resident += int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1))
            finally:
                libc.munmap(ctypes.c_void_p(addr), length)
        return resident, total
    finally:
        os.close(fd)


def residency(paths: Sequence[str | Path], *, sample: int | None = None,
              seed: int = 0) -> float | None:
    """Fraction of the pages of ``paths`` (or of a random ``sample`` of them) that are in
    the page cache, weighted by size; None if it cannot be determined (mincore not
    available to this user for these files)."""
    paths = [str(p) for p in paths]
    if sample is not None and len(paths) > sample:
        idx = np.random.default_rng(seed).choice(len(paths), sample, replace=False)
        paths = [paths[i] for i in idx]
    res = tot = 0
    for p in paths:
        r = _resident_pages(p)
        if r is None:
            return None
        res, tot = res + r[0], tot + r[1]
    return res / tot if tot else 0.0


def evict(paths: Iterable[str | Path]) -> int:
    """Drop each file's pages from the page cache (no root needed):
    ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)``.  Dirty pages cannot be dropped, so
    a file modified in the last ``_DIRTY_S`` seconds (the kernel writes dirty pages back
    after ~30 s) is ``fdatasync``-ed first; older files are not (on ext4 every fsync
    flushes the disk's cache, which would be slow over many files).  Pages some process
    has mapped stay.  Returns the number of files advised."""
    if not hasattr(os, "posix_fadvise"):
        raise RuntimeError("--cold needs os.posix_fadvise (Linux)")
    n = 0
    now = time.time()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            if now - os.fstat(fd).st_mtime < _DIRTY_S:
                try:
                    os.fdatasync(fd)
                except OSError:
                    pass
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


# =========================================================================== data description

def _image_stats(blobs: Iterable[bytes]) -> dict[str, Any]:
    from ..format.jpeg import jpeg_info

    sizes, hs, ws = [], [], []
    for data in blobs:
        sizes.append(len(data))
        info = jpeg_info(data)
        if info is None:
            try:
                from ..transforms import decode_rgb

                info = decode_rgb(data).shape
            except ValueError:
                continue
        hs.append(info[0])
        ws.append(info[1])
    n = len(sizes)
    return {"n": n, "mean_bytes": round(float(np.mean(sizes)), 1) if n else None,
            "mean_height": round(float(np.mean(hs)), 1) if hs else None,
            "mean_width": round(float(np.mean(ws)), 1) if ws else None,
            "mean_megapixels": round(float(np.mean(np.multiply(hs, ws))) / 1e6, 4) if hs else None}


def _db_records(db: Any, indices: Iterable[int]) -> list[bytes]:
    """The packed record values of global ``indices`` (read in the calling process)."""
    from ..read.database import close_env, open_env
    from ..format.spec import encode_key

    if db.remote is not None:  # ranged GETs (NOTE [ remote reading ])
        from ..read.reader import RangeReader

        reader = RangeReader(db)
        try:
            return [bytes(reader.get(int(i))) for i in indices]
        finally:
            reader.close()
    out = []
    offsets = db.offsets
    envs = [open_env(p) for p in db.paths]
    try:
        txns = [e.begin() for e in envs]
        for i in indices:
            s = int(np.searchsorted(offsets, i, side="right")) - 1
            value = txns[s].get(encode_key(int(i - offsets[s])))
            if value is None:
                raise ValueError(f"{db.paths[s]}: record {i} is missing")
            out.append(bytes(value))
        for t in txns:
            t.abort()
    finally:
        for e in envs:
            close_env(e)
    return out


def _spread(n: int, k: int) -> list[int]:
    return sorted(set(np.linspace(0, n - 1, min(n, k)).astype(int).tolist())) if n else []


def _db_sample(db: Any, k: int = _SAMPLE) -> dict[str, Any]:
    import msgpack

    values = _db_records(db, _spread(db.num_records, k))
    return _image_stats(msgpack.unpackb(v, raw=False)["image"] for v in values)


def _files_sample(scan: Any, k: int = _SAMPLE) -> dict[str, Any]:
    blobs = []
    for i in _spread(len(scan.paths), k):
        with open(os.path.join(scan.root, scan.paths[i]), "rb") as f:
            blobs.append(f.read())
    return _image_stats(blobs)


def _storage(path: str | Path) -> dict[str, Any]:
    """Mount point, device, filesystem type and rotational flag of ``path`` (best effort)."""
    out: dict[str, Any] = {"mount": None, "device": None, "fstype": None, "rotational": None}
    try:
        real = os.path.realpath(path)
        best = ""
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, out["mount"], out["device"], out["fstype"] = mnt, mnt, dev, fstype
        dev = out["device"] or ""
        if dev.startswith("/dev/"):
            sysdev = os.path.realpath(f"/sys/class/block/{os.path.basename(os.path.realpath(dev))}")
            for d in (sysdev, os.path.dirname(sysdev)):
                rot = os.path.join(d, "queue", "rotational")
                if os.path.exists(rot):
                    with open(rot) as f:
                        out["rotational"] = f.read().strip() == "1"
                    break
    except OSError:
        pass
    return out


def _disk_read_bytes(device: str | None) -> int | None:
    """Bytes read so far from block ``device`` (e.g. ``/dev/vda``), from sysfs; None if
    unknown.  Whole-device counter: other readers of the same disk count too."""
    if not device or not device.startswith("/dev/"):
        return None
    try:
        name = os.path.basename(os.path.realpath(device))
        with open(f"/sys/class/block/{name}/stat") as f:
            return int(f.read().split()[2]) * 512
    except (OSError, ValueError, IndexError):
        return None


def _major_faults() -> int | None:
    """Page faults the kernel served from disk so far, machine-wide (/proc/vmstat)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("pgmajfault "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# =========================================================================== CPU limit

def cpu_limit(source: Any, transform: Callable | None, *, seconds: float = 3.0,
              records: int = 3000, seed: int = 0, stats: dict | None = None) -> float:
    """Images/s of the decode+transform code of one loader, in ONE process and thread,
    over encoded images already in memory (no I/O): the most one worker can deliver.

    ``source`` selects the code path.  A :class:`~seqloader.Database` (or a database
    path): what a seqloader worker does -- with a fused pipeline
    (``compile_fused(transform)``) the workers' own ``decode_batch`` over batches of 16
    records (unpack, draw, decode into preallocated samples: NOTE [ draw, then decode ]
    in ``seqloader/dataflow/batch.py``), or, for other transforms, msgpack-unpack +
    ``decode_rgb`` + transform + copy into a sample.  A
    :class:`~seqloader.Scan` or a sequence of image file paths: what the files loader
    does -- ``decode_rgb`` + transform.  ``records`` images spread over the data are
    read first; the loop runs whole passes over them until ``seconds`` have passed
    (OpenCV limited to one thread meanwhile).  Multiply by the cores used for the
    machine's limit.  ``stats``, if given, receives ``records`` and
    ``sample_mean_bytes`` (the encoded size of the sample: compare it with the data's
    mean -- decoding cost follows it).

    NOTE [ a representative sample ]: the sample must cost what the data costs.  Until
    commit 140b780 it was 300 records; on the 21,000-image benchmark set their mean
    size was 87.9 KB against the data's 99.2 KB, and the limit measured 878/s per
    process against 819/s over 3,000 records (99.3 KB: the data's mean), alternated
    three times -- the limit was overstated by ~7 %.  3,000 records (~300 MB in
    memory for ImageNet-sized images) put the sample's mean within ~1 % of the data's.
    """
    import cv2
    import msgpack

    from ..read.database import Database, open_database
    from ..dataflow.batch import BatchSpec, batch_rng, decode_batch
    from ..write.scan import Scan
    from ..transforms import adapt, compile_fused, decode_rgb

    if isinstance(source, (str, Path)):
        source = open_database(source)
    rng = batch_rng(seed, 0, 0, 0)
    if isinstance(source, Database):
        values = _db_records(source, _spread(source.num_records, records))
        fused = compile_fused(transform) if transform is not None else None
        fn = adapt(transform) if transform is not None and fused is None else None
        out = None
        units: list[Any] = values  # what one() is called with
        if fused is not None:  # runs of 16 records through decode_batch, as a worker does
            out = np.empty((16, *fused.out_shape), fused.out_dtype)
            spec = BatchSpec(mode="decode", batch_size=16, seed=seed, fused=fused,
                             sample_shape=fused.out_shape, sample_dtype=str(fused.out_dtype))
            labels = np.empty(16, np.int64)
            units = [values[k:k + 16] for k in range(0, len(values), 16)]
        elif fn is not None:
            first = msgpack.unpackb(values[0], raw=False)["image"]
            s = np.asarray(fn(decode_rgb(first), rng))
            out = np.empty((16, *s.shape), s.dtype)

        def one(i: int, value: Any) -> int:
            if fused is not None:
                decode_batch(spec, value, range(len(value)), labels[:len(value)],
                             out[:len(value)], rng)
                return len(value)
            rec = msgpack.unpackb(value, raw=False)
            if fn is not None:
                np.copyto(out[i % 16], np.asarray(fn(decode_rgb(rec["image"]), rng)),
                          casting="same_kind")
            return 1
    else:
        if isinstance(source, Scan):
            paths = [os.path.join(source.root, source.paths[i])
                     for i in _spread(len(source.paths), records)]
        else:
            paths = [str(source[i]) for i in _spread(len(source), records)]
        values = []
        for p in paths:
            with open(p, "rb") as f:
                values.append(f.read())
        units = values

        def one(i: int, value: Any) -> int:
            if transform is not None:
                np.ascontiguousarray(transform(decode_rgb(value)))
            return 1
    if not values:
        raise ValueError("cpu_limit: no records to measure")
    if stats is not None:
        stats.update(records=len(values),
                     sample_mean_bytes=round(sum(len(v) for v in values) / len(values), 1))
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        for i, v in enumerate(units[:5]):  # first-call allocations
            one(i, v)
        n, t0 = 0, time.perf_counter()
        while True:
            for v in units:
                n += one(n, v)
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
    finally:
        cv2.setNumThreads(threads)
    return n / dt


# =========================================================================== runs

class _Epochs:
    """Loop a seqloader Loader over epochs until closed."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.epochs = loader, 0
        self.io: str | None = None  # how the loader's reader read ("buffered"/"direct")

    def __iter__(self):
        if len(self.loader) == 0:
            ld = self.loader
            raise ValueError(f"{ld.db.num_records} record(s) in the database make no batch of "
                             f"{ld.batch_size} (drop_last={ld.drop_last}, world size "
                             f"{ld.world_size}): benchmark a split that has images")
        while True:
            self.epochs += 1
            yield from self.loader

    def close(self) -> None:
        feeder = self.loader._feeder  # (gone once closed)
        if feeder is not None:
            self.io = "direct" if feeder.reader.direct else "buffered"
        self.loader.close()


class _Sources:
    """What the runs read: a database and/or a scanned class-folder tree."""

    def __init__(self, args: argparse.Namespace, loaders: list[str]) -> None:
        from ..read.database import open_database
        from ..format.spec import database_splits
        from ..write.scan import image_tree_hint

        from ..read.remote import is_url

        remote = is_url(args.path)  # a database at a URL (NOTE [ remote reading ])
        p = args.path if remote else Path(args.path)
        if not remote and not p.exists():
            raise FileNotFoundError(f"{p} does not exist (expected a seqloader database or a "
                                    "class-folder tree)")
        if args.split is None and not remote and not p.is_file():
            args.split = (database_splits(p) or ["train"])[0]  # (info and verify's rule)
        elif args.split is None and remote and not p.endswith(".lmdb"):
            args.split = "train"
        self.db = None
        self.db_path = p
        is_db = remote or p.is_file() or (p.is_dir() and any(p.glob(f"ILSVRC-{args.split}*.lmdb")))
        if is_db:  # a file of another split than --split is an error
            self.db = open_database(p, args.split)
            if args.split is None:  # a file, no --split: its own
                args.split = self.db.metas[0].split
        self.split = args.split
        files_dir = args.files if args.files else (None if is_db else p)
        if "seqloader" in loaders and self.db is None:
            tree = image_tree_hint(p)
            raise ValueError((f"{tree}; or" if tree else
                              f"{p} is not a seqloader database (no ILSVRC-{args.split}.lmdb or "
                              "shards there); create one with `seqloader preprocess`, or")
                             + " benchmark the folder's images with --loader files")
        self.scan = None
        self.scan_s = None
        self.files_excluded = 0
        if "files" in loaders:
            if files_dir is None:
                raise ValueError(f"the files loader reads a class-folder tree, and {p} is a "
                                 "database: pass the image folder with --files DIR")
            from .bench_files import resolve_tree
            from ..write.scan import scan_class_tree

            root = resolve_tree(files_dir, args.split)
            t = time.perf_counter()
            self.scan = scan_class_tree(root)
            self.scan_s = time.perf_counter() - t
            if not len(self.scan):
                raise ValueError(f"no images found under {root}")
            if self.db is not None:  # read the images the database holds, no others
                self.scan, self.files_excluded = _without_bad_files(self.scan, self.db)
        self.mean_db_bytes = (self.db.image_bytes / self.db.num_records
                              if self.db is not None and self.db.num_records else 0.0)

    def image_paths(self) -> list[str]:
        return [os.path.join(self.scan.root, q) for q in self.scan.paths]

    def data_paths(self, loader: str) -> list[str]:
        return [str(q) for q in self.db.paths] if loader == "seqloader" else self.image_paths()


def _without_bad_files(scan: Any, db: Any) -> tuple[Any, int]:
    """``scan`` without the source files preprocessing skipped as bad (the database's
    ``bad_files``, paths relative to the split folder as in the scan), so that both
    loaders read the same images and the files loader does not fail on one that
    cannot be decoded; and how many were left out."""
    import dataclasses

    from ..write.writer import stored_name

    bad = {p for m in db.metas for p, _ in m.bad_files}  # (as stored: non-UTF-8 bytes escaped)
    keep = [i for i, q in enumerate(scan.paths) if stored_name(q) not in bad]
    if len(keep) == len(scan.paths):
        return scan, 0
    return (dataclasses.replace(scan, paths=[scan.paths[i] for i in keep],
                                labels=scan.labels[keep]), len(scan.paths) - len(keep))


def _conditions(args: argparse.Namespace, src: _Sources, loaders: list[str], modes: list[str],
                workers: list[int]) -> dict[str, Any]:
    import multiprocessing as mp

    import cv2
    import torch

    from .. import __version__

    mem = _meminfo()
    db_info = files_info = None
    if src.db is not None:
        db = src.db
        size = db.file_bytes
        db_info = {"path": str(src.db_path), "files": [str(q) for q in db.paths],
                   "num_records": db.num_records, "num_classes": len(db.classes),
                   "size_mb": round(size / MB, 3), "image_mb": round(db.image_bytes / MB, 3),
                   "fits_in_ram": bool(mem.get("MemTotal")) and size < mem.get("MemTotal", 0),
                   "storage": _storage(db.paths[0]), "sample": _db_sample(db)}
    if src.scan is not None:
        sample = _files_sample(src.scan)
        files_info = {"root": str(src.scan.root), "num_images": len(src.scan),
                      "num_classes": len(src.scan.classes), "scan_s": round(src.scan_s, 3),
                      "excluded_bad_files": src.files_excluded,
                      "size_mb_estimate": round((sample["mean_bytes"] or 0) * len(src.scan) / MB, 3),
                      "storage": _storage(src.scan.root), "sample": sample}
    main_info = db_info or files_info
    s = main_info["sample"]
    try:
        uname = os.uname()
        kernel = f"{uname.sysname} {uname.release}"
    except AttributeError:
        kernel = platform.platform()
    cold = bool(args.cold)
    notes = [
        "first_batch_s: from constructing the loader and iter() to the first batch, "
        "including worker start-up and the shuffle-buffer fill",
        f"rates exclude the first {args.warmup} batch(es) of each run",
        "memory: peak sums over the main process and the processes started during the run "
        "(Rss double-counts shared pages; Pss splits them; USS = private pages; all include "
        "mapped file pages of the data, Anonymous does not)",
        "cpu_percent: utime+stime of that process tree / measured wall time; 100 = one core "
        f"(clock-tick resolution, 1/{_CLK_TCK} s; not given for windows under "
        f"{MIN_CPU_WINDOW:g} s)",
        f"decode mode = full decode + {DECODE_CROP} px centre crop; full mode = "
        "RandomResizedCrop(224)+flip+ToTensor+Normalize (seqloader: fused pipeline with "
        "reduced-scale JPEG decoding; files: decode_rgb + the unfused transforms)",
        "seqloader decode/full MB/s = images/s x the database's mean encoded size",
    ]
    if cold:
        notes.append("cold: data pages evicted with posix_fadvise(DONTNEED) before each run; "
                     "directory/inode caches stay warm; pages mapped by other processes stay"
                     + ("" if args.no_rehearsal else "; each run rehearsed for one batch first, "
                        "so library code is cached (rehearsal_first_batch_s)"))
    if max(workers) > _usable_cores():
        notes.append(f"some runs use more workers ({max(workers)}) than usable cores "
                     f"({_usable_cores()})")
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "kernel": kernel, "platform": platform.platform(),
        "python": platform.python_version(), "seqloader_version": __version__,
        "torch_version": torch.__version__, "opencv_version": cv2.__version__,
        "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "cpu_affinity": _usable_cores(),
        "mem_total_mb": round(mem["MemTotal"] / MB) if "MemTotal" in mem else None,
        "mem_available_mb": round(mem["MemAvailable"] / MB) if "MemAvailable" in mem else None,
        "loaders": loaders, "modes": modes, "workers": workers, "batch_size": args.batch_size,
        "warmup": args.warmup, "batches": args.batches, "seconds": args.seconds,
        "cache_state": "cold" if cold else "warm",
        "cold_method": "posix_fadvise(POSIX_FADV_DONTNEED) per file before each run" if cold else None,
        "seqloader_cache": args.cache, "seed": args.seed,
        "start_method": args.start_method or mp.get_start_method(allow_none=True) or
        mp.get_context().get_start_method(),
        "split": args.split,
        "images": db_info["num_records"] if db_info else files_info["num_images"],
        "mean_encoded_bytes": s["mean_bytes"],
        "mean_resolution": [s["mean_height"], s["mean_width"]],
        "units": "MB = 10^6 bytes; rates per second of wall time",
        "notes": notes, "database": db_info, "files": files_info,
    }


def _run_one(args: argparse.Namespace, src: _Sources, loader: str, mode: str, workers: int,
             progress: bool) -> dict[str, Any]:
    transform = _transform_for(mode)
    B = args.batch_size
    holder: dict[str, Any] = {}
    if loader == "seqloader":
        from ..loader import Loader

        def make():
            ld = Loader(src.db_path, args.split, transform, batch_size=B, shuffle=True,
                        num_workers=workers, cache=args.cache, seed=args.seed,
                        start_method=args.start_method, io=args.io, rank=0, world_size=1)
            holder["it"] = _Epochs(ld)
            return holder["it"]

        if mode == "raw":
            count = lambda b: (len(b[0]), sum(len(x) for x in b[0]))  # noqa: E731
        else:
            mean = src.mean_db_bytes
            count = lambda b: (len(b[1]), int(round(len(b[1]) * mean)))  # noqa: E731
        pipeline = ("raw read" if mode == "raw" else "fused decode+transform" if mode == "full"
                    else "decode+transform")
    else:
        from .bench_files import FilesDataset, FilesLoader

        def make():
            ds = FilesDataset(src.scan.root, src.scan.paths, src.scan.labels, transform)
            holder["it"] = FilesLoader(ds, batch_size=B, num_workers=workers, seed=args.seed,
                                       start_method=args.start_method)
            return holder["it"]

        count = lambda b: (len(b[1]), int(b[2]))  # noqa: E731
        pipeline = "raw read" if mode == "raw" else "decode+transform"
    row: dict[str, Any] = {"loader": loader, "mode": mode, "workers": workers, "batch_size": B,
                           "cold": bool(args.cold), "evicted": None, "resident_before": None}
    paths = src.data_paths(loader)
    if args.cold and not args.no_rehearsal:
        rehearsal = measure(make, batches=1, warmup=0, count=count, progress=False)
        _wait_children_gone(rehearsal)
        row["rehearsal_first_batch_s"] = rehearsal["first_batch_s"]
    if args.cold:
        evict(paths)
        row["evicted"] = True
    row["resident_before"] = _residency_of(paths, loader)
    try:
        res = measure(make, batches=args.batches, seconds=args.seconds, warmup=args.warmup,
                      count=count, progress=progress, desc=f"{loader} {mode} w={workers}",
                      disk=_storage(paths[0])["device"] if paths else None)
    except Exception as e:
        if loader != "files":
            raise
        # a DataLoader worker's error arrives as "Caught ... Original Traceback ...": its
        # last line is the error itself
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise RuntimeError(f"the files loader ({mode}, {workers} workers) failed: "
                           f"{lines[-1]}") from e
    _wait_children_gone(res)
    row.update(res)
    if workers > 0 and res["peak_processes"] == 1:
        pipeline += " (in the main process: the loader started no workers)"
    row.update(bytes_exact=not (loader == "seqloader" and mode != "raw"), pipeline=pipeline,
               epochs=getattr(holder.get("it"), "epochs", None),
               io=getattr(holder.get("it"), "io", None))
    return _row(row)


def _row(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as a result row: every key of :data:`RESULT_KEYS` (None if absent)."""
    row = {k: values.get(k) for k in RESULT_KEYS}
    if values.get("leftover_processes"):
        row["leftover_processes"] = values["leftover_processes"]
    return row


def _residency_of(paths: list[str], loader: str) -> float | None:
    r = residency(paths, sample=None if loader == "seqloader" else _RESIDENCY_FILES)
    return None if r is None else round(r, 4)


def _wait_children_gone(res: dict[str, Any], timeout: float = 10.0) -> None:
    """Workers were closed; make sure none outlives its run (they would skew the next)."""
    before = set(_BYSTANDERS)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in process_tree()[1:] if p not in before and _alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        res["leftover_processes"] = left


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


_BYSTANDERS: set[int] = set()


def _cpu_limit_rows(args: argparse.Namespace, src: _Sources, loader: str,
                    workers: list[int]) -> list[dict[str, Any]]:
    seconds = min(args.seconds, 5.0) if args.seconds else 3.0
    source = src.db if loader == "seqloader" else src.scan
    t = time.perf_counter()
    sample: dict[str, Any] = {}
    per = cpu_limit(source, imagenet_train_transform(), seconds=seconds, seed=args.seed,
                    stats=sample)
    spent = time.perf_counter() - t
    mean = src.mean_db_bytes if loader == "seqloader" else \
        (_files_sample(src.scan)["mean_bytes"] or 0.0)
    rows = []
    for w in workers:
        scale = min(max(1, w), _usable_cores())
        rate = per * scale
        rows.append(_row({
            "loader": loader, "mode": "cpu-limit", "workers": w, "batch_size": args.batch_size,
            "seconds": round(spent, 3), "images_per_s": round(rate, 2),
            "mb_per_s": round(rate * mean / MB, 3), "bytes_exact": False,
            "cpu_percent": round(100.0 * scale, 1), "cores": _usable_cores(), "cold": False,
            "pipeline": ("fused decode+transform, in memory" if loader == "seqloader"
                         else "decode+transform, in memory"),
            "per_process_images_per_s": round(per, 2), "scale": scale,
            "sample_records": sample.get("records"),
            "sample_mean_bytes": sample.get("sample_mean_bytes"),
            "data_mean_bytes": round(mean, 1) if mean else None}))
    return rows


def _reader_cache(loader: Any) -> int:
    """The shuffle buffer (records) one reader of ``loader`` uses: the Loader's own
    figure (its whole ``cache`` with one reader per rank; ``cache // num_workers``
    when each worker reads), falling back to ``loader.cache``."""
    try:
        return int(loader._producer_spec().cache)
    except Exception:
        return int(loader.cache)


def _quality(args: argparse.Namespace, src: _Sources, loaders: list[str],
             workers: list[int]) -> dict[str, Any]:
    from .quality import distinct_ratio, epoch_correlation, shuffle_quality

    out: dict[str, Any] = {"seqloader": None, "files": None}
    if "seqloader" in loaders:
        from ..loader import Loader

        rows = []
        for w in workers:
            ld = Loader(src.db_path, args.split, None, batch_size=args.batch_size, shuffle=True,
                        num_workers=w, cache=args.cache, seed=args.seed, rank=0, world_size=1)
            try:
                q = shuffle_quality(src.db.labels(), ld.plan_spec, cache=_reader_cache(ld))
                rows.append({"workers": w, "distinct_ratio": round(q.distinct_ratio, 4),
                             "epoch_correlation": round(q.epoch_correlation, 4),
                             "batch_size": q.batch_size, "cache_per_reader": q.cache,
                             "chunk_size": q.chunk_size})
            except ValueError as e:
                rows.append({"workers": w, "error": str(e)})
            finally:
                ld.close()
        out["seqloader"] = rows
    if "files" in loaders:
        labels = np.asarray(src.scan.labels, np.int64)
        rng = np.random.default_rng(args.seed)
        a, b = rng.permutation(len(labels)), rng.permutation(len(labels))
        try:
            out["files"] = {"distinct_ratio": round(float(np.mean(
                [distinct_ratio(labels, o, args.batch_size) for o in (a, b)])), 4),
                "epoch_correlation": round(epoch_correlation(a, b), 4)}
        except ValueError as e:
            out["files"] = {"error": str(e)}
    return out


# =========================================================================== output

def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _cache_cell(r: dict[str, Any]) -> str:
    state = "cold" if r["cold"] else ("memory" if r["mode"] == "cpu-limit" else "warm")
    if r.get("resident_before") is not None:
        state += f" {100 * r['resident_before']:.0f}%"
    elif r.get("evicted"):
        state += " (evicted with fadvise; residency unknown)"
    return state


def format_report(doc: dict[str, Any]) -> str:
    """The human-readable report of a :func:`run_bench` JSON document."""
    c = doc["conditions"]
    lines = [f"seqloader bench  {c['date']}  host {c['hostname']}  {c['kernel']}",
             f"  seqloader {c['seqloader_version']}, Python {c['python']}, torch "
             f"{c['torch_version']}, OpenCV {c['opencv_version']}",
             f"  CPU: {c['cpu_affinity']} usable core(s) (os.cpu_count {c['cpu_count']}), "
             f"{c['cpu_model'] or 'unknown model'}; RAM {_fmt(c['mem_total_mb'])} MB "
             f"({_fmt(c['mem_available_mb'])} MB available)"]
    d, f = c["database"], c["files"]
    if d:
        st = d["storage"]
        lines.append(f"  database: {d['path']} ({c['split']}): {d['num_records']} records, "
                     f"{d['num_classes']} classes, {d['size_mb']:.1f} MB on disk"
                     f"{' (fits in RAM)' if d['fits_in_ram'] else ' (larger than RAM)'}; "
                     f"{_storage_str(st)}")
    if f:
        lines.append(f"  files: {f['root']}: {f['num_images']} images, {f['num_classes']} "
                     f"classes, ~{f['size_mb_estimate']:.1f} MB (scan {f['scan_s']:.2f} s); "
                     f"{_storage_str(f['storage'])}")
        if f.get("excluded_bad_files"):
            lines.append(f"    ({f['excluded_bad_files']} file(s) left out: the ones "
                         "preprocessing skipped as bad, listed in the database)")
    for name, info in (("database", d), ("files", f)):
        if info:
            s = info["sample"]
            lines.append(f"  {name} sample of {s['n']}: mean {_fmt(s['mean_bytes'], '.0f')} "
                         f"bytes encoded, mean {_fmt(s['mean_width'], '.0f')}x"
                         f"{_fmt(s['mean_height'], '.0f')} px (w x h)")
    stop = " or ".join(x for x in (f"{c['batches']} batches" if c["batches"] else "",
                                   f"{c['seconds']:g} s" if c["seconds"] else "") if x)
    lines.append(f"  runs: batch size {c['batch_size']}, workers {','.join(map(str, c['workers']))}, "
                 f"warm-up {c['warmup']} batch(es), then {stop or 'one pass'}; page cache "
                 f"{c['cache_state']}; seqloader cache {c['seqloader_cache']} records; start "
                 f"method {c['start_method']}")
    lines.append(f"  {c['units']}; first batch includes loader construction and worker "
                 "start-up; CPU % of one core")
    head = (f"{'loader':<10} {'mode':<9} {'wk':>3} {'images/s':>9} {'MB/s':>8} {'1st s':>6} "
            f"{'RSS MB':>7} {'PSS MB':>7} {'USS MB':>7} {'CPU %':>6} {'batches':>7} "
            f"{'images':>7}  cache")
    lines += ["", head, "-" * len(head)]
    for r in doc["results"]:
        mbs = _fmt(r["mb_per_s"], ".1f") + ("" if r["bytes_exact"] else "*")
        lines.append(
            f"{r['loader']:<10} {r['mode']:<9} {r['workers']:>3} {_fmt(r['images_per_s'], '.1f'):>9} "
            f"{mbs:>8} {_fmt(r['first_batch_s'], '.2f'):>6} {_fmt(r['peak_rss_mb'], '.0f'):>7} "
            f"{_fmt(r['peak_pss_mb'], '.0f'):>7} {_fmt(r['peak_uss_mb'], '.0f'):>7} "
            f"{_fmt(r['cpu_percent'], '.0f'):>6} {_fmt(r['batches']):>7} {_fmt(r['images']):>7}  "
            f"{_cache_cell(r)}")
        if r["mode"] == "cpu-limit":
            lines[-1] += (f"  ({r['per_process_images_per_s']:.1f}/s per process x "
                          f"{r['scale']})")
        if "no workers" in (r.get("pipeline") or ""):
            lines[-1] += "  (no worker processes)"
        if r.get("leftover_processes"):
            lines[-1] += f"  (!) processes left: {r['leftover_processes']}"
    lines.append("* estimated: images x mean encoded size.  cache: state and % of the data's "
                 "pages resident before the run (mincore; '-' if unknown)")
    q = doc.get("quality")
    if q:
        lines.append("")
        lines.append("shuffle quality (1.0 / 0.0 = a uniform per-epoch shuffle): "
                     "distinct-labels ratio, epoch-to-epoch correlation")
        for row in q.get("seqloader") or []:
            if "error" in row:
                lines.append(f"  seqloader workers {row['workers']}: {row['error']}")
            else:
                lines.append(f"  seqloader workers {row['workers']}: {row['distinct_ratio']:.3f}, "
                             f"{row['epoch_correlation']:.3f} (shuffle buffer {row['cache_per_reader']} "
                             f"records, chunk {row['chunk_size']})")
        if q.get("files"):
            fq = q["files"]
            lines.append(f"  files (uniform): {fq['error']}" if "error" in fq else
                         f"  files (uniform): {fq['distinct_ratio']:.3f}, "
                         f"{fq['epoch_correlation']:.3f}")
    return "\n".join(lines)


def _storage_str(st: dict[str, Any]) -> str:
    rot = {True: "rotational", False: "non-rotational", None: "rotational unknown"}[st["rotational"]]
    return f"{st['fstype'] or '?'} on {st['device'] or '?'} ({rot})"


# =========================================================================== CLI

def _split_list(values: Sequence[str] | None) -> list[str]:
    return [x.strip() for v in values or [] for x in str(v).split(",") if x.strip()]


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``seqloader bench`` arguments to ``p``."""
    from ..read.plan import DEFAULT_CACHE

    p.add_argument("path", metavar="PATH",
                   help="a database (.lmdb file, or the folder holding ILSVRC-<split>.lmdb) "
                        "or, for --loader files, a class-folder tree")
    p.add_argument("--split", help="split name (default: a database file's own; for a folder, "
                                   "train, or its first split without train: bench measures one)")
    p.add_argument("--loader", choices=("seqloader", "files", "both"), default="seqloader",
                   help="what to measure (%(default)s)")
    p.add_argument("--files", metavar="DIR",
                   help="class-folder tree (or a root holding <split>/) for --loader files "
                        "when PATH is a database")
    p.add_argument("--mode", action="append", metavar="MODE",
                   help="raw, decode, full, cpu-limit or all (= raw,decode,full); repeat or "
                        "comma-separate (default: all)")
    p.add_argument("--workers", action="append", metavar="N",
                   help="worker processes; repeat or comma-separate, e.g. 1,2,4 "
                        "(default: the usable cores)")
    p.add_argument("--batch-size", type=int, default=256, help="images per batch (%(default)s)")
    p.add_argument("--batches", type=int, metavar="N",
                   help="measured batches per run (after warm-up)")
    p.add_argument("--seconds", type=float, metavar="S",
                   help="measured seconds per run (default 20 if --batches is not given)")
    p.add_argument("--warmup", type=int, default=2, metavar="K",
                   help="batches excluded from the rates (%(default)s)")
    p.add_argument("--cache", type=int, default=DEFAULT_CACHE,
                   help="seqloader's shuffle buffer in records, the Loader's cache= (%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="shuffle/augmentation seed (%(default)s)")
    p.add_argument("--io", choices=IO_MODES, default="auto",
                   help="seqloader's reads: through the page cache or direct I/O, the Loader's "
                        "io= (%(default)s: direct for databases larger than half the RAM)"),
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"),
                   help="worker start method for both loaders (default: the platform's)")
    p.add_argument("--cold", action="store_true",
                   help="evict the data from the page cache before each run (fadvise, no root)")
    p.add_argument("--no-rehearsal", action="store_true",
                   help="with --cold: do not rehearse each run for one batch before evicting the "
                        "data (then first-use faults in libraries count too)")
    p.add_argument("--quality", action="store_true", help="also report shuffle-quality metrics")
    p.add_argument("--json", action="store_true", help="print one JSON document (see module doc)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _parse(args: argparse.Namespace) -> tuple[list[str], list[str], list[int]]:
    loaders = list(LOADERS) if args.loader == "both" else [args.loader]
    modes: list[str] = []
    for m in _split_list(args.mode) or ["all"]:
        for x in (("raw", "decode", "full") if m == "all" else (m,)):
            if x not in MODES:
                raise ValueError(f"--mode {m!r}: use raw, decode, full, cpu-limit or all")
            if x not in modes:
                modes.append(x)
    try:
        workers = [int(w) for w in _split_list(args.workers)] or [_usable_cores()]
    except ValueError:
        raise ValueError(f"--workers {args.workers}: give integers, e.g. 1,2,4") from None
    if any(w < 0 for w in workers):
        raise ValueError(f"--workers must be >= 0, got {workers}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be >= 1, got {args.batches}")
    if args.seconds is not None and not 0 < args.seconds < math.inf:  # (NaN fails too)
        raise ValueError(f"--seconds must be a finite number > 0, got {args.seconds} "
                         "(for a fixed amount of work give --batches N instead)")
    if args.cache < 1:
        raise ValueError(f"--cache must be >= 1, got {args.cache}")
    if args.batches is None and args.seconds is None:
        args.seconds = 20.0
    return loaders, modes, list(dict.fromkeys(workers))


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by ``args`` (see :func:`add_bench_arguments`) and
    return the JSON document."""
    from multiprocessing import resource_tracker

    loaders, modes, workers = _parse(args)
    src = _Sources(args, loaders)
    progress = not args.no_progress
    conditions = _conditions(args, src, loaders, modes, workers)
    # start multiprocessing's resource tracker (a child process seqloader's shared memory
    # needs) now, so it is not counted in the first run's memory and every run is alike
    resource_tracker.ensure_running()
    _BYSTANDERS.clear()
    _BYSTANDERS.update(process_tree()[1:])
    results: list[dict[str, Any]] = []
    try:
        for loader in loaders:
            for mode in modes:
                if mode == "cpu-limit":
                    results.extend(_cpu_limit_rows(args, src, loader, workers))
                    continue
                for w in workers:
                    results.append(_run_one(args, src, loader, mode, w, progress))
    except Exception:
        if results:  # what was measured before the failure is not lost
            print("seqloader bench: a run failed; the runs before it measured:\n"
                  + format_report({"conditions": conditions, "results": results,
                                   "quality": None}), file=sys.stderr)
        raise
    quality = _quality(args, src, loaders, workers) if args.quality else None
    return {"conditions": conditions, "results": results, "quality": quality}


def run_bench(args: argparse.Namespace) -> int:
    """``seqloader bench``: measure, print the report (or JSON), return 0.  Errors
    (bad path, bad arguments) raise FileNotFoundError/ValueError naming the problem."""
    doc = bench(args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(format_report(doc))
    sys.stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import FormatError

    ap = argparse.ArgumentParser(prog="seqloader bench",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run_bench(args)
    except (FormatError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"seqloader bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seqloader bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
