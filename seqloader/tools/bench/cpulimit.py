"""``cpu-limit`` mode: the decode+transform rate of one process over records held in
memory (no I/O), the most one worker can deliver."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .data import _db_records, _spread

__all__ = ["cpu_limit"]


def cpu_limit(source: Any, transform: Callable | None, *, seconds: float = 3.0,
              records: int = 3000, seed: int = 0, stats: dict | None = None) -> float:
    """Images/s of the decode+transform code of one loader, in ONE process and thread,
    over encoded images already in memory (no I/O): the most one worker can deliver.

    ``source`` selects the code path.  A :class:`~seqloader.read.database.Database` (or a database
    path): what a seqloader worker does -- with a fused pipeline
    (``compile_fused(transform)``) the workers' own ``decode_batch`` over batches of 16
    records (unpack, draw, decode into preallocated samples: NOTE [ draw, then decode ]
    in ``seqloader/dataflow/batch.py``), or, for other transforms, msgpack-unpack +
    ``decode_rgb`` + transform + copy into a sample.  A
    :class:`~seqloader.write.scan.Scan` or a sequence of image file paths: what the files loader
    does -- ``decode_rgb`` + transform.  ``records`` images spread over the data are
    read first; the loop runs whole passes over them until ``seconds`` have passed
    (OpenCV limited to one thread meanwhile).  Multiply by the cores used for the
    machine's limit.  ``stats``, if given, receives ``records`` and
    ``sample_mean_bytes`` (the encoded size of the sample: compare it with the data's
    mean -- decoding cost follows it).

    NOTE [ a representative sample ]: the sample must cost what the data costs.  Until
    commit 140b780 it was 300 records; on the 21,000-image benchmark set their mean
    size was 87.9 KB against the data's 99.2 KB, and the limit measured 878/s per
    process against 819/s over 3,000 records (99.3 KB: the data's mean), alternated
    three times -- the limit was overstated by ~7 %.  3,000 records (~300 MB in
    memory for ImageNet-sized images) put the sample's mean within ~1 % of the data's.
    """
    import cv2
    import msgpack

    from ...read.database import Database, open_database
    from ...dataflow.batch import BatchSpec, batch_rng, decode_batch
    from ...write.scan import Scan
    from ...transforms import adapt, compile_fused, decode_rgb

    if isinstance(source, (str, Path)):
        source = open_database(source)
    rng = batch_rng(seed, 0, 0, 0)
    if isinstance(source, Database):
        values = _db_records(source, _spread(source.num_records, records))
        fused = compile_fused(transform) if transform is not None else None
        fn = adapt(transform) if transform is not None and fused is None else None
        out = None
        units: list[Any] = values  # what one() is called with
        if fused is not None:  # runs of 16 records through decode_batch, as a worker does
            out = np.empty((16, *fused.out_shape), fused.out_dtype)
            spec = BatchSpec(mode="decode", batch_size=16, seed=seed, fused=fused,
                             sample_shape=fused.out_shape, sample_dtype=str(fused.out_dtype))
            labels = np.empty(16, np.int64)
            units = [values[k:k + 16] for k in range(0, len(values), 16)]
        elif fn is not None:
            first = msgpack.unpackb(values[0], raw=False)["image"]
            s = np.asarray(fn(decode_rgb(first), rng))
            out = np.empty((16, *s.shape), s.dtype)

        def one(i: int, value: Any) -> int:
            if fused is not None:
                decode_batch(spec, value, range(len(value)), labels[:len(value)],
                             out[:len(value)], rng)
                return len(value)
            rec = msgpack.unpackb(value, raw=False)
            if fn is not None:
                np.copyto(out[i % 16], np.asarray(fn(decode_rgb(rec["image"]), rng)),
                          casting="same_kind")
            return 1
    else:
        if isinstance(source, Scan):
            paths = [os.path.join(source.root, source.paths[i])
                     for i in _spread(len(source.paths), records)]
        else:
            paths = [str(source[i]) for i in _spread(len(source), records)]
        values = []
        for p in paths:
            with open(p, "rb") as f:
                values.append(f.read())
        units = values

        def one(i: int, value: Any) -> int:
            if transform is not None:
                np.ascontiguousarray(transform(decode_rgb(value)))
            return 1
    if not values:
        raise ValueError("cpu_limit: no records to measure")
    if stats is not None:
        stats.update(records=len(values),
                     sample_mean_bytes=round(sum(len(v) for v in values) / len(values), 1))
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        for i, v in enumerate(units[:5]):  # first-call allocations
            one(i, v)
        n, t0 = 0, time.perf_counter()
        while True:
            for v in units:
                n += one(n, v)
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
    finally:
        cv2.setNumThreads(threads)
    return n / dt

