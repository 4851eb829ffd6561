"""Sequential, zero-copy reads of record ranges, with large explicit readahead.

NOTE [ sequential I/O ]
A cursor walk over an LMDB file touches its memory map page by page; each page
fault reads at most ``read_ahead_kb`` of the file -- 128 KB on most systems.  A
disk that serves ~100 requests/s then delivers ~13 MB/s whatever its bandwidth.
So the reader reads ahead itself, in large requests: for the record ranges it will
walk next it takes their byte spans from the metadata's record extents (NOTE
[ record extents ]; older files: a B-tree lookup) and a background thread reads those spans with 16 MiB
``pread`` calls, up to ``prefetch_bytes`` ahead of the cursor, into a scratch buffer -- so
the pages are in the page cache when the cursor arrives.  Only the reader's own
ranges are read.  Measured under hddsim (100 IO/s, 150 MiB/s), one reader:
background ``pread`` 98.5 % of the bandwidth; plain walk 97.8 % -- but only because
this machine's ``read_ahead_kb`` is 8 MiB; ``posix_fadvise``/``madvise(WILLNEED)``
windows 55-99 % (each call reads at most ``read_ahead_kb``, in fragmented requests).
The cursor also faults each value's pages in as it passes them (in file order):
records are consumed later, in shuffled order, and faulting them only then makes
random 4 KiB reads the kernel cannot read ahead.  Values are memoryviews into the
map: the page cache holds the bytes and the process no private copy (a shuffle
buffer of records is page cache the kernel can reclaim).  In direct mode the same
spans are read around the page cache instead (:mod:`seqloader.read.direct`, NOTE [ direct
I/O ]): values are then private copies.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import queue
import threading
import time
import warnings
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from .database import Database, check_identity, close_env, open_env
from .direct import DirectStream, Part, choose, open_direct
from ..format.meta import EXTENT_DTYPE, Meta, meta_extents
from ..format.keys import encode_key
from ..errors import FormatError

if TYPE_CHECKING:
    from .remote import RemoteFile

__all__ = ["RangeReader"]

from .pages import (LIBC as _LIBC, PAGE as _PAGE, address as _address, map_base as _map_base,
                    unmap as _unmap)

# NOTE [ mapped pages ]
# Every page the reader touches stays mapped in this process until it is unmapped,
# so a reader that walks a 140 GB file would show up to 140 GB of resident (if
# reclaimable) file pages in RSS/USS, and a shuffle buffer of 5000 records 550 MB.
# So pages are released from the page tables with madvise(MADV_DONTNEED): the whole
# file every 4 MiB the cursor walks (see `pages.unmap`), each value right after a
# fault-in, and a batch's values once it has been used.  Workers' batches are copied
# out with pread (`copy_into`), which maps nothing.  On a
# read-only shared file mapping that changes no data: the bytes stay in the page
# cache, and using a buffered record later is a minor fault.  (Under memory pressure
# the kernel may evict buffered records before use; they are then re-read at random
# -- keep `cache` x record size well below free RAM.)
_UNMAP_EVERY = 4 << 20
#: Records further apart than this are read as separate spans (see `_Shard.spans`).
_GAP = 1 << 20


def _touch(view: memoryview) -> None:
    """Fault in every page of ``view`` now, in file order.  Values are consumed later and
    in shuffled order; faulting them then would defeat the kernel's sequential
    readahead (random 4 KiB faults: ~0.4 MB/s on a 100 IO/s disk)."""
    if len(view):
        arr = np.frombuffer(view, np.uint8)
        arr[::_PAGE].max()
        arr[-1:].max()


class _Shard:
    """One open file.  NOTE [ record extents ]: files whose metadata lists every
    record's byte extent are read without LMDB: a read-only map of the file, values
    sliced from it, spans computed from the extents.  Looking a span up in the B-tree
    instead reads a chunk's first and last records' pages and B-tree leaves -- random
    reads that queue behind the readahead thread's 128 MB of large requests, blocking
    the cursor for 0.1-0.7 s at every chunk (measured under hddsim), and LMDB's cursor
    walk touches leaves that lie outside the spans.  Older files fall back to LMDB."""

    def __init__(self, path: str, meta: Meta, readahead: bool,
                 identity: tuple[int, int, int, int] | None = None):
        self.path = path
        self.fd_direct: int | None = None  # opened by RangeReader in direct mode
        self.fd = os.open(path, os.O_RDONLY)  # the readahead thread's
        self.fd_through = os.open(path, os.O_RDONLY)  # the cursor's (own readahead state)
        self.size = os.fstat(self.fd).st_size
        self.env = self.map = None
        try:
            check_identity(path, self.fd, identity)
            check_identity(path, self.fd_through, identity)
            self.extents = meta_extents(meta, self.size, where=path)
        except FormatError:
            self.close()
            raise
        if self.extents is not None:
            self.offsets = self.extents["offset"].astype(np.int64)
            self.lengths = self.extents["length"].astype(np.int64)
            self.map = mmap.mmap(self.fd_through, self.size, prot=mmap.PROT_READ) \
                if self.size else None
            self.view = memoryview(self.map) if self.map is not None else memoryview(b"")
            self.base = _address(self.view) if self.map is not None else None
        else:
            self.env = open_env(path, readahead=readahead)
            self.txn = self.env.begin(buffers=True)
            self.cur = self.txn.cursor()
            self.lookup = self.txn.cursor()
            self.base = _map_base(path)

    def spans(self, a: int, b: int) -> tuple[list[tuple[int, int]], np.ndarray | None]:
        """The byte spans (page-aligned, in record order) that hold local records
        ``[a, b)``, and the span index of each record (None: all in span 0).

        With extents, a new span starts wherever the next record does not follow the
        previous one within :data:`_GAP` bytes: LMDB puts a value in reused free pages
        now and then, anywhere earlier in the file, and one span from the lowest to
        the highest offset would read everything between.  Without extents, one span
        from the first record to the last (a lookup of each in the B-tree)."""
        if self.extents is not None:
            return _extent_spans(self.offsets, self.lengths, a, b, self.size)
        else:
            first = self.lookup.get(encode_key(a))
            last = self.lookup.get(encode_key(b - 1))
            if first is None or last is None:
                raise FormatError(f"{self.path}: records {a}..{b - 1} are missing; the file is "
                                  "damaged or truncated: run `seqloader verify` on it")
            bounds = [(_address(first) - self.base, _address(last) - self.base + len(last))]
            return _aligned(bounds, self.size), None

    def get(self, local: int) -> memoryview:
        if self.extents is not None:
            off = int(self.offsets[local])
            return self.view[off:off + int(self.lengths[local])]
        value = self.lookup.get(encode_key(local))
        if value is None:
            raise FormatError(f"{self.path}: record {local} is missing; run `seqloader verify`")
        return value

    def values(self, a: int, b: int) -> Iterator[memoryview]:
        """The values of local records ``[a, b)``, in order."""
        if self.extents is not None:
            yield from map(self.get, range(a, b))
            return
        cur = self.cur
        if not cur.set_key(encode_key(a)):
            raise FormatError(f"{self.path}: record {a} is missing; run `seqloader verify`")
        for local in range(a, b):
            yield cur.value()
            if local + 1 < b and not cur.next():
                raise FormatError(f"{self.path}: ends after record {local}, before {b - 1}")

    def close(self) -> None:
        if self.env is not None:
            self.txn.abort()
            close_env(self.env)
            self.env = None
        if self.map is not None:
            self.view.release()
            try:
                self.map.close()
            except BufferError:  # values still referenced: the map goes with the last one
                pass
            self.map = None
        self.close_direct()
        os.close(self.fd)
        os.close(self.fd_through)

    def close_direct(self) -> None:
        if self.fd_direct is not None:
            os.close(self.fd_direct)
            self.fd_direct = None


def _extent_spans(offsets: np.ndarray, lengths: np.ndarray, a: int, b: int, size: int
                  ) -> tuple[list[tuple[int, int]], np.ndarray]:
    """:meth:`_Shard.spans` of records ``[a, b)`` from their extents."""
    off = offsets[a:b]
    end = off + lengths[a:b]
    jump = np.empty(len(off), bool)
    jump[0] = True
    jump[1:] = (off[1:] < end[:-1]) | (off[1:] > end[:-1] + _GAP)
    ids = np.cumsum(jump) - 1
    firsts = np.flatnonzero(jump)
    starts = off[firsts]
    ends = np.maximum.reduceat(end, firsts)
    return _aligned(list(zip(starts.tolist(), ends.tolist())), size), ids


def _aligned(bounds: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    return [(s & ~(_PAGE - 1), min(size, (e + _PAGE - 1) & ~(_PAGE - 1))) for s, e in bounds]


class _RemoteShard:
    """One remote file (NOTE [ remote reading ] in :mod:`seqloader.read.remote`): the parts of
    :class:`_Shard` a remote stream needs, from the metadata's extents."""

    fd_direct, fd_through, base, env, map = -1, None, None, None, None

    def __init__(self, file: "RemoteFile", meta: Meta):
        from .remote import safe_url

        self.path, self.file, self.size = file.url, file, file.size
        self.extents = meta_extents(meta, file.size, where=safe_url(file.url))
        if self.extents is None:  # (no records: open_remote refuses files without extents)
            self.extents = np.zeros(0, EXTENT_DTYPE)
        self.offsets = self.extents["offset"].astype(np.int64)
        self.lengths = self.extents["length"].astype(np.int64)

    def spans(self, a: int, b: int) -> tuple[list[tuple[int, int]], np.ndarray]:
        return _extent_spans(self.offsets, self.lengths, a, b, self.size)

    def get(self, local: int) -> memoryview:
        off = int(self.offsets[local])
        return memoryview(self.file.fetch(off, off + int(self.lengths[local])))

    def close(self) -> None:
        pass


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


