"""``--quality``: the shuffle quality of the seqloader runs' settings, and of a uniform
shuffle for the files loader."""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from .sources import _Sources


def _reader_cache(loader: Any) -> int:
    """The shuffle buffer (records) one reader of ``loader`` uses: the Loader's own
    figure (its whole ``cache`` with one reader per rank; ``cache // num_workers``
    when each worker reads), falling back to ``loader.cache``."""
    try:
        return int(loader._producer_spec().cache)
    except Exception:
        return int(loader.cache)


def _quality(args: argparse.Namespace, src: _Sources, loaders: list[str],
             workers: list[int]) -> dict[str, Any]:
    from ..quality import distinct_ratio, epoch_correlation, shuffle_quality

    out: dict[str, Any] = {"seqloader": None, "files": None}
    if "seqloader" in loaders:
        from ...loader import Loader

        rows = []
        for w in workers:
            ld = Loader(src.db_path, args.split, None, batch_size=args.batch_size, shuffle=True,
                        num_workers=w, cache=args.cache, seed=args.seed, rank=0, world_size=1)
            try:
                q = shuffle_quality(src.db.labels(), ld.plan_spec, cache=_reader_cache(ld))
                rows.append({"workers": w, "distinct_ratio": round(q.distinct_ratio, 4),
                             "epoch_correlation": round(q.epoch_correlation, 4),
                             "batch_size": q.batch_size, "cache_per_reader": q.cache,
                             "chunk_size": q.chunk_size})
            except ValueError as e:
                rows.append({"workers": w, "error": str(e)})
            finally:
                ld.close()
        out["seqloader"] = rows
    if "files" in loaders:
        labels = np.asarray(src.scan.labels, np.int64)
        rng = np.random.default_rng(args.seed)
        a, b = rng.permutation(len(labels)), rng.permutation(len(labels))
        try:
            out["files"] = {"distinct_ratio": round(float(np.mean(
                [distinct_ratio(labels, o, args.batch_size) for o in (a, b)])), 4),
                "epoch_correlation": round(epoch_correlation(a, b), 4)}
        except ValueError as e:
            out["files"] = {"error": str(e)}
    return out

