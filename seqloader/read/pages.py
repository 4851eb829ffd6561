"""Helpers for file pages: where a file is mapped, which pages are mapped, and
releasing them from this process's page tables (Linux; no-ops where unavailable)."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ..format.meta import EXTENT_DTYPE

__all__ = ["PAGE", "LIBC", "map_base", "address", "unmap", "value_extents"]

PAGE = 4096


def map_base(path: str) -> int | None:
    """Start address of the mapping of ``path`` at file offset 0 in this process."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real and int(parts[2], 16) == 0:
                return int(parts[0].split("-")[0], 16)
    return None


try:
    LIBC = ctypes.CDLL(None, use_errno=True)
    LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
except (OSError, AttributeError):  # pragma: no cover - not Linux/glibc
    LIBC = None
_MADV_DONTNEED = 4


def unmap(start: int, length: int) -> None:
    """Drop ``[start, start + length)`` of a read-only file mapping from this process's
    page tables (the page cache keeps the bytes; touching them again is a minor fault).
    LMDB's cursor touches each record's first page and every B-tree page it passes,
    and the kernel maps cached neighbours around every fault (64 KiB of "fault-around",
    or a whole large folio -- 2 MiB runs were seen on ext4 here), so a walk that never
    reads the map would still leave much of it mapped: ~100 KB per record, and B-tree
    leaves (which LMDB's appends place after their records) touched again every epoch.
    The reader therefore unmaps the whole file every few MB walked: cheap, since
    unmapped page-table ranges are skipped."""
    if LIBC is not None and length > 0:
        LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_DONTNEED)


def address(view: memoryview) -> int:
    """The address of the first byte of ``view``."""
    return np.frombuffer(view, np.uint8).__array_interface__["data"][0]


def value_extents(path: str, env, keys) -> np.ndarray | None:
    """The extents (:data:`~seqloader.format.meta.EXTENT_DTYPE`: byte offset in the file,
    length) of the values of ``keys`` in the LMDB environment ``env`` open on ``path``, or
    None where its map cannot be located (no /proc).  Meant right after the keys' commit,
    when their pages are in the page cache: it reads nothing from disk, and it unmaps the
    whole map afterwards so the caller's RSS stays flat (NOTE [ mapped pages ])."""
    base = map_base(str(path))
    if base is None:
        return None
    out = np.empty(len(keys), EXTENT_DTYPE)
    with env.begin(buffers=True) as txn:
        for j, key in enumerate(keys):
            value = txn.get(key)
            out[j] = (address(value) - base, len(value))
            del value
    unmap(base, env.info()["map_size"])
    return out
