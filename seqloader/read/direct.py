"""Direct I/O: sequential reads that bypass the page cache.

NOTE [ direct I/O ]
Buffered reads put every byte of an epoch through the page cache.  For a split
larger than RAM (ImageNet's train split is ~140 GB) that buys nothing -- no page
survives to the next epoch -- and it costs twice: each epoch evicts every other
file the machine had cached (other users' data on a shared node), and the kernel
spends CPU filling, mapping and reclaiming fresh cache pages.  Measured under hddsim
(``benchmarks/read_cost.py``: 1,200 MiB of a benchmark file, 16 MiB requests, cold):
buffered ``pread`` 143-151 MiB/s at 0.8-2.8 s of CPU, all system time, varying from
run to run with the host (this VM backs a never-touched guest page on its first use,
so a fresh cache page can cost a host fault); ``O_DIRECT`` into reused huge-page
buffers 151.8 MiB/s at 0.01-0.09 s.  Up to ~0.2 ms per ImageNet record: up to 15 % of
this 2-core machine at 1,500 images/s; in the full pipeline under hddsim, direct I/O
ran at 185-194 % CPU where the page-cache path needed 195-198 % for 6-10 % fewer
images/s.

So, in direct mode, :class:`DirectStream` reads a pass's byte spans in 16 MiB
``O_DIRECT`` requests, ``depth`` at a time (2: one request waiting behind the other
hides each request's latency on disks and network file systems that have it; hddsim
reached 151.8 MiB/s with 1 or 2), into a fixed ring of huge-page buffers
(always the same memory, so no page is ever new; why huge pages: :func:`_ring`), and
copies each record out into its own ``bytes`` -- one ~20 us copy of bytes the CPU
cache has just seen.  The shuffle buffer then holds private copies instead of
page-cache views: ``cache`` records cost ``cache`` x the mean record size of private
memory (RSS), not reclaimable cache.

The page cache still wins when the split fits in RAM and is read for many epochs
(from the second epoch on nothing is read at all), so ``io="auto"`` chooses direct
I/O only for databases larger than half the memory the process may fill (RAM, or a
lower cgroup limit: :func:`~seqloader.read.iomode.choose`).  File systems that refuse
``O_DIRECT`` (tmpfs before Linux 6.6, some FUSE mounts) are read buffered.
"""
from __future__ import annotations

import errno
import mmap
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as _FutureTimeout
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..errors import FormatError
from .pages import address
from .bytesource import Part

__all__ = ["DirectStream", "Part", "open_direct"]

#: O_DIRECT needs offsets, lengths and buffer addresses aligned to the device's logical
#: block (512 B or 4 KiB); page alignment satisfies both.
ALIGN = 4096
#: How long one read may take before the disk is reported unresponsive.
READ_TIMEOUT = 120.0


