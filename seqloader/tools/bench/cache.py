"""The page cache: how much of a set of files is resident (``mincore``), and evicting
them without root (``posix_fadvise``) for ``--cold`` runs."""
from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = ["residency", "evict", "residency_of", "resident_pages"]

_RESIDENCY_FILES = 2000
_DIRTY_S = 120


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


def resident_pages(path: str, start: int = 0, stop: int | None = None
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
        r = resident_pages(p)
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


def residency_of(paths: list[str], loader: str) -> float | None:
    r = residency(paths, sample=None if loader == "seqloader" else _RESIDENCY_FILES)
    return None if r is None else round(r, 4)

