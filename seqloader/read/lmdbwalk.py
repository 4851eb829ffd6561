"""Every key and value of a foreign LMDB file, in key order, read with ``pread`` and
checked page by page -- the file is never mapped.

NOTE [ foreign LMDB files ]
LMDB maps its file and trusts every page it finds: a copy cut short faults with
SIGBUS on the first page past the end, a damaged page trips an assertion (SIGABRT)
or a wild read (SIGSEGV).  A file a user hands the preprocessing command (an
interrupted copy of a tensorpack LMDB is common) must never kill the process with a
signal, so such files are read here instead: the meta pages first (the file must hold
every page they count), then the main B-tree depth-first, each page checked before
it is used (its number, its kind, its node offsets and sizes, overflow pages inside
the file).  Anything wrong is one :class:`~seqloader.errors.DamagedArchiveError`
naming the file, the byte offset and the last key read.  The layout is LMDB 0.9's
(``MDB_DATA_VERSION`` 1, 64-bit builds; NOTE [ metadata over ranged reads ] in
:mod:`seqloader.read.lmdbpages` describes it).
"""
from __future__ import annotations

import os
import struct
from typing import Iterator

from ..errors import DamagedArchiveError, FormatError

__all__ = ["walk_lmdb"]

_MAGIC = 0xBEEFC0DE
_HEADER, _NODE = 16, 8
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_INVALID = 0xFFFFFFFFFFFFFFFF
_MAX_DEPTH = 32


class _File:
    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size
        self.last_key: bytes | None = None

    def damaged(self, offset: int | None, what: str) -> DamagedArchiveError:
        at = f" at byte {offset:,}" if offset is not None else ""
        last = repr(self.last_key.decode("latin1")) if self.last_key is not None else "none"
        return DamagedArchiveError(f"{self.path}: damaged or cut short{at}: {what} (last key "
                                   f"read: {last}); copy it again (an interrupted copy is "
                                   "shorter than the original)")

    def read(self, offset: int, n: int) -> bytes:
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise self.damaged(offset + len(data), f"{n:,} bytes needed from byte {offset:,}, "
                                                   f"the file ends at {self.size:,}")
        return data


def _meta(f: _File, page: bytes, at: int) -> tuple[int, int, int, int, int]:
    """(txnid, psize, root, depth, last page) of the meta page at byte ``at``."""
    flags = struct.unpack_from("<H", page, 10)[0]
    magic, version = struct.unpack_from("<II", page, 16)
    if not flags & _P_META or magic != _MAGIC:
        raise FormatError(f"{f.path}: not an LMDB file (no LMDB meta page at byte {at}); give "
                          "a tensorpack / sequential loader .lmdb file, or a folder holding "
                          "data.mdb")
    if version != 1:
        raise FormatError(f"{f.path}: LMDB data format version {version}; this reader knows "
                          "version 1 (what LMDB 0.9 writes)")
    psize = struct.unpack_from("<I", page, 40)[0]  # the free DB's md_pad holds the page size
    mflags, depth = struct.unpack_from("<HH", page, 88 + 4)
    root, last, txnid = (struct.unpack_from("<Q", page, 88 + 40)[0],
                         *struct.unpack_from("<QQ", page, 136))
    if psize < 512 or psize > 1 << 16 or psize & (psize - 1):
        raise f.damaged(at, f"the page size {psize} is not a power of two in [512, 65536]")
    if mflags & 0x04:  # MDB_DUPSORT
        raise FormatError(f"{f.path}: an LMDB database with duplicate keys; tensorpack and "
                          "the sequential loader write one value per key")
    return txnid, psize, root, depth, last


def walk_lmdb(path: str, after: bytes | None = None) -> Iterator[tuple[bytes, bytes, int]]:
    """``(key, value, end offset of the value)`` of every key of the main database of the
    LMDB file ``path`` (``data.mdb`` for a folder) in key order, from the first key after
    ``after`` on (NOTE [ foreign LMDB files ]).  :class:`~seqloader.errors.FormatError`
    for a file that is not LMDB; :class:`~seqloader.errors.DamagedArchiveError` for one
    that is damaged or cut short."""
    f = _File(os.path.join(path, "data.mdb") if os.path.isdir(path) else path)
    try:
        if f.size < 2 * 512:
            raise FormatError(f"{f.path}: not an LMDB file ({f.size} bytes); an LMDB file "
                              "starts with two meta pages")
        head = f.read(0, min(f.size, 2 * 4096))
        first = _meta(f, head, 0)
        psize = first[1]
        second = _meta(f, f.read(psize, psize), psize)
        _, psize, root, depth, last = max(first, second)
        need = (last + 1) * psize
        if need > f.size:
            raise f.damaged(f.size, f"its meta page counts {last + 1:,} pages of {psize} "
                                    f"bytes ({need:,} bytes), the file has {f.size:,}")
        if root == _INVALID:
            return
        if depth > _MAX_DEPTH:
            raise f.damaged(None, f"a B-tree of depth {depth}")
        yield from _walk(f, psize, last, root, depth, after)
    finally:
        os.close(f.fd)


