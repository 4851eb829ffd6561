"""The machine a benchmark runs on: storage of a path, disk and page-fault counters,
memory and CPU model (best effort, from ``/proc`` and ``/sys``)."""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


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

