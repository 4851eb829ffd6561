"""``info``: everything a database's metadata says (and its first records show), as a
JSON-ready dict and as text.  No data pass: sizes and labels come from the metadata's
record extents and labels; only the first few records are read (target samples, the
first image's size and restart markers)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...format.jpeg import grid_scan, jpeg_info
from ...format.meta import meta_extents
from ...format.records import unpack_record
from ...read.database import Database, empty_reason, open_database

__all__ = ["describe", "format_info", "SAMPLE_TARGETS"]

#: Records whose targets ``info`` shows.
SAMPLE_TARGETS = 5


def _names(db: Database) -> list[str]:
    """The files' paths, or URLs without credentials (a remote database)."""
    if db.remote is None:
        return [str(p) for p in db.paths]
    from ...read.remote import safe_url

    return [safe_url(str(u)) for u in db.paths]


def _file_sizes(db: Database) -> list[int]:
    if db.remote is not None:
        return [f.size for f in db.remote.files]
    return [p.stat().st_size for p in db.paths]


def _spread(db: Database, sizes: list[int]) -> dict[str, Any] | None:
    """Record sizes (bytes per stored record) from the metadata's extents."""
    lengths = []
    for m, size, p in zip(db.metas, sizes, _names(db)):
        ext = meta_extents(m, size, where=p) if m.complete else None
        if ext is None:
            return None
        lengths.append(ext["length"])
    x = np.concatenate(lengths) if lengths else np.zeros(0)
    if not len(x):
        return None
    q = np.percentile(x, [1, 50, 99])
    return {"min": int(x.min()), "p1": int(q[0]), "median": int(q[1]), "mean": float(x.mean()),
            "p99": int(q[2]), "max": int(x.max())}


def _first_records(db: Database, k: int) -> list:
    from ...read.reader import RangeReader

    if not db.num_records or not db.metas[0].complete:
        return []
    k = min(k, db.metas[0].num_records)
    reader = RangeReader(db)
    try:
        return [unpack_record(v, where=f"{_names(db)[0]} record {i}")
                for i, v in reader.read([(0, k)])]
    finally:
        reader.close()


def _target_value(rec: Any, kind: str) -> Any:
    """A record's target as JSON takes it, in its own type: the label (an int) of a class
    database; a target's value (numbers, strings, lists, dicts; a numpy array as a list,
    or, above 16 elements, a string naming its dtype and shape)."""
    if kind == "class":
        return int(rec.label)
    return _jsonable(rec.target)


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 16 else f"array {v.dtype} {list(v.shape)}"
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _target_text(target: Any, classes: list[str], kind: str) -> str:
    if kind == "class":
        name = classes[target] if 0 <= target < len(classes) else "?"
        return f"{target} ({name})"
    text = repr(target)
    return text if len(text) <= 80 else text[:77] + "..."


def describe(path: str | Path, split: str | None = None) -> dict[str, Any]:
    """What ``seqloader info`` says about one split, as a JSON-ready dict."""
    db = open_database(path, split, require_complete=False, require_records=False)
    m0 = db.metas[0]
    sizes = _file_sizes(db)
    first = _first_records(db, SAMPLE_TARGETS)
    kind = m0.target_kind
    labels = db.labels() if kind == "class" and all(m.labels for m in db.metas) else None
    per_class = np.bincount(labels, minlength=len(db.classes)) if labels is not None else None
    dims = None
    if first:
        r = first[0]
        dims = list(r.shape[:2]) if r.shape is not None else (
            list(jpeg_info(r.image)[:2]) if jpeg_info(r.image) else None)
    scan = grid_scan(first[0].image) if first and first[0].shape is None else None
    return {
        "paths": _names(db), "split": db.split, "num_records": db.num_records,
        "format_version": m0.version, "complete": all(m.complete for m in db.metas),
        "image_format": m0.image_format, "short_side": (m0.writer or {}).get("short_side"),
        "target_kind": kind,
        "sample_targets": [_target_value(r, kind) for r in first],
        "num_classes": len(db.classes), "classes": db.classes,
        "images_per_class": None if per_class is None else {
            "min": int(per_class.min()) if len(per_class) else 0,
            "max": int(per_class.max()) if len(per_class) else 0,
            "empty_classes": int((per_class == 0).sum())},
        "shards": [{"path": p, "records": m.num_records, "file_bytes": s,
                    "image_bytes": m.image_bytes} for p, m, s in zip(_names(db), db.metas, sizes)],
        "shard_sizes": list(db.shard_sizes),
        "image_bytes": db.image_bytes, "file_bytes": sum(sizes),
        "record_bytes": _spread(db, sizes),
        "first_image_hw": dims,
        "shuffled": m0.shuffled, "seed": m0.seed, "fingerprint": m0.fingerprint,
        "checksums": [m.checksum for m in db.metas], "checksum_algorithm": m0.checksum_algorithm,
        "bad_files": sum(len(m.bad_files) for m in db.metas),
        "warned_files": sum(len(m.warned_files) for m in db.metas),
        "created": m0.created, "record_extents": all(bool(m.extents) for m in db.metas),
        "record_digests": all(bool(m.digests) or not m.num_records for m in db.metas),
        "writer": m0.writer,
        "restart_markers": None if scan is None else ("index" if scan.index != (0, 0) else "markers"),
        "empty": empty_reason(db) if db.num_records == 0 else None,
    }