class _Prefetcher(threading.Thread):
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


class RangeReader:
    """Reads global record ranges of a :class:`~seqloader.read.database.Database`.

    Opens its LMDB environments on first use, in the calling process: create it
    anywhere, but use it only in the process that reads (not fork-safe once used).
    Yields ``(global index, value)`` where ``value`` is a read-only memoryview into the
    file's map, valid until :meth:`close` -- or, with direct I/O, of a private copy
    (NOTE [ direct I/O ]; ``io`` is ``"auto"``, ``"buffered"`` or ``"direct"``, see
    :func:`seqloader.read.direct.choose`; files without record extents, or on a file system
    without ``O_DIRECT``, are always read buffered).  Not thread-safe.
    """

    def __init__(self, db: Database, *, prefetch_bytes: int = 128 << 20, readahead: bool = True,
                 fault_in: bool = True, io: str = "auto"):
        self.db = db
        self.prefetch_bytes = prefetch_bytes
        self.readahead = readahead
        self.io = io
        # (validates io; remote files are always read as a stream: NOTE [ remote reading ])
        self.direct = choose(io, db.file_bytes) or db.remote is not None
        self._stream: DirectStream | None = None
        self._offsets = list(db.offsets)
        self._shards: list[_Shard] | None = None
        self._prefetcher: _Prefetcher | None = None
        self._scratch = bytearray(0)
        self._passes = 0
        # NOTE [ fault or pread ]: how the cursor brings records in, in file order.
        # Measured under hddsim (cold, 2 GB, batch 256): faulting the map in (fault_in)
        # reads 148 MB/s when nothing else runs (raw mode), but with two decoders busy
        # the reader thread takes its page faults while holding the GIL and the full
        # pipeline managed 511 images/s; pread-ing each record (GIL released while the
        # disk works) gave 1,023 images/s there, but only 94 MB/s alone.  The Loader
        # uses fault_in=False whenever workers decode.
        self.fault_in = fault_in

    def _open(self) -> list[_Shard]:
        if self._shards is None and self.db.remote is not None:
            from .remote import RemoteStream

            self._shards = [_RemoteShard(f, m) for f, m in zip(self.db.remote.files, self.db.metas)]
            self._stream = RemoteStream(self.db.remote, self.prefetch_bytes)
        if self._shards is None:
            # (not MADV_RANDOM even without fault_in: LMDB's cursor touches the first
            # page of every value it passes, and where it runs ahead of the readahead
            # thread each touch would be a 4 KiB read -- ~100 records/s on an HDD)
            shards: list[_Shard] = []
            try:
                ids = self.db.identities or (None,) * len(self.db.paths)
                for p, m, ident in zip(self.db.paths, self.db.metas, ids):
                    shards.append(_Shard(str(p), m, self.readahead, ident))
            except BaseException:
                for sh in shards:
                    sh.close()
                raise
            self._shards = shards
            if self.direct:
                self._open_direct(shards)
        return self._shards

    def _check_unchanged(self, shards: list[_Shard]) -> None:
        """The open files are unchanged since their metadata was read: not rewritten in
        place (``cp`` over one: reading a map past a shrunk file's end is SIGBUS, a crash;
        records moved are wrong data).  A file renamed or replaced under its name
        (``preprocess --overwrite``) is another file: this reader goes on reading the one
        it opened, consistent with its metadata; a new Loader/reader reads the new one."""
        for sh, ident in zip(shards, self.db.identities or ()):
            check_identity(sh.path, sh.fd, ident)

    def _open_direct(self, shards: list[_Shard]) -> None:
        """Open every shard for direct I/O, or fall back to buffered reads for all."""
        why = next((f"{sh.path} has no record extents (an older file)" for sh in shards
                    if sh.extents is None), None)
        for sh in shards:
            if why is None:
                sh.fd_direct = open_direct(sh.path)
                if sh.fd_direct is None:
                    why = f"the file system of {sh.path} does not support O_DIRECT"
                elif not os.path.samestat(os.fstat(sh.fd_direct), os.fstat(sh.fd)):
                    for s in shards:
                        s.close_direct()
                    raise FormatError(f"{sh.path} was replaced while it was being opened; "
                                      "open it again: create a new Loader/reader")
        if why is None:
            self._stream = DirectStream(self.prefetch_bytes)
            return
        for sh in shards:
            sh.close_direct()
        self.direct = False
        if self.io == "direct":
            warnings.warn(f"io='direct': {why}; reading through the page cache instead",
                          stacklevel=4)

    def _split(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
        """Global ranges -> (shard, local start, local stop), cut at shard boundaries."""
        out = []
        offs = self._offsets
        for a, b in ranges:
            if not 0 <= a <= b <= offs[-1]:
                raise IndexError(f"record range [{a}, {b}) outside [0, {offs[-1]})")
            while a < b:
                s = bisect.bisect_right(offs, a) - 1
                stop = min(b, offs[s + 1])
                out.append((s, a - offs[s], stop - offs[s]))
                a = stop
        return out

    # NOTE [ one stream ]
    # The disk should see one sequential stream of large requests.  When the cursor
    # reaches bytes the readahead thread has queued but not yet read, it waits for them
    # (a condition variable: the GIL is free meanwhile) instead of reading them itself:
    # a second reader of the same bytes -- a page fault's read-around (8 MiB centred
    # on the fault here) or a pread -- cuts the thread's requests into fragments, each
    # an I/O of its own against the disk's ~100/s.  Only bytes that were never queued
    # (a record larger than the window), a failed read or a 30 s stall make the cursor
    # read for itself.

    def read(self, ranges: Sequence[tuple[int, int]]) -> Iterator[tuple[int, memoryview]]:
        """Yield every record of ``ranges`` in order (finite; one pass).  FormatError if a
        file changed since its metadata was read (checked at each pass)."""
        shards = self._open()
        self._check_unchanged(shards)
        parts = self._split(ranges)
        if self.direct:
            yield from self._read_direct(shards, parts)
            return
        window = self.prefetch_bytes
        pref = self._prefetcher
        if window and pref is None:
            pref = self._prefetcher = _Prefetcher()
            pref.start()
        if pref is not None:
            pref.discard_queued()
        self._passes += 1
        pass_id = self._passes
        advised = consumed = 0  # bytes of spans queued / walked past by the cursor
        block = _Prefetcher.FIRST_BLOCK
        # advising: next part, its spans and record->span ids, the span being queued
        # and what is left of it
        nxt, part_spans, j, rest = 0, None, 0, None
        queued: tuple = ()  # key of the last block handed to the readahead thread
        span_base: dict[tuple[int, int], tuple[int, int]] = {}  # (part, span) -> (advised, start)
        ids_of: dict[int, np.ndarray | None] = {}

        def advise_more() -> None:
            # The window opens gradually (a pass's first records arrive after a small
            # read, and later parts' spans are computed only when needed).
            nonlocal advised, nxt, part_spans, j, rest, block, queued
            while advised - consumed < min(window, 2 * consumed + _Prefetcher.BLOCK):
                if rest is None:
                    if part_spans is None:
                        if nxt >= len(parts):
                            return
                        s, a, b = parts[nxt]
                        if shards[s].base is None or b <= a:
                            nxt += 1
                            continue
                        part_spans, ids_of[nxt] = shards[s].spans(a, b)
                        j = 0
                    rest = part_spans[j]
                    span_base[(nxt, j)] = (advised, rest[0])
                start, end = rest
                n = min(block, end - start)
                block = min(2 * block, _Prefetcher.BLOCK)
                sh = shards[parts[nxt][0]]
                queued = (pass_id, nxt, j, start + n)
                pref.spans.put((queued, sh.fd, start, n, sh.base + start))
                advised += n
                if start + n < end:
                    rest = (start + n, end)
                else:
                    rest, j = None, j + 1
                    if j == len(part_spans):
                        part_spans, nxt = None, nxt + 1

        for i, (s, a, b) in enumerate(parts):
            sh = shards[s]
            if window:
                if nxt <= i:  # nothing of this part queued: the cursor has passed all that is
                    consumed = advised
                advise_more()  # (so this part's spans and record->span ids exist now)
            ids = ids_of.get(i)
            base = self._offsets[s]
            walked = 0  # bytes walked since the map was last unmapped (NOTE [ mapped pages ])
            for local, value in enumerate(sh.values(a, b), a):
                # NOTE [ one stream ]: wait for the readahead thread rather than read
                # ourselves, so the disk sees one sequential stream of large requests
                cached = False
                if sh.base is not None:
                    end = _address(value) - sh.base + len(value)
                    if pref is not None:
                        key = (pass_id, i, 0 if ids is None else int(ids[local - a]), end)
                        cached = pref.done >= key or (queued >= key and pref.wait_for(key))
                        started = span_base.get(key[1:3])
                        # the cursor's place in the queued stream (the window's far end
                        # if its span is not queued yet)
                        consumed = advised if started is None else \
                            max(consumed, started[0] + end - started[1])
                if self.fault_in:
                    _touch(value)
                    self.release((value,))  # read in order now; used later from the page cache
                elif sh.base is None:
                    _touch(value)
                elif not cached:
                    self._read_through(sh, value, end)
                walked += len(value)
                if walked >= _UNMAP_EVERY and sh.base is not None:
                    _unmap(sh.base, sh.size)
                    walked = 0
                yield base + local, value
                if window and advised - consumed < window // 2:
                    advise_more()
            ids_of.pop(i, None)
            for key in [k for k in span_base if k[0] == i]:
                del span_base[key]
            if sh.base is not None:
                _unmap(sh.base, sh.size)

    def _read_direct(self, shards: list[_Shard], parts: list[tuple[int, int, int]]
                     ) -> Iterator[tuple[int, memoryview]]:
        """``read`` with direct I/O (NOTE [ direct I/O ]): one stream over all parts, so
        the disk never waits at a part's boundary."""
        def described() -> Iterator[Part]:
            for s, a, b in parts:
                if b > a:
                    sh = shards[s]
                    spans, ids = sh.spans(a, b)
                    yield Part(sh.path, sh.fd_direct, spans, ids, sh.offsets[a:b], sh.lengths[a:b],
                               sh.fd_through)

        indices = (self._offsets[s] + local for s, a, b in parts for local in range(a, b))
        stream = self._stream.read(described())
        try:
            for index, value in zip(indices, stream):
                yield index, value
        finally:
            stream.close()

    def _read_through(self, sh: "_Shard", value: memoryview, end: int) -> None:
        """Bring ``value``'s bytes (ending at file offset ``end``) into the page cache now,
        in file order, with ``pread`` -- which releases the GIL while it waits for the
        disk, unlike a page fault taken while touching the map.  Records are used later,
        in shuffled order, from the page cache.  Skipped when the readahead thread has
        already read them."""
        n = len(value)
        if len(self._scratch) < n:
            self._scratch = bytearray(max(n, 1 << 20))
        os.preadv(sh.fd_through, [memoryview(self._scratch)[:n]], end - n)

    def extents(self, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
        """File offset and length (:data:`~seqloader.format.meta.EXTENT_DTYPE`) of every record
        of ``ranges``, found by walking the B-tree in key order.  The records' own pages
        are not read: LMDB hands out a value's address from its leaf entry (an overflow
        page number), so this reads the leaf pages -- ~1 % of the file for photos, e.g.
        ~40 MB for ImageNet's 1.28 M records -- not the data.  (It read every record
        until stop 20: a resumed preprocessing run re-read all it had written.)"""
        shards = self._open()
        self._check_unchanged(shards)
        out = []
        for s, a, b in self._split(ranges):
            sh = shards[s]
            if sh.base is None:
                raise RuntimeError(f"{sh.path}: cannot locate records (no /proc/self/maps)")
            for value in sh.values(a, b):
                out.append((_address(value) - sh.base, len(value)))
            _unmap(sh.base, sh.size)
        return np.array(out, EXTENT_DTYPE)

    def copy_into(self, value: memoryview, out: np.ndarray) -> None:
        """Copy a value yielded by :meth:`read` into ``out`` (a uint8 array of its length)
        with ``pread``, from the page cache, without touching the map -- so no page of
        the file becomes mapped in this process (see NOTE [ mapped pages ])."""
        n = len(value)
        if n:
            addr = _address(value)
            for sh in self._shards or ():
                if sh.base is not None and sh.base <= addr < sh.base + sh.size:
                    if os.preadv(sh.fd_through, [out], addr - sh.base) == n:
                        return
                    # short: the file shrank under the map, whose pages past its end now
                    # fault with SIGBUS -- name it instead of reading them
                    raise FormatError(f"{sh.path} is shorter than when it was opened (cut or "
                                      "rewritten while being read); run `seqloader verify` on it")
        out[:] = np.frombuffer(value, np.uint8)

    def get(self, index: int) -> memoryview:
        """Random access to one record (used to refill a shuffle buffer on resume)."""
        shards = self._open()
        (s, a, _), = self._split([(index, index + 1)])
        return shards[s].get(a)

    def release(self, values: Sequence[memoryview]) -> None:
        """Drop used values' pages from this process's page tables (NOTE [ mapped pages ]).
        The values stay valid (touching them again is a minor fault from the page cache)."""
        if _LIBC is None:
            return
        maps = [(sh.base, sh.base + sh.size) for sh in self._shards or () if sh.base is not None]
        for v in values:
            if len(v):
                addr = _address(v)
                if not any(lo <= addr < hi for lo, hi in maps):
                    continue  # a private copy (direct I/O): not ours to unmap
                start = addr & ~(_PAGE - 1)
                _unmap(start, addr + len(v) - start)

    def close(self) -> None:
        """Close the environments; values yielded earlier become invalid."""
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._shards is not None:
            for sh in self._shards:
                sh.close()
            self._shards = None

    def __getstate__(self) -> dict:
        if self._shards is not None:
            raise RuntimeError("a RangeReader that has been used cannot be pickled or forked; "
                               "create it in the parent and use it only in the worker")
        return self.__dict__.copy()
