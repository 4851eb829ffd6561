"""One open database file of a reader: its descriptors, map and record extents.

NOTE [ mapped pages ]
Every page the reader touches stays mapped in this process until it is unmapped,
so a reader that walks a 140 GB file would show up to 140 GB of resident (if
reclaimable) file pages in RSS/USS, and a shuffle buffer of 5000 records 550 MB.
So pages are released from the page tables with madvise(MADV_DONTNEED): the whole
file every 4 MiB the cursor walks (see `pages.unmap`), each value the cursor had to
fault in itself, and a batch's values once it has been used.  Workers' batches and
raw batches are copied out with pread (``copy_into``, ``RangeReader.encoded``), which
maps nothing.  On a read-only shared file mapping that changes no data: the bytes stay
in the page cache, and using a buffered record later is a minor fault.  (Under memory
pressure the kernel may evict buffered records before use; they are then re-read at
random -- keep `cache` x record size well below free RAM.)
"""
from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING, Iterator

import numpy as np

from .database import check_identity, close_env, open_env
from .pages import PAGE as _PAGE, address as _address, map_base as _map_base, unmap
from ..format.keys import encode_key
from ..format.meta import EXTENT_DTYPE, Meta, meta_digests, meta_extents
from ..errors import FormatError

if TYPE_CHECKING:
    from .remote import RemoteFile

__all__ = ["Shard", "RemoteShard", "touch", "UNMAP_EVERY", "GAP"]

#: Bytes the cursor walks between two unmaps of the whole file (NOTE [ mapped pages ]).
UNMAP_EVERY = 4 << 20
#: Records further apart than this are read as separate spans (see `Shard.spans`).
GAP = 1 << 20


def touch(view: memoryview) -> None:
    """Fault in every page of ``view`` now, in file order.  Values are consumed later and
    in shuffled order; faulting them then would defeat the kernel's sequential
    readahead (random 4 KiB faults: ~0.4 MB/s on a 100 IO/s disk)."""
    if len(view):
        arr = np.frombuffer(view, np.uint8)
        arr[::_PAGE].max()
        arr[-1:].max()


class Shard:
    """One open file; ``base`` is the address of its map (None: none found) and
    ``mapped`` how many of its bytes are mapped there.  NOTE [ record extents ]: files whose metadata lists every
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
            self.mapped = self.size
        else:
            self.env = open_env(path, readahead=readahead)
            self.txn = self.env.begin(buffers=True)
            self.cur = self.txn.cursor()
            self.lookup = self.txn.cursor()
            self.base = _map_base(path)
            # NOTE [ mapped length ]: LMDB maps only its committed pages ((last page + 1)
            # x page size) when the file is opened read-only; a file can be longer
            # (an unfinished write killed mid-commit leaves pages after them), and
            # madvise(DONTNEED) past the map's end would zero whatever memory the
            # process has mapped there: a SIGSEGV a moment later.  Unmap only this.
            self.mapped = min(self.size, self.env.info()["map_size"])

    def spans(self, a: int, b: int) -> tuple[list[tuple[int, int]], np.ndarray | None]:
        """The byte spans (page-aligned, in record order) that hold local records
        ``[a, b)``, and the span index of each record (None: all in span 0).

        With extents, a new span starts wherever the next record does not follow the
        previous one within :data:`GAP` bytes: LMDB puts a value in reused free pages
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

    def walk_extents(self, a: int, b: int) -> np.ndarray:
        """The extents of local records ``[a, b)`` found by walking the B-tree
        (:meth:`~seqloader.read.reader.RangeReader.extents`)."""
        if self.base is None:
            raise RuntimeError(f"{self.path}: cannot locate records (no /proc/self/maps)")
        out = [(_address(value) - self.base, len(value)) for value in self.values(a, b)]
        unmap(self.base, self.mapped)
        return np.array(out, EXTENT_DTYPE)

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
    """:meth:`Shard.spans` of records ``[a, b)`` from their extents."""
    off = offsets[a:b]
    end = off + lengths[a:b]
    jump = np.empty(len(off), bool)
    jump[0] = True
    jump[1:] = (off[1:] < end[:-1]) | (off[1:] > end[:-1] + GAP)
    ids = np.cumsum(jump) - 1
    firsts = np.flatnonzero(jump)
    starts = off[firsts]
    ends = np.maximum.reduceat(end, firsts)
    return _aligned(list(zip(starts.tolist(), ends.tolist())), size), ids


def _aligned(bounds: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    return [(s & ~(_PAGE - 1), min(size, (e + _PAGE - 1) & ~(_PAGE - 1))) for s, e in bounds]


class RemoteShard:
    """One remote file (NOTE [ remote reading ] in :mod:`seqloader.read.remote`): the parts of
    :class:`Shard` a remote stream needs, from the metadata's extents."""

    fd_direct, fd_through, base, env, map, mapped = -1, None, None, None, None, 0

    def __init__(self, file: "RemoteFile", meta: Meta):
        from .remote import safe_url

        self.path, self.file, self.size = file.url, file, file.size
        self.extents = meta_extents(meta, file.size, where=safe_url(file.url))
        if self.extents is None:  # (no records: open_remote refuses files without extents)
            self.extents = np.zeros(0, EXTENT_DTYPE)
        self.offsets = self.extents["offset"].astype(np.int64)
        self.lengths = self.extents["length"].astype(np.int64)
        # what a block is checked against before it is cached (NOTE [ block cache ])
        self.digests = meta_digests(meta, where=safe_url(file.url))
        self.algorithm = meta.checksum_algorithm

    def spans(self, a: int, b: int) -> tuple[list[tuple[int, int]], np.ndarray]:
        return _extent_spans(self.offsets, self.lengths, a, b, self.size)

    def get(self, local: int) -> memoryview:
        off = int(self.offsets[local])
        return memoryview(self.file.fetch(off, off + int(self.lengths[local])))

    def close(self) -> None:
        pass

