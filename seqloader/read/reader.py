"""Sequential, zero-copy reads of record ranges of a database, from a byte source.

A :class:`RangeReader` turns global record ranges into per-file
:class:`~seqloader.read.bytesource.Part` s -- the records' extents and the byte spans that
hold them -- and reads them with one :class:`~seqloader.read.bytesource.ByteSource` (NOTE [ byte source ]): buffered
(NOTE [ sequential I/O ] in :mod:`seqloader.read.buffered`), direct I/O (NOTE [ direct
I/O ] in :mod:`seqloader.read.direct`) or remote (NOTE [ remote reading ]).
"""
from __future__ import annotations

import bisect
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .database import Database, check_identity
from .buffered import BufferedSource
from . import direct
from .iomode import choose
from .raw import encoded, unmap_file
from .shard import RemoteShard, Shard
from .bytesource import ByteSource, Part
from ..errors import FormatError
from ..format.meta import EXTENT_DTYPE

if TYPE_CHECKING:
    from .remote import RemoteSource

__all__ = ["RangeReader", "open_byte_source"]



class RangeReader:
    """Reads global record ranges of a :class:`~seqloader.read.database.Database`.

    Opens its files on first use, in the calling process: create it anywhere, but use
    it only in the process that reads (not fork-safe once used).  Yields ``(global
    index, value)`` where ``value`` is a read-only memoryview into the file's map, valid
    until :meth:`close` -- or, with direct I/O or a remote database, of a private copy
    (NOTE [ direct I/O ]; ``io`` is ``"auto"``, ``"buffered"`` or ``"direct"``, see
    :func:`seqloader.read.iomode.choose`; files without record extents, or on a file system
    without ``O_DIRECT``, are always read buffered).  ``fault_in``: NOTE [ fault or
    pread ].  Not thread-safe.
    """

    def __init__(self, db: Database, *, prefetch_bytes: int = 128 << 20, readahead: bool = True,
                 fault_in: bool = True, io: str = "auto"):
        self.db = db
        self.prefetch_bytes = prefetch_bytes
        self.readahead = readahead
        self.io = io
        self.fault_in = fault_in
        # (validates io; remote files are always read as a stream: NOTE [ remote reading ])
        self._direct = choose(io, db.file_bytes) or db.remote is not None
        self._offsets = list(db.offsets)
        self._shards: list[Shard] | None = None
        self._source: ByteSource | None = None
        self._lent: set[int] = set()  # files of the views `encoded` returned last

    @property
    def byte_source(self) -> ByteSource | None:
        """The open byte source (buffered, direct or remote), or None before the first read."""
        return self._source

    @property
    def direct(self) -> bool:
        """Whether values are private copies (direct I/O or remote), not map views."""
        return self._direct

    def _open(self) -> list[Shard]:
        if self._shards is None:
            remote = self.db.remote
            if remote is not None:
                shards = [RemoteShard(f, m) for f, m in zip(remote.files, self.db.metas)]
            else:
                shards = []
                try:
                    ids = self.db.identities or (None,) * len(self.db.paths)
                    for p, m, ident in zip(self.db.paths, self.db.metas, ids):
                        shards.append(Shard(str(p), m, self.readahead, ident))
                except BaseException:
                    for sh in shards:
                        sh.close()
                    raise
            self._source = open_byte_source(shards, io=self.io, total_bytes=self.db.file_bytes,
                                       window=self.prefetch_bytes, fault_in=self.fault_in,
                                       remote=remote)
            self._shards = shards
            self._direct = self._source.name != "buffered"
        return self._shards

    def _check_unchanged(self, shards: list[Shard]) -> None:
        """The open files are unchanged since their metadata was read: not rewritten in
        place (``cp`` over one: reading a map past a shrunk file's end is SIGBUS, a crash;
        records moved are wrong data).  A file renamed or replaced under its name
        (``preprocess --overwrite``) is another file: this reader goes on reading the one
        it opened, consistent with its metadata; a new Loader/reader reads the new one."""
        for sh, ident in zip(shards, self.db.identities or ()):
            check_identity(sh.path, sh.fd, ident)


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


    def _parts(self, parts: list[tuple[int, int, int]]) -> Iterator[Part]:
        """The non-empty ``(shard, local start, local stop)`` pieces as :class:`Part` s, each
        described (its spans looked up) only when the source asks for it."""
        for s, a, b in parts:
            if b > a:
                sh = self._shards[s]
                spans, ids = sh.spans(a, b) if sh.base is not None or sh.extents is not None \
                    else ([], None)
                ext = sh.extents is not None
                yield Part(sh.path, -1 if sh.fd_direct is None else sh.fd_direct, spans, ids,
                           sh.offsets[a:b] if ext else None, sh.lengths[a:b] if ext else None,
                           sh.fd_through, sh, a, b - a)

    def read(self, ranges: Sequence[tuple[int, int]]) -> Iterator[tuple[int, memoryview]]:
        """Yield every record of ``ranges`` in order (finite; one pass).  FormatError if a
        file changed since its metadata was read (checked at each pass)."""
        shards = self._open()
        self._check_unchanged(shards)
        parts = self._split(ranges)
        offs = self._offsets
        indices = (offs[s] + local for s, a, b in parts for local in range(a, b))
        stream = self._source.read(self._parts(parts))
        pairs = zip(indices, stream)
        remote = self.db.remote
        if remote is not None and remote.options.verify:  # NOTE [ records checked on arrival ]
            from .remotecheck import checked_records

            pairs = checked_records(pairs, self.db.paths, offs, self.db.metas, self._reread)
        try:
            yield from pairs
        finally:
            stream.close()

    def _reread(self, s: int, local: int) -> bytes:
        """Record ``local`` of remote shard ``s`` read again from the origin (past the cache)."""
        sh = self._shards[s]
        return self._source.reread(sh.path, int(sh.offsets[local]), int(sh.lengths[local]))

    def extents(self, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
        """File offset and length (:data:`~seqloader.format.meta.EXTENT_DTYPE`) of every record
        of ``ranges``, found by walking the B-tree in key order.  The records' own pages
        are not read: LMDB hands out a value's address from its leaf entry (an overflow
        page number), so this reads the leaf pages -- ~1 % of the file for photos, e.g.
        ~40 MB for ImageNet's 1.28 M records -- not the data.  (It read every record
        until stop 20: a resumed preprocessing run re-read all it had written.)"""
        shards = self._open()
        self._check_unchanged(shards)
        out = [shards[s].walk_extents(a, b) for s, a, b in self._split(ranges)]
        return np.concatenate(out) if out else np.zeros(0, EXTENT_DTYPE)

    def copy_into(self, value: memoryview, out: np.ndarray) -> None:
        """Copy a value yielded by :meth:`read` into ``out`` (a uint8 array of its length)
        without mapping any page of the file into this process (NOTE [ mapped pages ])."""
        self._source.copy_into(value, out)

    def get(self, index: int) -> memoryview:
        """Random access to one record (used to refill a shuffle buffer on resume)."""
        shards = self._open()
        (s, a, _), = self._split([(index, index + 1)])
        return shards[s].get(a)

    def release(self, values: Sequence[memoryview]) -> None:
        """Drop used values' pages from this process's page tables (NOTE [ mapped pages ]).
        The values stay valid (touching them again is a minor fault from the page cache)."""
        if self._source is not None:
            self._source.release(values)

    def encoded(self, records: Sequence[tuple[int, memoryview]]
                ) -> tuple[list[memoryview | bytes], list[int]]:
        """The encoded image and label of each ``(index, value)`` :meth:`read` yielded: a
        raw batch, without copying the images (NOTE [ raw batches ] in
        :mod:`seqloader.read.raw`).  Raises :class:`FormatError` naming a record that is
        not a valid one.  Pages of the last batch's images are unmapped now."""
        for s in self._lent:
            unmap_file(self._shards[s])
        self._lent.clear()
        return encoded(self._shards, self._offsets, self.direct, records, self._lent)

    def close(self) -> None:
        """Close the files; values yielded earlier become invalid."""
        if self._source is not None:
            self._source.close()
            self._source = None
        if self._shards is not None:
            for sh in self._shards:
                sh.close()
            self._shards = None

    def __getstate__(self) -> dict:
        if self._shards is not None:
            raise RuntimeError("a RangeReader that has been used cannot be pickled or forked; "
                               "create it in the parent and use it only in the worker")
        return self.__dict__.copy()


def open_byte_source(shards: Sequence[Any], *, io: str, total_bytes: int, window: int,
                     fault_in: bool, remote: "RemoteSource | None" = None) -> ByteSource:
    """The source for ``shards`` (:class:`~seqloader.read.shard.Shard` s): remote for a
    remote database; direct I/O when :func:`~seqloader.read.iomode.choose` says so and
    every file has record extents on a file system with ``O_DIRECT`` (else buffered,
    with a warning when ``io="direct"`` was asked for); buffered otherwise.  ``window``
    is the read-ahead in bytes, ``fault_in`` as for the reader."""
    if remote is not None:
        from .remote import RemoteStream

        return RemoteStream(remote, window)
    if choose(io, total_bytes):
        why = _open_direct(shards)
        if why is None:
            return direct.DirectStream(window)
        if io == "direct":
            warnings.warn(f"io='direct': {why}; reading through the page cache instead",
                          stacklevel=5)
    return BufferedSource(shards, window, fault_in)


def _open_direct(shards: Sequence[Any]) -> str | None:
    """Open every shard for direct I/O (``shard.fd_direct``); None when done, else why
    not (then none is open)."""
    why = next((f"{sh.path} has no record extents (an older file)" for sh in shards
                if sh.extents is None), None)
    for sh in shards:
        if why is not None:
            break
        sh.fd_direct = direct.open_direct(sh.path)
        if sh.fd_direct is None:
            why = f"the file system of {sh.path} does not support O_DIRECT"
        elif not os.path.samestat(os.fstat(sh.fd_direct), os.fstat(sh.fd)):
            for s in shards:
                s.close_direct()
            raise FormatError(f"{sh.path} was replaced while it was being opened; "
                              "open it again: create a new Loader/reader")
    if why is not None:
        for sh in shards:
            sh.close_direct()
    return why
