"""The readahead thread of buffered reading (NOTE [ sequential I/O ] in
:mod:`seqloader.read.buffered`)."""
from __future__ import annotations

import ctypes
import os
import queue
import threading
import time

import numpy as np

from .pages import LIBC as _LIBC, PAGE as _PAGE

__all__ = ["Prefetcher"]


def _missing(addr: int, n: int, vec: ctypes.Array, gap: int) -> list[tuple[int, int]] | None:
    """The parts of the mapped range ``[addr, addr + n)`` that are not in the page cache
    (``mincore``), as ``(offset into the range, length)`` runs -- runs closer than
    ``gap`` bytes are merged, so a disk still sees few, large requests.  ``[]`` when
    all of it is cached; None when unsure (no libc, an error, or a kernel that only
    reports pages this process has mapped -- then the whole range is read)."""
    if _LIBC is None or n <= 0:
        return None
    start = addr & ~(_PAGE - 1)
    pages = (addr + n - start + _PAGE - 1) // _PAGE
    if pages > len(vec):
        return None
    if _LIBC.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * _PAGE), vec) != 0:
        return None
    absent = (np.frombuffer(vec, np.uint8, pages) & 1) == 0
    if not absent.any():
        return []
    edges = np.flatnonzero(np.diff(absent.view(np.int8), prepend=0, append=0))
    runs: list[tuple[int, int]] = []  # page runs [first, last) not cached
    for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):
        if runs and (a - runs[-1][1]) * _PAGE < gap:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    lead = addr - start
    out = []
    for a, b in runs:
        lo, hi = max(a * _PAGE - lead, 0), min(b * _PAGE - lead, n)
        out.append((lo, hi - lo))
    return out



class Prefetcher(threading.Thread):
    """Reads queued blocks ``(key, fd, offset, length, address)`` with large ``pread``
    calls, so their pages are cached before the cursor needs them; of a block partly in
    the page cache only the missing runs of pages are read (``mincore``; runs less than
    :attr:`GAP` apart as one request), and a block wholly cached is skipped without
    copying -- so a warm epoch over a file the kernel evicted a few pages of (memory
    reclaim) re-reads those pages, not 16 MiB blocks.  ``done`` is the key of
    the last block known to be cached -- keys increase in queue order, and a failed
    read stops ``done`` from advancing.  Errors are otherwise ignored: the cursor then
    reads the pages itself (and reports real errors)."""

    BLOCK = 16 << 20
    FIRST_BLOCK = 2 << 20  # an epoch's first blocks ramp up from here (first batch sooner)
    #: Uncached runs of a block closer than this are read as one request (a disk reads
    #: 1 MiB in less time than one seek; the page cache holds the rest already).
    GAP = 1 << 20

    def __init__(self) -> None:
        super().__init__(name="seqloader-readahead", daemon=True)
        self.spans: queue.Queue = queue.Queue()
        self.buf = bytearray(self.BLOCK)
        self.vec = (ctypes.c_ubyte * (self.BLOCK // _PAGE + 1))()
        self.done: tuple = ()
        self.progress = threading.Condition()
        self.failed_key: tuple | None = None
        self.skipped = self.read_bytes = 0  # blocks found cached, bytes read

    def run(self) -> None:
        view = memoryview(self.buf)
        while (item := self.spans.get()) is not None:
            key, fd, off, n, addr = item
            if self.failed_key is not None and key[0] == self.failed_key[0]:
                continue  # this pass already failed: the cursor reads the rest itself
            runs = None if addr is None else _missing(addr, n, self.vec, self.GAP)
            if runs == []:
                self.skipped += 1
                self._advance(key)
                continue
            try:
                for lo, length in runs if runs is not None else [(0, n)]:
                    pos, end = off + lo, off + lo + length
                    while pos < end:
                        got = os.preadv(fd, [view[:min(end - pos, self.BLOCK)]], pos)
                        if got <= 0:
                            raise OSError("short read")
                        pos += got
                        self.read_bytes += got
            except OSError:
                with self.progress:
                    self.failed_key = key
                    self.progress.notify_all()
                continue
            self._advance(key)

    def _advance(self, key: tuple) -> None:
        with self.progress:
            self.done = key
            self.progress.notify_all()

    def wait_for(self, key: tuple, timeout: float = 30.0) -> bool:
        """Wait (GIL released) until the block ending at ``key`` is cached; False if its
        pass failed, the thread died, or ``timeout`` passed -- the caller then reads the
        bytes itself."""
        deadline = None
        with self.progress:
            while self.done < key:
                if self.failed_key is not None and self.failed_key[0] == key[0]:
                    return False
                if not self.is_alive():
                    return False
                if deadline is None:
                    deadline = time.monotonic() + timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.progress.wait(min(left, 1.0))
        return True

    def discard_queued(self) -> None:
        """Forget blocks queued by an earlier pass (an epoch that was cut short)."""
        try:
            while True:
                item = self.spans.get_nowait()
                if item is None:  # keep a stop request
                    self.spans.put(None)
                    return
        except queue.Empty:
            pass

    def stop(self) -> None:
        self.spans.put(None)
        self.join(5)

