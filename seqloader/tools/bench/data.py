"""What the benchmarked data is like: records read from a database and image files,
~100 spread over the data, described by size and resolution."""
from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

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


def _db_records(db: Any, indices: Iterable[int]) -> list[bytes]:
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


def _spread(n: int, k: int) -> list[int]:
    return sorted(set(np.linspace(0, n - 1, min(n, k)).astype(int).tolist())) if n else []


def _db_sample(db: Any, k: int = _SAMPLE) -> dict[str, Any]:
    import msgpack

    values = _db_records(db, _spread(db.num_records, k))
    return _image_stats(msgpack.unpackb(v, raw=False)["image"] for v in values)


def _files_sample(scan: Any, k: int = _SAMPLE) -> dict[str, Any]:
    blobs = []
    for i in _spread(len(scan.paths), k):
        with open(os.path.join(scan.root, scan.paths[i]), "rb") as f:
            blobs.append(f.read())
    return _image_stats(blobs)