def open_direct(path: str) -> int | None:
    """A read-only ``O_DIRECT`` descriptor of ``path``, or None where the file system
    (or platform) does not support direct I/O."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDONLY | flag)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


def _read_block(fd: int, buf: memoryview, offset: int) -> int:
    """Fill ``buf`` from ``offset`` (fewer bytes only at the end of the file)."""
    done = 0
    while done < len(buf):
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got <= 0:
            break
        done += got
        if done % ALIGN:  # a partial block: the end of the file
            break
    return done


class DirectStream:
    """Reads :class:`Part` s with ``O_DIRECT`` and yields each record as a ``bytes``
    copy (NOTE [ direct I/O ]).  ``depth`` reads run at once in background threads
    (the GIL is released while they wait), ``window`` bytes at most are read ahead.
    One pass at a time; not thread-safe; create it in the process that reads (the
    threads are started on first use; the ring is not inherited by forked children).
    A pass that ends or is closed early waits for (or cancels) its reads in flight, each
    wait bounded by :data:`READ_TIMEOUT`.  The ``direct``
    :class:`~seqloader.read.bytesource.ByteSource`."""

    name = "direct"

    def __init__(self, window: int = 128 << 20, block: int = 16 << 20, depth: int = 2):
        if block <= 0 or block % ALIGN:
            raise ValueError(f"block must be a positive multiple of {ALIGN}, got {block}")
        self.block, self.depth = block, max(1, depth)
        self.nbuf = max(self.depth + 1, window // block)
        self._mem: mmap.mmap | None = None
        self._free: list[memoryview] = []
        self._pool: ThreadPoolExecutor | None = None
        self.oversized = 0  # records larger than the ring, read on their own
        self.read_timeout = READ_TIMEOUT  # longest wait for one block

    # The four methods below are what a stream reads with (NOTE [ byte source ] in
    # :mod:`seqloader.read.bytesource`); a subclass (the remote stream,
    # :mod:`seqloader.read.remote`) replaces them and keeps the
    # ordering, windowing and shutdown of :meth:`read`.  Each runs in a read thread
    # except `_read_alone` and `_failure`.

    def _blocks(self, part: Part, start: int, end: int) -> Iterator[tuple[int, int]]:
        """The ``(offset, length)`` requests, in order, that cover the span ``[start, end)``
        (each at most :attr:`block` bytes)."""
        for off in range(start, end, self.block):
            yield off, min(self.block, end - off)

    def _fill(self, part: Part, buf: memoryview, off: int, n: int) -> int:
        """Read bytes ``[off, off + n)`` of ``part``'s file into ``buf``; the count read
        (fewer only at the end of the file)."""
        return _read_block(part.fd, buf[:(n + ALIGN - 1) // ALIGN * ALIGN], off)

    def _read_alone(self, part: Part, off: int, n: int) -> bytes:
        """One record larger than the ring, read on its own."""
        return _read_unaligned(part, off, n)

    def _failure(self, e: OSError, part: Part, off: int, n: int) -> BaseException:
        """The exception to raise for a failed block read."""
        return OSError(e.errno, f"{part.path}: reading {n} bytes at offset {off} failed: "
                       f"{e.strerror or e}; check the disk, or run `seqloader verify` on the file")

    def _stalled(self, part: Part, off: int, n: int, timeout: float) -> BaseException:
        """The exception to raise when a block read has not finished in ``timeout`` s."""
        return OSError(errno.ETIMEDOUT, f"{part.path}: a read of {n} bytes at offset {off} has "
                       f"not finished in {timeout:.0f} s; the disk or file system is not "
                       "responding")

    def _start(self) -> None:
        if self._pool is None:
            ring = self._mem = _ring(self.nbuf * self.block)
            self._free = [memoryview(ring)[_huge_offset(ring) + k * self.block:][:self.block]
                          for k in range(self.nbuf)]
            self._pool = ThreadPoolExecutor(self.depth, thread_name_prefix="seqloader-direct")

    def read(self, parts: Iterable[Part]) -> Iterator[memoryview]:
        """Yield every record of ``parts``, in order, as a read-only memoryview of its own
        ``bytes`` (finite; one pass).  A read error or a file shorter than its records
        raises an error naming the file and offset."""
        self._start()
        return _Pass(self, parts).records()

    def copy_into(self, value: memoryview, out: np.ndarray) -> None:
        """Values are private copies: a plain copy."""
        out[:] = np.frombuffer(value, np.uint8)

    def release(self, values: Sequence[memoryview]) -> None:
        """Nothing to drop: values are private copies, freed with their last reference."""

    def close(self) -> None:
        """Stop the read threads (a read in flight finishes in the background; a pass's
        own reads were already waited for when it ended) and free the ring."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        for view in self._free:
            view.release()
        self._free = []
        if self._mem is not None:
            try:
                self._mem.close()
            except BufferError:  # pragma: no cover - a view is still alive; GC closes it
                pass
            self._mem = None


