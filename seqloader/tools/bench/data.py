"""What the runs read: the database and/or the class-folder tree named on the command
line, checked and scanned once for all runs (:class:`Inputs`), and ~100 records spread
over the data, described by size and resolution."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ...errors import NotFoundError

__all__ = ["Inputs", "db_sample", "files_sample", "db_records", "spread"]


class Inputs:
    """What the runs read: a database and/or a scanned class-folder tree."""

    def __init__(self, args: argparse.Namespace, loaders: list[str]) -> None:
        from ...read.database import open_database
        from ...format.files import database_splits
        from ...format.imagetree import image_tree_hint

        from ...read.remote import is_url

        remote = is_url(args.path)  # a database at a URL (NOTE [ remote reading ])
        p = args.path if remote else Path(args.path)
        if not remote and not p.exists():
            raise NotFoundError(f"{p} does not exist (expected a seqloader database or a "
                                "class-folder tree)")
        if args.split is None and not remote and not p.is_file():
            args.split = (database_splits(p) or ["train"])[0]  # (info and verify's rule)
        elif args.split is None and remote and not p.endswith(".lmdb"):
            args.split = "train"
        self.db = None
        self.db_path = p
        is_db = remote or p.is_file() or (p.is_dir() and any(p.glob(f"ILSVRC-{args.split}*.lmdb")))
        if is_db:  # a file of another split than --split is an error
            self.db = open_database(p, args.split)
            if args.split is None:  # a file, no --split: its own
                args.split = self.db.metas[0].split
        self.split = args.split
        files_dir = args.files if args.files else (None if is_db else p)
        if "seqloader" in loaders and self.db is None:
            tree = image_tree_hint(p)
            raise ValueError((f"{tree}; or" if tree else
                              f"{p} is not a seqloader database (no ILSVRC-{args.split}.lmdb or "
                              "shards there); create one with `seqloader preprocess`, or")
                             + " benchmark the folder's images with --loader files")
        self.scan = None
        self.scan_s = None
        self.files_excluded = 0
        if "files" in loaders:
            if files_dir is None:
                raise ValueError(f"the files loader reads a class-folder tree, and {p} is a "
                                 "database: pass the image folder with --files DIR")
            from .filesloader import resolve_tree
            from ...write.scan import scan_class_tree

            root = resolve_tree(files_dir, args.split)
            t = time.perf_counter()
            self.scan = scan_class_tree(root)
            self.scan_s = time.perf_counter() - t
            if not len(self.scan):
                raise ValueError(f"no images found under {root}")
            if self.db is not None:  # read the images the database holds, no others
                self.scan, self.files_excluded = _without_bad_files(self.scan, self.db)
        self.mean_db_bytes = (self.db.image_bytes / self.db.num_records
                              if self.db is not None and self.db.num_records else 0.0)

    def image_paths(self) -> list[str]:
        return [os.path.join(self.scan.root, q) for q in self.scan.paths]

    def data_paths(self, loader: str) -> list[str]:
        return [str(q) for q in self.db.paths] if loader == "seqloader" else self.image_paths()


def _without_bad_files(scan: Any, db: Any) -> tuple[Any, int]:
    """``scan`` without the source files preprocessing skipped as bad (the database's
    ``bad_files``, paths relative to the split folder as in the scan), so that both
    loaders read the same images and the files loader does not fail on one that
    cannot be decoded; and how many were left out."""
    import dataclasses

    from ...write.options import stored_name

    bad = {p for m in db.metas for p, _ in m.bad_files}  # (as stored: non-UTF-8 bytes escaped)
    keep = [i for i, q in enumerate(scan.paths) if stored_name(q) not in bad]
    if len(keep) == len(scan.paths):
        return scan, 0
    return (dataclasses.replace(scan, paths=[scan.paths[i] for i in keep],
                                labels=scan.labels[keep]), len(scan.paths) - len(keep))


_SAMPLE = 100


def _image_stats(blobs: Iterable[bytes]) -> dict[str, Any]:
    from ...format.jpeg import jpeg_info

    sizes, hs, ws = [], [], []
    for data in blobs:
        sizes.append(len(data))
        info = jpeg_info(data)
        if info is None:
            try:
                from ...transforms import decode_rgb

                info = decode_rgb(data).shape
            except ValueError:
                continue
        hs.append(info[0])
        ws.append(info[1])
    n = len(sizes)
    return {"n": n, "mean_bytes": round(float(np.mean(sizes)), 1) if n else None,
            "mean_height": round(float(np.mean(hs)), 1) if hs else None,
            "mean_width": round(float(np.mean(ws)), 1) if ws else None,
            "mean_megapixels": round(float(np.mean(np.multiply(hs, ws))) / 1e6, 4) if hs else None}


def db_records(db: Any, indices: Iterable[int]) -> list[bytes]:
    """The packed record values of global ``indices`` (read in the calling process)."""
    from ...read.database import close_env, open_env
    from ...format.keys import encode_key

    if db.remote is not None:  # ranged GETs (NOTE [ remote reading ])
        from ...read.reader import RangeReader

        reader = RangeReader(db)
        try:
            return [bytes(reader.get(int(i))) for i in indices]
        finally:
            reader.close()
    out = []
    offsets = db.offsets
    envs = [open_env(p) for p in db.paths]
    try:
        txns = [e.begin() for e in envs]
        for i in indices:
            s = int(np.searchsorted(offsets, i, side="right")) - 1
            value = txns[s].get(encode_key(int(i - offsets[s])))
            if value is None:
                raise ValueError(f"{db.paths[s]}: record {i} is missing")
            out.append(bytes(value))
        for t in txns:
            t.abort()
    finally:
        for e in envs:
            close_env(e)
    return out


def spread(n: int, k: int) -> list[int]:
    return sorted(set(np.linspace(0, n - 1, min(n, k)).astype(int).tolist())) if n else []


def db_sample(db: Any, k: int = _SAMPLE) -> dict[str, Any]:
    import msgpack

    values = db_records(db, spread(db.num_records, k))
    return _image_stats(msgpack.unpackb(v, raw=False)["image"] for v in values)


def files_sample(scan: Any, k: int = _SAMPLE) -> dict[str, Any]:
    blobs = []
    for i in spread(len(scan.paths), k):
        with open(os.path.join(scan.root, scan.paths[i]), "rb") as f:
            blobs.append(f.read())
    return _image_stats(blobs)
