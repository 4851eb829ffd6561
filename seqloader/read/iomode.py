"""Which I/O mode a database is read with: buffered (through the page cache) or direct.

:func:`choose` applies NOTE [ direct I/O ] in :mod:`seqloader.read.direct`: ``io="auto"``
reads directly only a database larger than half the memory this process may fill with
page cache (:func:`physical_memory`: the RAM, or a lower cgroup limit).
"""
from __future__ import annotations

import os

__all__ = ["IO_MODES", "cgroup_memory_limit", "choose", "physical_memory"]

IO_MODES = ("auto", "buffered", "direct")


def physical_memory(root: str = "/") -> int:
    """Bytes of memory this process may fill with page cache: the physical memory, or
    its cgroup's limit when lower (a SLURM job or container is charged for the page
    cache its reads fill, so there the limit is what matters).  0 when unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        total = 0
    limit = cgroup_memory_limit(root)
    if limit and (not total or limit < total):
        return limit
    return total


def cgroup_memory_limit(root: str = "/") -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max`` or v1
    ``memory.limit_in_bytes``), None when there is none; ``root`` for tests."""
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            candidate = os.path.join(root, "sys/fs/cgroup", path.lstrip("/"), "memory.max")
        elif "memory" in controllers.split(","):
            candidate = os.path.join(root, "sys/fs/cgroup/memory", path.lstrip("/"),
                                     "memory.limit_in_bytes")
        else:
            continue
        try:
            with open(candidate) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 1 << 60:  # "max" / ~2^63: no limit
            return int(value)
    return None


def choose(io: str, total_bytes: int, memory: int | None = None) -> bool:
    """Whether to read with direct I/O: ``io`` is ``"direct"``, or ``"auto"`` and the
    database (``total_bytes``) is larger than half of ``memory`` (default:
    :func:`physical_memory`, which honours a cgroup limit), so the page cache could not
    keep it from one epoch to the next anyway."""
    if io not in IO_MODES:
        raise ValueError(f"io must be one of {', '.join(map(repr, IO_MODES))}, got {io!r}")
    if io != "auto":
        return io == "direct"
    memory = physical_memory() if memory is None else memory
    return memory > 0 and total_bytes > memory // 2
