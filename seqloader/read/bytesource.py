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

:func:`~seqloader.read.reader.open_byte_source` chooses one; adding a source means one
module and one branch there.  This module imports none of them: they import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

__all__ = ["ByteSource", "Part"]


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