def _page(f: _File, psize: int, last: int, pgno: int, kinds: int) -> tuple[bytes, list[int]]:
    """Page ``pgno`` (of one of ``kinds``) and its node offsets, checked."""
    if not 2 <= pgno <= last:
        raise f.damaged(None, f"a B-tree link to page {pgno}, outside pages 2..{last}")
    page = f.read(pgno * psize, psize)
    own, flags, lower, upper = struct.unpack_from("<QxxHHH", page, 0)
    if own != pgno or not flags & kinds or flags & _P_LEAF2:
        raise f.damaged(pgno * psize, f"page {pgno} is not the B-tree page it should be "
                                      f"(it says page {own}, flags {flags:#x})")
    if not _HEADER <= lower <= upper <= psize or (lower - _HEADER) % 2:
        raise f.damaged(pgno * psize, f"page {pgno}'s header is damaged")
    ptrs = list(struct.unpack_from(f"<{(lower - _HEADER) // 2}H", page, _HEADER))
    for ptr in ptrs:
        if not upper <= ptr <= psize - _NODE:
            raise f.damaged(pgno * psize, f"a node of page {pgno} lies outside it")
    if not ptrs:
        raise f.damaged(pgno * psize, f"B-tree page {pgno} is empty")
    return page, ptrs


def _walk(f: _File, psize: int, last: int, root: int, depth: int, after: bytes | None
          ) -> Iterator[tuple[bytes, bytes, int]]:
    stack = [(root, 1)]
    while stack:
        pgno, level = stack.pop()
        if level > depth:
            raise f.damaged(None, f"the B-tree is deeper than its meta page's {depth} levels")
        leaf = level == depth
        page, ptrs = _page(f, psize, last, pgno, _P_LEAF if leaf else _P_BRANCH)
        if not leaf:
            children = []
            for i, ptr in enumerate(ptrs):
                lo, hi, top, ksize = struct.unpack_from("<HHHH", page, ptr)
                if i + 1 < len(ptrs) and after is not None:  # whole subtree <= after: skip
                    nlo, nhi, ntop, nk = struct.unpack_from("<HHHH", page, ptrs[i + 1])
                    if page[ptrs[i + 1] + _NODE:ptrs[i + 1] + _NODE + nk] <= after:
                        continue
                children.append((lo | hi << 16 | top << 32, level + 1))
            stack.extend(reversed(children))
            continue
        for ptr in ptrs:
            lo, hi, nflags, ksize = struct.unpack_from("<HHHH", page, ptr)
            key_end = ptr + _NODE + ksize
            if key_end > psize:
                raise f.damaged(pgno * psize, f"a key of page {pgno} lies outside it")
            key = page[ptr + _NODE:key_end]
            if after is not None and key <= after:
                continue
            if nflags & (_F_SUBDATA | _F_DUPDATA):
                raise FormatError(f"{f.path}: key {key!r} holds a sub-database; tensorpack and "
                                  "the sequential loader write one value per key")
            dsize = lo | hi << 16
            if nflags & _F_BIGDATA:
                if key_end + 8 > psize:
                    raise f.damaged(pgno * psize, f"a node of page {pgno} lies outside it")
                first = struct.unpack_from("<Q", page, key_end)[0]
                pages = -(-(_HEADER + dsize) // psize)
                if not 2 <= first or first + pages - 1 > last:
                    raise f.damaged(pgno * psize, f"the value of key {key!r} lies outside "
                                                  f"pages 2..{last}")
                raw = f.read(first * psize, _HEADER + dsize)
                own, oflags, count = struct.unpack_from("<QxxHI", raw, 0)
                if own != first or not oflags & _P_OVERFLOW or count < pages:
                    raise f.damaged(first * psize, f"the value of key {key!r} is not where "
                                                   "its page says")
                value, end = raw[_HEADER:], first * psize + _HEADER + dsize
            else:
                if key_end + dsize > psize:
                    raise f.damaged(pgno * psize, f"the value of key {key!r} lies outside "
                                                  f"page {pgno}")
                value, end = page[key_end:key_end + dsize], pgno * psize + psize
            f.last_key = key
            yield key, value, end