def _writer_options(w: dict | None) -> str:
    if not w:
        return "(not recorded)"
    opts = [f"seqloader {w.get('seqloader', '?')}", "verify" if w.get("verify") else "no-verify"]
    if w.get("max_size"):
        opts.append(f"max-size {w['max_size']} (quality {w.get('quality')})")
    if w.get("restart_markers"):
        opts.append("restart markers")
    if w.get("dataset"):
        opts.append("from a dataset (write_dataset)")
    tool = w.get("tool")
    if tool:
        opts.append(f"then `seqloader {tool.get('command', '?')}`")
    return ", ".join(opts)


def _order(info: dict[str, Any]) -> str:
    """How the records are ordered (NOTE [ order of a copy ] for the tools' copies)."""
    tool = (info["writer"] or {}).get("tool") or {}
    if info["shuffled"]:
        return (f"shuffled, seed {info['seed']}" if info["seed"] is not None else
                "shuffled (several shuffled sources in turn: no one seed)")
    orders = tool.get("source_orders")
    if orders and "shuffled" in orders:
        return f"the sources' orders in turn ({', '.join(orders)})"
    return "sorted"


def _count_range(lo: int, hi: int) -> str:
    """``60`` when every class has 60 images, ``55-60`` when they differ."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def format_info(info: dict[str, Any]) -> str:
    """The text of ``seqloader info`` for one split's :func:`describe`."""
    cls = info["classes"]
    fmt = info["image_format"] + (f", short side {info['short_side']}" if info["short_side"] else "")
    if info["first_image_hw"]:
        fmt += f"; first image {info['first_image_hw'][1]}x{info['first_image_hw'][0]}"
    lines = [", ".join(info["paths"]),
             f"  split {info['split']!r}, format version {info['format_version']}, "
             + ("complete" if info["complete"] else "INCOMPLETE (re-run the writer to resume)"),
             f"  {info['num_records']} records; images: {fmt}"]
    if info["target_kind"] == "class":
        ipc = info["images_per_class"]
        lines.append(f"  targets: class labels, {len(cls)} classes ({', '.join(cls[:5])}"
                     f"{', ...' if len(cls) > 5 else ''})" + (
                         f"; {_count_range(ipc['min'], ipc['max'])} images per class"
                         + (f", {ipc['empty_classes']} empty" if ipc["empty_classes"] else "")
                         if ipc else ""))
    else:
        lines.append(f"  targets: any values ({info['target_kind']!r}; no class list)")
    if info["sample_targets"]:
        lines.append("  first targets: " + "; ".join(
            _target_text(t, cls, info["target_kind"]) for t in info["sample_targets"]))
    lines.append(f"  {_mib(info['image_bytes'])} of records, {_mib(info['file_bytes'])} on disk, "
                 f"{len(info['paths'])} shard(s)")
    if len(info["shards"]) > 1:
        for s in info["shards"][:8]:
            lines.append(f"    {Path(s['path']).name}: {s['records']} records, {_mib(s['file_bytes'])}")
        if len(info["shards"]) > 8:
            lines.append(f"    ... and {len(info['shards']) - 8} more")
    rb = info["record_bytes"]
    if rb:
        lines.append(f"  record size: median {rb['median'] / 1024:.1f} KiB, mean "
                     f"{rb['mean'] / 1024:.1f} KiB, 1-99 % {rb['p1'] / 1024:.1f}-"
                     f"{rb['p99'] / 1024:.1f} KiB, max {rb['max'] / 1024:.1f} KiB")
    lines += [
        f"  order: {_order(info)}; "
        f"{info['bad_files']} bad source file(s) skipped, {info['warned_files']} stored with a "
        "decoder warning",
        f"  fingerprint {info['fingerprint']}; checksum ({info['checksum_algorithm']}) "
        f"{', '.join(c[:16] + '…' for c in info['checksums'][:4])}"
        f"{' ...' if len(info['checksums']) > 4 else ''}",
        f"  written with: {_writer_options(info['writer'])}",
        "  record extents: " + ("yes (read without B-tree lookups)" if info["record_extents"]
                                else "no (an older writer: records are found through the "
                                     "B-tree; re-create the file to get them)"),
        "  record digests: " + ("yes (each record read over the network is checked)"
                                if info["record_digests"] else
                                "no (an older writer: records read over the network get "
                                "lighter checks; re-create the file to get them)")]
    if info["restart_markers"]:
        lines.append("  restart markers (first record): " + (
            "yes, with a restart index" if info["restart_markers"] == "index" else
            "yes, without a restart index (an older writer: each crop scans for the markers; "
            "re-create the file for a ~4-5 % faster fused transform)"))
    if info["empty"]:
        lines.append(f"  EMPTY: {info['empty']}")
    return "\n".join(lines)
