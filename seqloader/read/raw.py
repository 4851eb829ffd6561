"""Raw batches: the encoded images and labels of records, without copying the images.

NOTE [ raw batches ]
A raw batch (``transform=None``) is the records' encoded images and labels. Copying each
image out (``msgpack.unpackb``, or ``pread`` into a new ``bytes``) costs more CPU than
all else the reader does per record (benchmarks/RESULTS.md); so the images are read-only
memoryviews instead: of the file's map (buffered reading -- the page cache holds the
bytes), of the record's private copy (direct I/O, remote); of older files without record
extents, ``bytes`` (a view of LMDB's map would not outlive its transaction). The reader
finds the image and label with two small ``pread`` s (NOTE [ record layout ]), so it
maps no page itself; a consumer that reads a view maps its pages, and the reader unmaps
those files at the next batch (NOTE [ mapped pages ]: the views stay valid, reading one
again is a minor fault). ``bytes(view)`` copies, e.g. to pickle one.  The Loader copies
each image once into its own ``bytes`` (its raw batches outlive the reader and pickle,
as a DataLoader's do); that copy is most of what it spends per raw image
(benchmarks/RESULTS.md, "raw-mode reader CPU").
"""
from __future__ import annotations

import bisect
import os
from typing import Any, Sequence

from .pages import unmap
from ..format.records import IMAGE_HEAD, LABEL_TAIL, image_span, label_at, unpack_record

__all__ = ["encoded", "unmap_file"]


def encoded(shards: Sequence[Any], offsets: Sequence[int], private: bool,
            records: Sequence[tuple[int, memoryview]], lent: set[int]
            ) -> tuple[list[memoryview | bytes], list[int]]:
    """The image and label of each ``(global index, value)`` of ``shards`` (first global
    indices ``offsets``; ``private``: the values are private copies, not map views).
    Adds to ``lent`` the shard numbers whose pages the images may map."""
    images: list[memoryview | bytes] = []
    labels: list[int] = []
    for index, value in records:
        s = bisect.bisect_right(offsets, index) - 1
        sh = shards[s]
        got = None
        if not private and sh.extents is not None:
            local = index - offsets[s]
            off = int(sh.offsets[local])
            got = _locate(sh.fd_through, off, int(sh.lengths[local]))
            if got is not None:
                got = sh.view[off + got[0]:off + got[1]], got[2]
        elif (span := image_span(value[:IMAGE_HEAD], len(value))) is not None:
            label = label_at(value[span[1]:span[1] + LABEL_TAIL])
            if label is not None:  # (a view of LMDB's map would die with its txn)
                image = value[span[0]:span[1]]
                got = (image if private else bytes(image)), label
        if got is None:
            rec = unpack_record(value, where=f"record {index} of {sh.path}")
            got = rec.image, rec.label
        if not private:
            lent.add(s)
        images.append(got[0])
        labels.append(got[1])
    return images, labels


def unmap_file(sh: Any) -> None:
    """Unmap every page of an open file's map (NOTE [ mapped pages ])."""
    if sh.base is not None:
        unmap(sh.base, sh.mapped)


def _locate(fd: int, off: int, n: int) -> tuple[int, int, int] | None:
    """``(start, stop, label)`` of the record of ``n`` bytes at ``off`` in the file: its
    image's bytes within the record and its label, from two small ``pread`` s of the
    page cache (NOTE [ record layout ]); None for another layout."""
    span = image_span(os.pread(fd, IMAGE_HEAD, off), n)
    if span is None:
        return None
    label = label_at(os.pread(fd, min(LABEL_TAIL, n - span[1]), off + span[1]))
    return None if label is None else (span[0], span[1], label)
