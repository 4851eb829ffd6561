"""The machine and the process tree a benchmark runs on, from ``/proc`` and ``/sys`` (best
effort): storage of a path, disk and page-fault counters, memory and CPU model; the
processes of a run, their CPU time and memory, sampled by a background monitor."""
from __future__ import annotations

import os
import platform
import threading
import time
from pathlib import Path
from typing import Any, Iterable

__all__ = ["storage", "disk_read_bytes", "major_faults", "meminfo", "cpu_model", "process_tree",
           "cpu_seconds", "smaps", "alive", "usable_cores", "TreeMonitor", "CLK_TCK"]


def storage(path: str | Path) -> dict[str, Any]:
    """Mount point, device, filesystem type and rotational flag of ``path`` (best effort)."""
    out: dict[str, Any] = {"mount": None, "device": None, "fstype": None, "rotational": None}
    try:
        real = os.path.realpath(path)
        best = ""
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
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


def disk_read_bytes(device: str | None) -> int | None:
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


def major_faults() -> int | None:
    """Page faults the kernel served from disk so far, machine-wide (/proc/vmstat)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("pgmajfault "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
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


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def smaps(pid: int) -> dict[str, int] | None:
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


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class TreeMonitor:
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
            m = smaps(pid)
            cpu = cpu_seconds(pid)
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
            cpu = cpu_seconds(pid)
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

    def start(self) -> "TreeMonitor":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="seqloader-bench-monitor",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
