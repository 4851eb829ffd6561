"""Shuffle quality of an epoch order, computed from the plan alone (no data is read).

Two figures, both 1.0/0.0 for an ideal per-epoch uniform permutation:
* ``distinct_ratio``: mean number of distinct labels per batch, divided by its
  expectation under a uniform shuffle (``sum_c 1 - C(N - n_c, B) / C(N, B)``).
  A class-sorted order read without shuffling scores ~1/B of that.
* ``epoch_correlation``: Spearman correlation between the positions of the records
  in two consecutive epochs (how much of one epoch's order repeats in the next).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..read.plan import PlanSpec, PositionMap, plan_epoch
from ..dataflow.shuffle import default_warmup, shuffle_order, shuffle_rng

__all__ = ["epoch_order", "expected_distinct", "distinct_ratio", "epoch_correlation",
           "ShuffleQuality", "shuffle_quality"]


def epoch_order(spec: PlanSpec, epoch: int, *, cache: int, warmup: int | None = None) -> np.ndarray:
    """Global record indices in the order the Loader yields them for ``spec.rank``.

    Mirrors :class:`~seqloader.dataflow.shuffle.LocallyShuffleData` (same plan, same generator); ``cache``
    and ``warmup`` as given to the Loader (``warmup`` defaults like the Loader's).
    """
    plan = plan_epoch(spec, epoch)
    index_of = PositionMap(plan.ranges)
    n = len(index_of)
    if spec.shuffle:
        if warmup is None:
            warmup = default_warmup(cache, spec.batch_size, spec.num_records, spec.world_size)
        order = shuffle_order(n, cache, shuffle_rng(spec.seed, epoch, spec.rank), warmup=warmup,
                              eager=int(plan.batch_sizes[0]) if len(plan.batch_sizes) else 0)
    else:
        order = np.arange(n)
    return index_of.many(np.asarray(order, np.int64))


def expected_distinct(labels: np.ndarray, batch_size: int) -> float:
    """Expected distinct labels in a batch drawn uniformly without replacement."""
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    n = len(labels)
    # P(class absent) = prod_{i<B} (N - n_c - i) / (N - i), computed in logs
    i = np.arange(min(batch_size, n))
    logp = np.array([np.sum(np.log(np.clip(n - c - i, 0, None) / (n - i) + 1e-300)) for c in counts])
    return float(np.sum(1 - np.exp(logp)))


def distinct_ratio(labels: np.ndarray, order: np.ndarray, batch_size: int) -> float:
    """Mean distinct labels per full batch of ``order``, relative to :func:`expected_distinct`."""
    full = len(order) // batch_size * batch_size
    if full == 0:
        raise ValueError(f"an order of {len(order)} records has no full batch of {batch_size}")
    per_batch = labels[order[:full]].reshape(-1, batch_size)
    distinct = np.mean([len(np.unique(b)) for b in per_batch])
    return float(distinct / expected_distinct(labels, batch_size))


def epoch_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman correlation of the positions of the records two orders share."""
    common = np.intersect1d(a, b)
    if len(common) < 3:
        return 0.0
    pa = np.empty(max(a.max(), b.max()) + 1, np.int64)
    pb = pa.copy()
    pa[a], pb[b] = np.arange(len(a)), np.arange(len(b))
    x, y = pa[common].argsort().argsort(), pb[common].argsort().argsort()
    return float(np.corrcoef(x, y)[0, 1])


@dataclass
class ShuffleQuality:
    distinct_ratio: float
    epoch_correlation: float
    batch_size: int
    cache: int
    chunk_size: int


def shuffle_quality(labels: np.ndarray, spec: PlanSpec, *, cache: int, epochs: Sequence[int] = (0, 1)
                    ) -> ShuffleQuality:
    """Both figures for the Loader configured by ``spec`` and its ``cache``."""
    orders = [epoch_order(spec, e, cache=cache) for e in epochs]
    ratio = float(np.mean([distinct_ratio(labels, o, spec.batch_size) for o in orders]))
    corr = float(np.mean([epoch_correlation(x, y) for x, y in zip(orders, orders[1:])]))
    return ShuffleQuality(ratio, corr, spec.batch_size, cache, spec.chunk_size)
