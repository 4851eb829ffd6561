"""The runs: one (loader, mode, workers) measured into a result row, and the
``cpu-limit`` rows."""
from __future__ import annotations

import argparse
import time
from typing import Any

from .cache import _residency_of, evict
from .cpulimit import cpu_limit
from .data import _files_sample
from .host import _storage
from .measure import MB, measure
from .modes import _transform_for, imagenet_train_transform
from .procs import _alive, _usable_cores, process_tree
from .sources import _Sources

__all__ = ["RESULT_KEYS"]

#: The keys of every result row, in order (``leftover_processes`` is added only when a
#: run's worker processes outlived it, which should never happen).
RESULT_KEYS = ("loader", "mode", "workers", "batch_size", "images", "batches", "seconds",
               "images_per_s", "mb_per_s", "bytes", "bytes_exact", "first_batch_s",
               "peak_rss_mb", "peak_pss_mb", "peak_uss_mb", "peak_anon_mb", "base_rss_mb",
               "base_pss_mb", "peak_processes", "cpu_percent", "cpu_seconds", "cores", "cold",
               "evicted", "resident_before", "pipeline", "stopped", "warmup_batches", "epochs",
               "per_process_images_per_s", "scale", "rehearsal_first_batch_s",
               "disk_mb_per_s", "major_faults", "sample_records", "sample_mean_bytes",
               "data_mean_bytes", "io")


class _Epochs:
    """Loop a seqloader Loader over epochs until closed."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.epochs = loader, 0
        self.io: str | None = None  # how the loader's reader read ("buffered"/"direct")

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
        feeder = self.loader._feeder  # (gone once closed)
        if feeder is not None:
            self.io = "direct" if feeder.reader.direct else "buffered"
        self.loader.close()


def _run_one(args: argparse.Namespace, src: _Sources, loader: str, mode: str, workers: int,
             progress: bool) -> dict[str, Any]:
    transform = _transform_for(mode)
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

        if mode == "raw":
            count = lambda b: (len(b[0]), sum(len(x) for x in b[0]))  # noqa: E731
        else:
            mean = src.mean_db_bytes
            count = lambda b: (len(b[1]), int(round(len(b[1]) * mean)))  # noqa: E731
        pipeline = ("raw read" if mode == "raw" else "fused decode+transform" if mode == "full"
                    else "decode+transform")
    else:
        from .files import FilesDataset, FilesLoader

        def make():
            ds = FilesDataset(src.scan.root, src.scan.paths, src.scan.labels, transform)
            holder["it"] = FilesLoader(ds, batch_size=B, num_workers=workers, seed=args.seed,
                                       start_method=args.start_method)
            return holder["it"]

        count = lambda b: (len(b[1]), int(b[2]))  # noqa: E731
        pipeline = "raw read" if mode == "raw" else "decode+transform"
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
    row["resident_before"] = _residency_of(paths, loader)
    try:
        res = measure(make, batches=args.batches, seconds=args.seconds, warmup=args.warmup,
                      count=count, progress=progress, desc=f"{loader} {mode} w={workers}",
                      disk=_storage(paths[0])["device"] if paths else None)
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
               io=getattr(holder.get("it"), "io", None))
    return _row(row)


def _row(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as a result row: every key of :data:`RESULT_KEYS` (None if absent)."""
    row = {k: values.get(k) for k in RESULT_KEYS}
    if values.get("leftover_processes"):
        row["leftover_processes"] = values["leftover_processes"]
    return row


def _wait_children_gone(res: dict[str, Any], timeout: float = 10.0) -> None:
    """Workers were closed; make sure none outlives its run (they would skew the next)."""
    before = set(_BYSTANDERS)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in process_tree()[1:] if p not in before and _alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        res["leftover_processes"] = left


_BYSTANDERS: set[int] = set()


def _cpu_limit_rows(args: argparse.Namespace, src: _Sources, loader: str,
                    workers: list[int]) -> list[dict[str, Any]]:
    seconds = min(args.seconds, 5.0) if args.seconds else 3.0
    source = src.db if loader == "seqloader" else src.scan
    t = time.perf_counter()
    sample: dict[str, Any] = {}
    per = cpu_limit(source, imagenet_train_transform(), seconds=seconds, seed=args.seed,
                    stats=sample)
    spent = time.perf_counter() - t
    mean = src.mean_db_bytes if loader == "seqloader" else \
        (_files_sample(src.scan)["mean_bytes"] or 0.0)
    rows = []
    for w in workers:
        scale = min(max(1, w), _usable_cores())
        rate = per * scale
        rows.append(_row({
            "loader": loader, "mode": "cpu-limit", "workers": w, "batch_size": args.batch_size,
            "seconds": round(spent, 3), "images_per_s": round(rate, 2),
            "mb_per_s": round(rate * mean / MB, 3), "bytes_exact": False,
            "cpu_percent": round(100.0 * scale, 1), "cores": _usable_cores(), "cold": False,
            "pipeline": ("fused decode+transform, in memory" if loader == "seqloader"
                         else "decode+transform, in memory"),
            "per_process_images_per_s": round(per, 2), "scale": scale,
            "sample_records": sample.get("records"),
            "sample_mean_bytes": sample.get("sample_mean_bytes"),
            "data_mean_bytes": round(mean, 1) if mean else None}))
    return rows

