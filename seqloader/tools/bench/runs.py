"""The runs: the loaders and modes and each mode's transform, one (loader, mode, workers)
measured into a result row, and ``cpu-limit`` (the decode+transform rate of one process
over records held in memory, the most one worker can deliver)."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .cache import evict, residency_of
from .data import Inputs, db_records, files_sample, spread
from .machine import alive, process_tree, storage, usable_cores
from .measure import MB, measure

__all__ = ["LOADERS", "MODES", "DECODE_CROP", "imagenet_train_transform", "decode_transform",
           "transform_for", "RESULT_KEYS", "BYSTANDERS", "run_one", "cpu_limit", "cpu_limit_rows"]


LOADERS = ("seqloader", "files")
MODES = ("raw", "decode", "full", "cpu-limit")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DECODE_CROP = 64


def imagenet_train_transform():
    """RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize (ImageNet)."""
    from ... import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def decode_transform():
    """The ``decode`` mode's transform: a 64 px centre crop of the decoded image."""
    from ... import transforms as T

    return T.CenterCrop(DECODE_CROP)


#: What each bench workload (``--mode``) runs, by name (any other: the full train recipe).
PIPELINES = {"raw": "raw read", "decode": "decode+transform", "full": "fused decode+transform"}


def transform_for(mode: str):
    """The transform of bench workload ``mode`` (None: raw batches of encoded bytes)."""
    return {"raw": lambda: None, "decode": decode_transform}.get(mode, imagenet_train_transform)()


#: The keys of every result row, in order (``leftover_processes`` is added only when a
#: run's worker processes outlived it, which should never happen).
RESULT_KEYS = ("loader", "mode", "workers", "batch_size", "images", "batches", "seconds",
               "images_per_s", "mb_per_s", "bytes", "bytes_exact", "first_batch_s",
               "peak_rss_mb", "peak_pss_mb", "peak_uss_mb", "peak_anon_mb", "base_rss_mb",
               "base_pss_mb", "peak_processes", "cpu_percent", "cpu_seconds", "cores", "cold",
               "evicted", "resident_before", "pipeline", "stopped", "warmup_batches", "epochs",
               "per_process_images_per_s", "scale", "rehearsal_first_batch_s",
               "disk_mb_per_s", "major_faults", "sample_records", "sample_mean_bytes",
               "data_mean_bytes", "io", "diagnosis")


class _Epochs:
    """Loop a seqloader Loader over epochs until closed."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.epochs = loader, 0
        self.io: str | None = None  # how the loader's reader read ("buffered"/"direct")
        self.diagnosis: str | None = None  # the stage that limited it, and why

    def __iter__(self):
        if len(self.loader) == 0:
            ld = self.loader
            raise ValueError(f"{ld.db.num_records} record(s) in the database make no batch of "
                             f"{ld.batch_size} (drop_last={ld.drop_last}, world size "
                             f"{ld.world_size}): benchmark a split that has images")
        while True:
            self.epochs += 1
            yield from self.loader

    def close(self) -> None:
        found = self.loader.diagnosis()  # (over the last batches measured)
        self.diagnosis = None if found is None else found.message
        try:  # (before it is closed: the reader goes with it)
            self.io = "direct" if self.loader.pipeline.source.reader.direct else "buffered"
        except RuntimeError:  # (never iterated: no reader)
            pass
        self.loader.close()


def run_one(args: argparse.Namespace, src: Inputs, loader: str, mode: str, workers: int,
             progress: bool) -> dict[str, Any]:
    transform = transform_for(mode)
    B = args.batch_size
    holder: dict[str, Any] = {}
    if loader == "seqloader":
        from ...loader import Loader

        def make():
            ld = Loader(src.db_path, args.split, transform, batch_size=B, shuffle=True,
                        num_workers=workers, cache=args.cache, seed=args.seed,
                        start_method=args.start_method, io=args.io, rank=0, world_size=1)
            holder["it"] = _Epochs(ld)
            return holder["it"]

        if transform is None:  # (raw batches: the encoded bytes)
            count = lambda b: (len(b[0]), sum(len(x) for x in b[0]))  # noqa: E731
        else:
            mean = src.mean_db_bytes
            count = lambda b: (len(b[1]), int(round(len(b[1]) * mean)))  # noqa: E731
        pipeline = PIPELINES.get(mode, PIPELINES["decode"])
    else:
        from .filesloader import FilesDataset, FilesLoader

        def make():
            ds = FilesDataset(src.scan.root, src.scan.paths, src.scan.labels, transform)
            holder["it"] = FilesLoader(ds, batch_size=B, num_workers=workers, seed=args.seed,
                                       start_method=args.start_method)
            return holder["it"]

        count = lambda b: (len(b[1]), int(b[2]))  # noqa: E731
        pipeline = PIPELINES["raw"] if transform is None else PIPELINES["decode"]
    row: dict[str, Any] = {"loader": loader, "mode": mode, "workers": workers, "batch_size": B,
                           "cold": bool(args.cold), "evicted": None, "resident_before": None}
    paths = src.data_paths(loader)
    if args.cold and not args.no_rehearsal:
        rehearsal = measure(make, batches=1, warmup=0, count=count, progress=False)
        _wait_children_gone(rehearsal)
        row["rehearsal_first_batch_s"] = rehearsal["first_batch_s"]
    if args.cold:
        evict(paths)
        row["evicted"] = True
    row["resident_before"] = residency_of(paths, loader)
    try:
        res = measure(make, batches=args.batches, seconds=args.seconds, warmup=args.warmup,
                      count=count, progress=progress, desc=f"{loader} {mode} w={workers}",
                      disk=storage(paths[0])["device"] if paths else None)
    except Exception as e:
        if loader != "files":
            raise
        # a DataLoader worker's error arrives as "Caught ... Original Traceback ...": its
        # last line is the error itself
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise RuntimeError(f"the files loader ({mode}, {workers} workers) failed: "
                           f"{lines[-1]}") from e
    _wait_children_gone(res)
    row.update(res)
    if workers > 0 and res["peak_processes"] == 1:
        pipeline += " (in the main process: the loader started no workers)"
    row.update(bytes_exact=not (loader == "seqloader" and mode != "raw"), pipeline=pipeline,
               epochs=getattr(holder.get("it"), "epochs", None),
               io=getattr(holder.get("it"), "io", None),
               diagnosis=getattr(holder.get("it"), "diagnosis", None))
    return _row(row)


def _row(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as a result row: every key of :data:`RESULT_KEYS` (None if absent)."""
    row = {k: values.get(k) for k in RESULT_KEYS}
    if values.get("leftover_processes"):
        row["leftover_processes"] = values["leftover_processes"]
    return row


