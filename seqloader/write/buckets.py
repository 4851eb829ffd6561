"""Pass 2 of the external shuffle: a bucket's frames in key order, prepared in worker processes.

NOTE [ checks in pass 2 ]
Pass 1 only moves bytes (source -> bucket frames, sequential reads and writes); every
image is prepared (decode check, repairs, re-encoding, packing: :func:`~seqloader.write.shardwriter.prepare_record`)
in pass 2, as the folder-tree path prepares its files: in the writer's process pool,
overlapped with the writing.  So pass 1 runs at the disk's pace and the CPU-bound
checks overlap pass 2's reading and writing instead of standing alone in pass 1; and a
split that fits in memory costs one tar parse more than the tree, not a pass of checks
more.  Workers are handed a frame's location, not its bytes: ``(bucket, offset, size)``
in a bucket file (read with ``pread``: the main process has just brought the bucket
into the page cache, NOTE [ pass-2 read-ahead ]) or in the in-memory buckets, which the
workers, forked after pass 1, share copy-on-write.  A frame's result is the same
whichever process or pass prepares it, so the written bytes are those of any other run.
"""
from __future__ import annotations

import io
import os
import struct
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..workers.processmap import process_map
from .options import WriteOptions
from .shardwriter import prepare_record
from .sources import read_at

__all__ = ["FRAME", "bucket_frames", "prepared"]

FRAME = struct.Struct("<QQI")  # key, source index, payload length
_OPT: WriteOptions | None = None  # what forked workers prepare with
_BUCKETS: Sequence = ()  # the buckets, as workers see them (in memory, or file paths)
_LABELS: np.ndarray = np.empty(0, np.int32)  # each source record's label index
_NAMES: Sequence[str] = ()  # each source record's name


def bucket_frames(f, limit: int, path: Path | None) -> list[tuple[int, int, int, int]]:
    """``(key, source index, payload offset, payload size)`` of a bucket's first ``limit``
    bytes, in file order.  A bucket file is read whole, front to back (read-ahead
    advised for all of it, so it streams), which leaves it in the page cache for the
    workers' ``pread``; only the 20-byte headers are parsed."""
    out = []
    if isinstance(f, io.BytesIO):
        buf, pos = f.getbuffer(), 0
        while pos < limit:
            key, src, n = FRAME.unpack_from(buf, pos)
            out.append((key, src, pos + FRAME.size, n))
            pos += FRAME.size + n
        del buf
        return out
    with open(path, "rb", buffering=1 << 20) as fh:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fh.fileno(), 0, limit, os.POSIX_FADV_WILLNEED)
        pos = 0
        while pos < limit:
            key, src, n = FRAME.unpack(fh.read(FRAME.size))
            out.append((key, src, pos + FRAME.size, n))
            pos += FRAME.size + n
            fh.seek(pos)
    return out


def _prepare_at(item: tuple) -> tuple:
    """In a worker (or this process): ``(pos, src, record value, digest, warning)``, or
    ``(pos, src, None, reason, None)`` for a bad image, for the frame at ``item = (pos,
    src, bucket, offset, size)``: :func:`~seqloader.write.shardwriter.prepare_record`, here, off
    the writing process."""
    pos, src, b, off, n = item
    bucket = _BUCKETS[b]
    data = (bytes(bucket.getbuffer()[off:off + n]) if isinstance(bucket, io.BytesIO)
            else read_at(bucket, off, n))
    return (pos, src, *prepare_record(data, int(_LABELS[src]), _NAMES[src], _OPT))


def prepared(items: Iterator[tuple], buckets: Sequence, labels: np.ndarray, names: Sequence[str],
             opt: WriteOptions, where: Callable[[tuple], tuple[int, str]]) -> Iterator[tuple]:
    """:func:`_prepare_at` of each item, in order: in the writer's process pool where
    images are decoded (NOTE [ checks in pass 2 ]), else here (a header check only)."""
    global _OPT, _BUCKETS, _LABELS, _NAMES
    _OPT, _BUCKETS = opt, [str(b) if isinstance(b, Path) else b for b in buckets]
    _LABELS, _NAMES = labels, names
    if (opt.verify or opt.max_size or opt.restart_markers) and hasattr(os, "fork") and (
            os.cpu_count() or 1) > 1:  # (set above before the workers fork)
        yield from process_map(_prepare_at, items, workers=min(opt.workers,
                                                               (os.cpu_count() or 1) + 1),
                               where=where)
    else:
        yield from map(_prepare_at, items)
