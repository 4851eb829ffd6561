"""Buffered reading: record values as views of the file's map, read ahead in large requests.

NOTE [ sequential I/O ]
A cursor walk over an LMDB file touches its memory map page by page; each page
fault reads at most ``read_ahead_kb`` of the file -- 128 KB on most systems.  A
disk that serves ~100 requests/s then delivers ~13 MB/s whatever its bandwidth.
So the reader reads ahead itself, in large requests: for the record ranges it will
walk next it takes their byte spans from the metadata's record extents (NOTE
[ record extents ]; older files: a B-tree lookup) and a background thread reads those
spans with 16 MiB ``pread`` calls, up to ``prefetch_bytes`` ahead of the cursor, into a
scratch buffer -- so the pages are in the page cache when the cursor arrives.  Only
the reader's own ranges are read.  Measured under hddsim (100 IO/s, 150 MiB/s), one
reader: background ``pread`` 98.5 % of the bandwidth; plain walk 97.8 % -- but only
because this machine's ``read_ahead_kb`` is 8 MiB; ``posix_fadvise``/``madvise(WILLNEED)``
windows 55-99 % (each call reads at most ``read_ahead_kb``, in fragmented requests).
Records the readahead thread has not read (it failed, stalled, or a record is larger
than the window) the cursor brings in itself as it passes them, in file order:
records are consumed later, in shuffled order, and reading them only then makes
random 4 KiB reads the kernel cannot read ahead.  Values are memoryviews into the map:
the page cache holds the bytes and the process no private copy (a shuffle buffer of
records is page cache the kernel can reclaim), and a record the readahead thread has
read is not touched at all by the cursor (no page of it mapped).

NOTE [ one stream ]
The disk should see one sequential stream of large requests.  When the cursor
reaches bytes the readahead thread has queued but not yet read, it waits for them
(a condition variable: the GIL is free meanwhile) instead of reading them itself:
a second reader of the same bytes -- a page fault's read-around (8 MiB centred
on the fault here) or a pread -- cuts the thread's requests into fragments, each
an I/O of its own against the disk's ~100/s.  Only bytes that were never queued
(a record larger than the window), a failed read or a 30 s stall make the cursor
read for itself.

NOTE [ fault or pread ]
How the cursor brings in records the readahead thread did not.  Measured under hddsim
(cold, 2 GB, batch 256): faulting the map in (``fault_in``) reads 148 MB/s when
nothing else runs (raw mode), but with two decoders busy the reader thread takes its
page faults while holding the GIL and the full pipeline managed 511 images/s;
pread-ing each record (GIL released while the disk works) gave 1,023 images/s there,
but only 94 MB/s alone.  The Loader uses fault_in=False whenever workers decode.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, Sequence

import numpy as np

from .pages import LIBC, PAGE, address, unmap
from .prefetch import Prefetcher
from .shard import UNMAP_EVERY, Shard, touch
from .bytesource import Part
from ..errors import FormatError

__all__ = ["BufferedSource"]


class BufferedSource:
    """A :class:`~seqloader.read.bytesource.ByteSource` through the page cache (NOTE
    [ sequential I/O ]) over open :class:`~seqloader.read.shard.Shard` s; ``window``
    bytes of read-ahead (0: none), ``fault_in`` as NOTE [ fault or pread ]."""

    name = "buffered"

    def __init__(self, shards: Sequence[Shard], window: int, fault_in: bool):
        self.shards, self.window, self.fault_in = list(shards), window, fault_in
        self.prefetcher: Prefetcher | None = None
        self.passes = 0
        self._scratch = bytearray(0)

    def read(self, parts: Iterable[Part]) -> Iterator[memoryview]:
        if self.window and self.prefetcher is None:
            self.prefetcher = Prefetcher()
            self.prefetcher.start()
        if self.prefetcher is not None:
            self.prefetcher.discard_queued()
        self.passes += 1
        return _Walk(self, parts, self.passes).records()

    def read_through(self, sh: Shard, off: int, n: int) -> None:
        """Bring bytes ``[off, off + n)`` into the page cache now, in file order, with
        ``pread`` -- which releases the GIL while it waits for the disk, unlike a page
        fault taken while touching the map (NOTE [ fault or pread ])."""
        if len(self._scratch) < n:
            self._scratch = bytearray(max(n, 1 << 20))
        os.preadv(sh.fd_through, [memoryview(self._scratch)[:n]], off)

    def shard_at(self, addr: int) -> Shard | None:
        for sh in self.shards:
            if sh.base is not None and sh.base <= addr < sh.base + sh.mapped:
                return sh
        return None

    def copy_into(self, value: memoryview, out: np.ndarray) -> None:
        """With ``pread``, from the page cache, without touching the map (NOTE [ mapped
        pages ])."""
        n = len(value)
        if n:
            addr = address(value)
            sh = self.shard_at(addr)
            if sh is not None:
                if os.preadv(sh.fd_through, [out], addr - sh.base) == n:
                    return
                # short: the file shrank under the map, whose pages past its end now
                # fault with SIGBUS -- name it instead of reading them
                raise FormatError(f"{sh.path} is shorter than when it was opened (cut or "
                                  "rewritten while being read); run `seqloader verify` on it")
        out[:] = np.frombuffer(value, np.uint8)

    def release(self, values: Sequence[memoryview]) -> None:
        """Unmap the values' pages (NOTE [ mapped pages ])."""
        if LIBC is None:
            return
        for v in values:
            if len(v):
                addr = address(v)
                if self.shard_at(addr) is not None:
                    start = addr & ~(PAGE - 1)
                    unmap(start, addr + len(v) - start)

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.prefetcher = None


