"""``seqloader bench --compare-formats``: JPEG records or stored pixels on this host?

One process takes up to ``n`` records of a JPEG database and times, per image, the
training transform (the fused RandomResizedCrop(224) + flip + ToTensor + Normalize)
from the JPEG bytes and from the same images as stored pixels (decoded and shrunk to
``short_side`` beforehand, as ``--format pixels`` stores them), and the bytes each
record takes.  A loader of ``workers`` processes is then limited either by the CPU
(``workers x`` the per-image rate) or by the disk (``disk MB/s /`` the record size);
the faster format is the one whose limit is higher.  The disk's bandwidth is
``disk_mbps`` if given, else a sequential read of the database file (which the page
cache may flatter: give the disk's figure for a cold-data verdict).
"""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

__all__ = ["compare_formats", "format_comparison"]


def _read_mbps(path: str, limit: int = 1 << 30) -> float:
    t0, n = time.perf_counter(), 0
    with open(path, "rb", buffering=0) as f:
        while n < limit and (chunk := f.read(16 << 20)):
            n += len(chunk)
    return n / 1e6 / max(1e-9, time.perf_counter() - t0)


def compare_formats(path: Any, split: str | None = None, *, n: int = 200,
                    short_side: int | None = 256, workers: int | None = None,
                    disk_mbps: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Measure both formats on ``n`` records of the database at ``path`` (see module doc)."""
    from ..format.pixels import shrink_to
    from ..read.database import open_database
    from ..read.reader import RangeReader
    from ..format.records import unpack_record
    from ..transforms import (Compose, Normalize, RandomHorizontalFlip, RandomResizedCrop,
                              ToTensor, compile_fused, decode_rgb)

    db = open_database(path, split)
    if db.metas[0].image_format != "jpeg":
        raise ValueError(f"{path} stores pixels already; compare on a JPEG database")
    n = min(n, db.num_records)
    reader = RangeReader(db)
    try:
        jpegs = [unpack_record(v).image for _, v in reader.read([(0, n)])]
    finally:
        reader.close()
    pixels = [np.ascontiguousarray(shrink_to(decode_rgb(j), short_side)) for j in jpegs]
    fused = compile_fused(Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                                   Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
    out = np.empty(fused.out_shape, fused.out_dtype)

    def per_s(items: list) -> float:
        rng = np.random.default_rng(seed)
        best = 0.0
        for _ in range(2):  # best of two passes: the first warms caches
            t0 = time.perf_counter()
            for x in items:
                fused.finish(fused.prepare(x, rng), out)
            best = max(best, len(items) / (time.perf_counter() - t0))
        return best

    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    mbps = disk_mbps if disk_mbps is not None else _read_mbps(str(db.paths[0]))
    rows = {}
    for name, items, size in (("jpeg", jpegs, np.mean([len(j) for j in jpegs])),
                              ("pixels", pixels, np.mean([p.nbytes for p in pixels]))):
        rate = per_s(items)
        cpu, disk = workers * rate, mbps * 1e6 / size
        rows[name] = {"per_process_images_per_s": round(rate, 1), "record_kb": round(size / 1e3, 1),
                      "cpu_limit_images_per_s": round(cpu, 1),
                      "disk_limit_images_per_s": round(disk, 1),
                      "images_per_s": round(min(cpu, disk), 1)}
    faster = max(rows, key=lambda k: rows[k]["images_per_s"])
    return {"records": n, "workers": workers, "disk_mbps": round(mbps, 1),
            "disk_mbps_measured": disk_mbps is None, "short_side": short_side,
            "formats": rows, "faster": faster}


def format_comparison(doc: dict[str, Any]) -> str:
    """The comparison as a few lines of text."""
    lines = [f"{doc['records']} records, {doc['workers']} workers, disk "
             f"{doc['disk_mbps']:.0f} MB/s" + (" (measured: a warm page cache flatters it)"
                                               if doc["disk_mbps_measured"] else "")]
    for name, r in doc["formats"].items():
        lines.append(f"  {name:6s}: {r['record_kb']:8.1f} KB/record, {r['per_process_images_per_s']:7.1f} "
                     f"img/s per process -> CPU limit {r['cpu_limit_images_per_s']:8.0f}, disk "
                     f"limit {r['disk_limit_images_per_s']:8.0f}: {r['images_per_s']:8.0f} img/s")
    other = "pixels" if doc["faster"] == "jpeg" else "jpeg"
    ratio = doc["formats"][doc["faster"]]["images_per_s"] / max(1e-9, doc["formats"][other]["images_per_s"])
    lines.append(f"faster here: {doc['faster']} ({ratio:.2f}x)" + (
        f"; write it with `seqloader preprocess ... --format pixels --short-side "
        f"{doc['short_side']}`" if doc["faster"] == "pixels" else ""))
    return "\n".join(lines)