class _Pass:
    """One pass of a :class:`DirectStream`: the blocks of the parts' spans, read into the
    ring's free buffers ``depth`` at a time (:meth:`fill`), and each record copied out
    of them in order (:meth:`records`); a buffer is recycled once the records before
    its block's end are out."""

    def __init__(self, stream: DirectStream, parts: Iterable[Part]):
        self.stream, self.pool, self.free = stream, stream._pool, stream._free
        self.parts = iter(parts)
        self.known: deque[Part] = deque()  # parts whose reads have started, not yet consumed
        # reads submitted, in stream order: [part no, span no, offset, length, buffer,
        # future (None once waited for)]; the pool runs `depth` of them at a time
        self.inflight: deque[list] = deque()
        self.pending = self._requests()
        self.exhausted = False

    def _requests(self) -> Iterator[tuple[int, int, int, int, Part]]:
        for p, part in enumerate(self.parts):
            self.known.append(part)
            for s, (start, end) in enumerate(part.spans):
                for off, n in self.stream._blocks(part, start, end):
                    yield p, s, off, n, part

    def fill(self) -> None:
        """Every free buffer gets the next block of the stream."""
        while self.free and not self.exhausted:
            req = next(self.pending, None)
            if req is None:
                self.exhausted = True
                return
            p, s, off, n, part = req
            buf = self.free.pop()
            self.inflight.append([p, s, off, n, buf,
                                  self.pool.submit(self.stream._fill, part, buf, off, n)])

    def wait(self, r: list, part: Part) -> None:
        fut: Future | None = r[5]
        if fut is None:
            return
        timeout = self.stream.read_timeout
        try:
            got = fut.result(timeout=timeout)
        except _FutureTimeout as e:
            if fut.done():  # (the read's own TimeoutError: the same class since 3.11)
                raise self.stream._failure(e, part, r[2], r[3]) from e
            raise self.stream._stalled(part, r[2], r[3], timeout) from None
        except OSError as e:
            raise self.stream._failure(e, part, r[2], r[3]) from e
        if got < r[3]:
            raise FormatError(f"{part.path}: ends at byte {r[2] + got}, before its records "
                              f"(which reach byte {r[2] + r[3]}); the file is truncated: "
                              "run `seqloader verify` on it")
        r[5] = None

    def recycle(self) -> None:
        r = self.inflight.popleft()
        fut = r[5]
        if fut is not None and not fut.cancel():
            try:
                fut.result(timeout=self.stream.read_timeout)  # never reuse a buffer being filled
            except _FutureTimeout:
                if not fut.done():
                    return  # a hung read keeps its buffer: the ring shrinks by one
            except Exception:  # noqa: BLE001 - its bytes are not used
                pass
        self.free.append(r[4])

    def records(self) -> Iterator[memoryview]:
        inflight = self.inflight
        try:
            p = 0
            while True:
                while not self.known and not self.exhausted:
                    # blocks of parts already consumed (those of a record that was read on
                    # its own can still be queued after its part's end) make room
                    while inflight and inflight[0][0] < p:
                        self.recycle()
                    self.fill()
                if not self.known:
                    return
                part = self.known.popleft()
                yield from self._part(p, part)
                while inflight and inflight[0][0] <= p:  # the part's tail
                    self.recycle()
                p += 1
        finally:
            while inflight:
                self.recycle()

    def _part(self, p: int, part: Part) -> Iterator[memoryview]:
        inflight, ids = self.inflight, part.ids
        for k in range(len(part.offsets)):
            s = 0 if ids is None else int(ids[k])
            off, n = int(part.offsets[k]), int(part.lengths[k])
            end = off + n
            # blocks wholly before this record are done with
            while inflight and ((inflight[0][0], inflight[0][1]) < (p, s) or (
                    inflight[0][1] == s and inflight[0][2] + inflight[0][3] <= off)):
                self.recycle()
                self.fill()
            pieces: list[memoryview] | None = []
            pos, i = off, 0
            while pos < end:
                if i >= len(inflight):
                    self.fill()
                if i >= len(inflight):  # the record is larger than the ring
                    pieces = None
                    break
                r = inflight[i]
                assert (r[0], r[1]) == (p, s) and r[2] <= pos < r[2] + r[3], \
                    "direct stream out of order"
                self.wait(r, part)
                take = min(end, r[2] + r[3]) - pos
                pieces.append(r[4][pos - r[2]:pos - r[2] + take])
                pos += take
                i += 1
            if pieces is None:
                self.stream.oversized += 1
                data = self.stream._read_alone(part, off, n)
            else:
                data = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
            del pieces
            yield memoryview(data)


_HUGE = 2 << 20


def _ring(size: int) -> mmap.mmap:
    """Private anonymous memory for the read buffers: ``size`` bytes from a 2 MiB
    boundary (see :func:`_huge_offset`), in transparent huge pages where the kernel
    allows it, and not inherited by forked children.

    Huge pages because a direct read is split into one block-layer request per run of
    physically contiguous memory (at most ``max_segments`` runs, 254 here): into
    scattered 4 KiB pages a 16 MiB read became ~16+ requests, and a disk or cloud
    volume that counts requests (hddsim's 100 IO/s) then gave 52 MB/s instead of 150
    (measured: a fresh process's buffers happened to be contiguous, one that had run
    for a while got fragmented memory; ``benchmarks/read_cost.py``-style reads into a
    4 KiB-page buffer, one at a time: 55-94 MiB/s; into huge pages: 151.8).  Not inherited (``MADV_DONTFORK``) because a
    child forked while a read is in flight must not share or copy-on-write the pages
    the disk is writing to."""
    m = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for advice in ("MADV_HUGEPAGE", "MADV_DONTFORK"):
        if hasattr(mmap, advice):
            try:
                m.madvise(getattr(mmap, advice))
            except OSError:  # pragma: no cover - THP compiled out
                pass
    return m


def _huge_offset(m: mmap.mmap) -> int:
    """Offset of the first 2 MiB boundary inside ``m``."""
    with memoryview(m) as view:
        return -address(view) % _HUGE


def _read_unaligned(part: Part, off: int, n: int) -> bytes:
    """One record read on its own (buffered), for records larger than the ring."""
    if part.fd_buffered is not None:
        data = os.pread(part.fd_buffered, n, off)
    else:
        fd = os.open(part.path, os.O_RDONLY)
        try:
            data = os.pread(fd, n, off)
        finally:
            os.close(fd)
    if len(data) != n:
        raise FormatError(f"{part.path}: ends at byte {off + len(data)}, inside a record that "
                          f"reaches byte {off + n}; the file is truncated: run `seqloader verify` on it")
    return data
