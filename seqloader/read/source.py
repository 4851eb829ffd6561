"""The byte source under a reader: how planned record spans become record values.

NOTE [ byte source ]
A :class:`~seqloader.read.reader.RangeReader` knows *which* bytes a pass needs: it
cuts record ranges at file boundaries and describes each piece as a :class:`Part`
(the file, its records' extents and the page-aligned spans that hold them).  A
:class:`ByteSource` knows *how* to get them: it reads the spans in large sequential
requests and yields every record in order.  Three implement it:

* ``buffered`` (:class:`~seqloader.read.buffered.BufferedSource`): through the page
  cache; values are views of the file's map, a readahead thread reads the spans
  (NOTE [ sequential I/O ]);
* ``direct`` (:class:`~seqloader.read.direct.DirectStream`): ``O_DIRECT`` reads into a
  ring, values are private copies (NOTE [ direct I/O ]);
* ``remote`` (:class:`~seqloader.read.remote.RemoteStream`): ranged GETs into the same
  ring (NOTE [ remote reading ]).

:func:`open_source` chooses one; adding a source means one module and one branch there.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

from ..errors import FormatError

if TYPE_CHECKING:
    from .remote import RemoteSource

__all__ = ["ByteSource", "Part", "open_source"]


@dataclass
class Part:
    """Records of one file to read in order: their byte ``offsets``/``lengths`` and the
    ``spans`` (page-aligned ``(start, end)``, in order) that hold them, with ``ids`` the
    span of each record (None: all in span 0).  ``offsets``/``lengths`` are None for a
    file without record extents (read through LMDB by the buffered source)."""

    path: str
    fd: int
    spans: list[tuple[int, int]]
    ids: np.ndarray | None
    offsets: np.ndarray | None
    lengths: np.ndarray | None
    #: a buffered descriptor of the same file, for records larger than the ring (reading
    #: the file opened, not whatever the path names now); None: open ``path``
    fd_buffered: int | None = None
    #: the open file (:class:`~seqloader.read.shard.Shard`) and the local number of the
    #: first record and how many: what the buffered source reads with
    shard: Any = None
    first: int = 0
    count: int = -1

    def __post_init__(self) -> None:
        if self.count < 0:
            self.count = len(self.offsets) if self.offsets is not None else 0


class ByteSource(Protocol):
    """What a reader reads with (NOTE [ byte source ]).  One pass at a time; used in the
    process that created it."""

    #: ``"buffered"``, ``"direct"`` or ``"remote"``
    name: str

    def read(self, parts: Iterable[Part]) -> Iterator[memoryview]:
        """Every record of ``parts``, in order (finite; one pass; closing the iterator
        early ends the pass).  Values stay valid until :meth:`close`."""
        ...

    def copy_into(self, value: memoryview, out: np.ndarray) -> None:
        """Copy a value :meth:`read` yielded into ``out`` (uint8, its length) without
        mapping file pages into this process."""
        ...

    def release(self, values: Sequence[memoryview]) -> None:
        """The values are used: drop whatever of them this process maps (the values
        stay valid)."""
        ...

    def close(self) -> None:
        ...


def open_source(shards: Sequence[Any], *, io: str, total_bytes: int, window: int,
                fault_in: bool, remote: "RemoteSource | None" = None) -> ByteSource:
    """The source for ``shards`` (:class:`~seqloader.read.shard.Shard` s): remote for a
    remote database; direct I/O when :func:`~seqloader.read.direct.choose` says so and
    every file has record extents on a file system with ``O_DIRECT`` (else buffered,
    with a warning when ``io="direct"`` was asked for); buffered otherwise.  ``window``
    is the read-ahead in bytes, ``fault_in`` as for the reader."""
    from . import direct

    if remote is not None:
        from .remote import RemoteStream

        return RemoteStream(remote, window)
    if direct.choose(io, total_bytes):
        why = _open_direct(shards)
        if why is None:
            return direct.DirectStream(window)
        if io == "direct":
            warnings.warn(f"io='direct': {why}; reading through the page cache instead",
                          stacklevel=5)
    from .buffered import BufferedSource

    return BufferedSource(shards, window, fault_in)


def _open_direct(shards: Sequence[Any]) -> str | None:
    """Open every shard for direct I/O (``shard.fd_direct``); None when done, else why
    not (then none is open)."""
    from .direct import open_direct

    why = next((f"{sh.path} has no record extents (an older file)" for sh in shards
                if sh.extents is None), None)
    for sh in shards:
        if why is not None:
            break
        sh.fd_direct = open_direct(sh.path)
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
