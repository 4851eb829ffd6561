"""Look a key up in an LMDB file through ranged reads, without opening it with LMDB.

NOTE [ metadata over ranged reads ]
LMDB maps its file, so it cannot open a URL; copying a shard to read its metadata
would move the whole file.  The metadata sits under :data:`~seqloader.format.keys.META_KEY`,
which sorts before every record key, so it is the first entry of the main database's
leftmost leaf: two meta pages (the newer one names the root), one page per B-tree
level down the leftmost edge, and the value itself (one read: a large value lies in
consecutive overflow pages).  For ImageNet's ~20 MB of metadata that is ~5 requests
per shard instead of a 140 GB copy.

The layout read here is LMDB 0.9's on-disk format (``MDB_DATA_VERSION`` 1, 64-bit
builds -- what py-lmdb bundles and writes): a 16-byte page header ``(pgno u64, pad
u16, flags u16, lower u16, upper u16)``; a meta page holds ``MDB_meta`` after it
(magic, version, address, mapsize, the free and main ``MDB_db`` records of 48 bytes,
last page number, transaction id); branch and leaf pages hold ``(lower - 16) / 2``
node offsets after the header; a node is ``(lo u16, hi u16, flags u16, ksize u16,
key, data)``: in a branch the child page is ``lo | hi << 16 | flags << 32``, in a
leaf the data size is ``lo | hi << 16`` and ``F_BIGDATA`` data is the first overflow
page's number (its value starts 16 bytes into that page).
"""
from __future__ import annotations

import struct
from typing import Callable

from ..errors import FormatError

__all__ = ["lookup_first_leaf", "LmdbLayout"]

_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_HEADER = 16
_NODE = 8
_P_BRANCH, _P_LEAF, _P_META, _P_LEAF2 = 0x01, 0x02, 0x08, 0x20
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_INVALID = 0xFFFFFFFFFFFFFFFF
#: A B-tree deeper than this is damage, not data (2^32 records need ~6 levels).
_MAX_DEPTH = 32
#: The page size assumed for the first read; a file with another one costs a second read.
_GUESS = 4096

ReadFn = Callable[[int, int], bytes]


class LmdbLayout:
    """What a file's newer meta page says: ``psize`` (page size), ``root`` (main B-tree
    root page, None when empty), ``depth`` and ``last_page``."""

    def __init__(self, psize: int, root: int | None, depth: int, last_page: int):
        self.psize, self.root, self.depth, self.last_page = psize, root, depth, last_page

    @property
    def needed_bytes(self) -> int:
        """The smallest size a complete copy of the file has."""
        return (self.last_page + 1) * self.psize


def _meta(page: bytes, where: str) -> tuple[int, int, int, int, int, int]:
    """(txnid, psize, root, depth, last page, flags) of one meta page."""
    if len(page) < 152:
        raise FormatError(f"{where}: too short to be an LMDB file ({len(page)} bytes)")
    flags = struct.unpack_from("<H", page, 10)[0]
    magic, version = struct.unpack_from("<II", page, 16)
    if not flags & _P_META or magic != _MAGIC:
        raise FormatError(f"{where}: not an LMDB file (no meta page); is it a seqloader "
                          ".lmdb file, and was it uploaded completely?")
    if version != _DATA_VERSION:
        raise FormatError(f"{where}: LMDB data format version {version}; this reader knows "
                          f"version {_DATA_VERSION} (what py-lmdb writes); copy the file locally")
    psize = struct.unpack_from("<I", page, 40)[0]  # the free DB's md_pad holds the page size
    depth = struct.unpack_from("<H", page, 88 + 6)[0]
    root, last, txnid = (struct.unpack_from("<Q", page, 88 + 40)[0],
                         *struct.unpack_from("<QQ", page, 136))
    if psize < 512 or psize & (psize - 1):
        raise FormatError(f"{where}: LMDB page size {psize} is not a power of two >= 512; "
                          "the file is damaged")
    return txnid, psize, root, depth, last, flags


def read_layout(read: ReadFn, size: int, where: str) -> LmdbLayout:
    """The layout of the newer of the two meta pages (what LMDB itself would open)."""
    head = read(0, min(size, 2 * _GUESS))
    first = _meta(head[:_GUESS], where)
    psize = first[1]
    second_page = head[psize:2 * psize] if len(head) >= 2 * psize else read(psize, psize)
    second = _meta(second_page, where)
    txnid, psize, root, depth, last, _ = max(first, second)
    layout = LmdbLayout(psize, None if root == _INVALID else root, depth, last)
    if layout.needed_bytes > size:
        raise FormatError(f"{where}: truncated ({size:,} of {layout.needed_bytes:,} bytes); "
                          "upload it again")
    return layout


def lookup_first_leaf(read: ReadFn, size: int, key: bytes, *, where: str) -> bytes | None:
    """The value of ``key`` if it is in the leftmost leaf of the main B-tree (so: any key
    that sorts before all others, like seqloader's metadata key), else None.

    ``read(offset, length)`` returns exactly those bytes of the file (``size`` bytes
    long).  Raises :class:`FormatError` naming ``where`` for a file that is not LMDB 0.9
    data or is damaged (a page of the wrong kind, a node outside its page)."""
    layout = read_layout(read, size, where)
    if layout.root is None:
        return None
    psize, pgno = layout.psize, layout.root
    for _ in range(_MAX_DEPTH):
        if pgno > layout.last_page:
            raise FormatError(f"{where}: B-tree page {pgno} lies past the file's last page "
                              f"{layout.last_page}; the file is damaged")
        page = read(pgno * psize, psize)
        flags, lower = struct.unpack_from("<HH", page, 10)
        count = (lower - _HEADER) // 2
        if count <= 0 or lower > psize:
            raise FormatError(f"{where}: B-tree page {pgno} is empty or damaged")
        ptrs = struct.unpack_from(f"<{count}H", page, _HEADER)
        if flags & _P_BRANCH:
            lo, hi, top = struct.unpack_from("<HHH", page, ptrs[0])
            pgno = lo | hi << 16 | top << 32  # node 0 of a branch: everything smallest
            continue
        if not flags & _P_LEAF or flags & _P_LEAF2:
            raise FormatError(f"{where}: page {pgno} (flags {flags:#x}) is not a B-tree page; "
                              "the file is damaged")
        for ptr in ptrs:
            if ptr + _NODE > psize:
                raise FormatError(f"{where}: a node of page {pgno} lies outside it; damaged")
            lo, hi, nflags, ksize = struct.unpack_from("<HHHH", page, ptr)
            k = page[ptr + _NODE:ptr + _NODE + ksize]
            if k < key:
                continue
            if k != key:
                return None
            if nflags & (_F_SUBDATA | _F_DUPDATA):
                raise FormatError(f"{where}: {key!r} holds a sub-database, not a value")
            dsize, at = lo | hi << 16, ptr + _NODE + ksize
            if nflags & _F_BIGDATA:
                first_page = struct.unpack_from("<Q", page, at)[0]
                start = first_page * psize + _HEADER
                if start + dsize > size:
                    raise FormatError(f"{where}: the value of {key!r} reaches byte "
                                      f"{start + dsize:,}, past the file's end ({size:,}); "
                                      "the file is truncated or damaged")
                value = read(start, dsize)
            else:
                value = page[at:at + dsize]
            if len(value) != dsize:
                raise FormatError(f"{where}: the value of {key!r} is cut short; damaged")
            return bytes(value)
        return None
    raise FormatError(f"{where}: B-tree deeper than {_MAX_DEPTH} levels; the file is damaged")