class _Walk:
    """One pass of a :class:`BufferedSource`: the cursor over the parts (:meth:`records`)
    and the queue of spans handed to the readahead thread ahead of it (:meth:`advise`).
    The window opens gradually (a pass's first records arrive after a small read), and
    a part's spans are asked for only when the queue reaches it."""

    def __init__(self, source: BufferedSource, parts: Iterable[Part], pass_id: int):
        self.src, self.pref, self.window = source, source.prefetcher, source.window
        self.pending, self.pass_id = iter(parts), pass_id
        self.known: dict[int, Part] = {}  # parts taken from `pending`, not yet walked past
        self.taken = 0
        self.advised = self.consumed = 0  # bytes of spans queued / walked past by the cursor
        self.block = Prefetcher.FIRST_BLOCK
        # being queued: part number, its span number and what is left of that span
        self.nxt, self.span, self.rest = 0, 0, None
        self.queued: tuple = ()  # key of the last block handed to the readahead thread
        self.span_base: dict[tuple[int, int], tuple[int, int]] = {}  # -> (advised, start)

    def part(self, i: int) -> Part | None:
        while self.taken <= i:
            p = next(self.pending, None)
            if p is None:
                return None
            self.known[self.taken] = p
            self.taken += 1
        return self.known.get(i)

    def advise(self) -> None:
        """Queue spans until the window ahead of the cursor is full."""
        while self.advised - self.consumed < min(self.window,
                                                 2 * self.consumed + Prefetcher.BLOCK):
            if self.rest is None:
                p = self.part(self.nxt)
                if p is None:
                    return
                if p.shard.base is None or self.span >= len(p.spans):
                    self.nxt, self.span = self.nxt + 1, 0
                    continue
                self.rest = p.spans[self.span]
                self.span_base[(self.nxt, self.span)] = (self.advised, self.rest[0])
            start, end = self.rest
            n = min(self.block, end - start)
            self.block = min(2 * self.block, Prefetcher.BLOCK)
            sh = self.known[self.nxt].shard
            self.queued = (self.pass_id, self.nxt, self.span, start + n)
            self.pref.spans.put((self.queued, sh.fd, start, n, sh.base + start))
            self.advised += n
            if start + n < end:
                self.rest = (start + n, end)
            else:
                self.rest, self.span = None, self.span + 1

    def records(self) -> Iterator[memoryview]:
        i = 0
        while (p := self.part(i)) is not None:
            if self.window:
                if self.nxt <= i:  # nothing of this part queued: the cursor passed all that is
                    self.consumed = self.advised
                self.advise()
            yield from self._walk(i, p)
            del self.known[i]
            for key in [k for k in self.span_base if k[0] == i]:
                del self.span_base[key]
            if p.shard.base is not None:
                unmap(p.shard.base, p.shard.mapped)
            i += 1

    def _cached(self, i: int, span: int, end: int) -> bool:
        """Whether the readahead thread has read the part's bytes up to ``end`` (waiting
        for it if they are queued: NOTE [ one stream ]); moves ``consumed``."""
        key = (self.pass_id, i, span, end)
        pref = self.pref
        cached = pref.done >= key or (self.queued >= key and pref.wait_for(key))
        started = self.span_base.get((i, span))
        # the cursor's place in the queued stream (the window's far end if its span is
        # not queued yet)
        self.consumed = self.advised if started is None else \
            max(self.consumed, started[0] + end - started[1])
        return cached

    def _walk(self, i: int, p: Part) -> Iterator[memoryview]:
        sh, src, pref, window = p.shard, self.src, self.pref, self.window
        ids = p.ids.tolist() if p.ids is not None else None
        walked = 0  # bytes walked since the map was last unmapped (NOTE [ mapped pages ])
        if p.offsets is not None:
            view, base = sh.view, sh.base
            for k, (off, n) in enumerate(zip(p.offsets.tolist(), p.lengths.tolist())):
                end = off + n
                value = view[off:end]
                if pref is None or not self._cached(i, 0 if ids is None else ids[k], end):
                    if src.fault_in:
                        touch(value)  # read in order now; used later from the page cache
                        unmap(base + (off & ~(PAGE - 1)), end - (off & ~(PAGE - 1)))
                    else:
                        src.read_through(sh, off, n)
                    walked += n
                    if walked >= UNMAP_EVERY:
                        unmap(base, sh.mapped)
                        walked = 0
                yield value
                if window and self.advised - self.consumed < window // 2:
                    self.advise()
            return
        for k, value in enumerate(sh.values(p.first, p.first + p.count)):  # through LMDB
            if sh.base is None:
                touch(value)
            else:
                end = address(value) - sh.base + len(value)
                if pref is None or not self._cached(i, 0 if ids is None else ids[k], end):
                    if src.fault_in:
                        touch(value)
                        src.release((value,))
                    else:
                        src.read_through(sh, end - len(value), len(value))
                walked += len(value)
                if walked >= UNMAP_EVERY:
                    unmap(sh.base, sh.mapped)
                    walked = 0
            yield value
            if window and self.advised - self.consumed < window // 2:
                self.advise()