def _wait_children_gone(res: dict[str, Any], timeout: float = 10.0) -> None:
    """Workers were closed; make sure none outlives its run (they would skew the next)."""
    before = set(BYSTANDERS)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in process_tree()[1:] if p not in before and alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        res["leftover_processes"] = left


BYSTANDERS: set[int] = set()


def cpu_limit_rows(args: argparse.Namespace, src: Inputs, loader: str,
                    workers: list[int]) -> list[dict[str, Any]]:
    seconds = min(args.seconds, 5.0) if args.seconds else 3.0
    source = src.db if loader == "seqloader" else src.scan
    t = time.perf_counter()
    sample: dict[str, Any] = {}
    per = cpu_limit(source, imagenet_train_transform(), seconds=seconds, seed=args.seed,
                    stats=sample)
    spent = time.perf_counter() - t
    mean = src.mean_db_bytes if loader == "seqloader" else \
        (files_sample(src.scan)["mean_bytes"] or 0.0)
    rows = []
    for w in workers:
        scale = min(max(1, w), usable_cores())
        rate = per * scale
        rows.append(_row({
            "loader": loader, "mode": "cpu-limit", "workers": w, "batch_size": args.batch_size,
            "seconds": round(spent, 3), "images_per_s": round(rate, 2),
            "mb_per_s": round(rate * mean / MB, 3), "bytes_exact": False,
            "cpu_percent": round(100.0 * scale, 1), "cores": usable_cores(), "cold": False,
            "pipeline": ("fused decode+transform, in memory" if loader == "seqloader"
                         else "decode+transform, in memory"),
            "per_process_images_per_s": round(per, 2), "scale": scale,
            "sample_records": sample.get("records"),
            "sample_mean_bytes": sample.get("sample_mean_bytes"),
            "data_mean_bytes": round(mean, 1) if mean else None}))
    return rows


def cpu_limit(source: Any, transform: Callable | None, *, seconds: float = 3.0,
              records: int = 3000, seed: int = 0, stats: dict | None = None) -> float:
    """Images/s of the decode+transform code of one loader, in ONE process and thread,
    over encoded images already in memory (no I/O): the most one worker can deliver.

    ``source`` selects the code path.  A :class:`~seqloader.read.database.Database` (or a database
    path): what a seqloader worker does -- with a fused pipeline
    (``compile_fused(transform)``) the workers' own ``decode_batch`` over batches of 16
    records (unpack, draw, decode into preallocated samples: NOTE [ draw, then decode ]
    in ``seqloader/dataflow/decode.py``), or, for other transforms, msgpack-unpack +
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
    from ...dataflow.batch import BatchSpec
    from ...dataflow.cpumode import CPUMode
    from ...dataflow.decode import batch_rng, decode_batch
    from ...write.scan import Scan
    from ...transforms import adapt, compile_fused, decode_rgb

    if isinstance(source, (str, Path)):
        source = open_database(source)
    rng = batch_rng(seed, 0, 0, 0)
    if isinstance(source, Database):
        values = db_records(source, spread(source.num_records, records))
        fused = compile_fused(transform) if transform is not None else None
        fn = adapt(transform) if transform is not None and fused is None else None
        out = None
        units: list[Any] = values  # what one() is called with
        if fused is not None:  # runs of 16 records through decode_batch, as a worker does
            out = np.empty((16, *fused.out_shape), fused.out_dtype)
            spec = BatchSpec(mode=CPUMode(), batch_size=16, seed=seed, fused=fused,
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
                     for i in spread(len(source.paths), records)]
        else:
            paths = [str(source[i]) for i in spread(len(source), records)]
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
