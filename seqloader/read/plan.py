"""The epoch plan, as pure functions of (sizes, seed, epoch, rank, worker).

NOTE [ the epoch plan ]
1. The split's global record range (shards concatenated) is cut into contiguous
   *chunks* of ``chunk_size`` records that never cross a shard boundary.
2. Each epoch visits the chunks in an order drawn from ``(seed, epoch)`` (file
   order when not shuffling).  Concatenated, they form the epoch *sequence*.
3. Ranks take contiguous, disjoint slices of the sequence.  Training (``even``):
   every rank gets ``N // world_size`` records and the last ``N % world_size``
   records of the sequence are dropped -- at most ``world_size - 1`` per epoch,
   different ones every epoch because the chunk order changes (the same ones for a
   split of a single chunk) -- so every rank
   has the same number of batches (uneven counts hang DistributedDataParallel).
   Evaluation (not ``even``): slices differ by at most one record, every record
   is visited exactly once overall, and batch counts may differ by one.
4. One reader per rank walks the rank's slice in order (long sequential reads,
   see NOTE [ one reader per rank ] in :mod:`seqloader.dataflow.lmdbdata`), shuffles it
   locally (:mod:`seqloader.dataflow.shuffle`, seeded by (seed, epoch, rank)) and cuts it
   into batches of ``batch_size`` (the last one smaller, or dropped with
   ``drop_last``: at most ``batch_size - 1`` records of the rank's slice).
   Batch ``j`` is decoded by worker ``j % num_workers`` and yielded in order
   ``0, 1, 2, ...``, so the order of everything is a function of
   (seed, epoch, rank) -- not of the number of workers.
Nothing here reads data: ``len`` is known before iterating.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["DEFAULT_CACHE", "DEFAULT_CHUNK", "PlanSpec", "check_plan", "EpochPlan", "make_chunks",
           "chunk_order", "rank_bounds", "slice_ranges", "batch_sizes", "plan_epoch", "num_batches",
           "PositionMap", "skip_ranges"]

Range = tuple[int, int]

#: Shuffle-buffer records per rank (~550 MB of page cache for ImageNet JPEGs, not private
#: memory); chosen from the shuffle-quality figures in benchmarks/RESULTS.md.
DEFAULT_CACHE = 5000
#: Records per chunk of the epoch plan (~110 MB of ImageNet JPEGs: long sequential reads).
DEFAULT_CHUNK = 1024


def check_count(name: str, value: Any, least: int) -> None:
    """Raise ValueError naming ``name`` and ``value`` unless ``value`` is an integer (numpy
    ones too; not a bool) >= ``least`` -- for the constructors' size/rank arguments."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def check_rank(rank: int, world_size: int) -> None:
    """Raise ValueError unless ``0 <= rank < world_size``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")


def check_plan(*, batch_size: int, chunk_size: int, world_size: int, num_workers: int,
               rank: int) -> None:
    """Raise ValueError naming the first of these plan settings that is not a positive
    integer, or a rank outside ``[0, world_size)``: what a :class:`PlanSpec` accepts."""
    for name, v in (("batch_size", batch_size), ("chunk_size", chunk_size),
                    ("world_size", world_size), ("num_workers", num_workers)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    check_rank(rank, world_size)


@dataclass(frozen=True)
class PlanSpec:
    """Everything the plan depends on.  ``even`` selects the training rule of step 3."""

    shard_sizes: tuple[int, ...]
    batch_size: int
    chunk_size: int = DEFAULT_CHUNK
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    num_workers: int = 1
    even: bool = True

    def __post_init__(self) -> None:
        check_plan(batch_size=self.batch_size, chunk_size=self.chunk_size,
                   world_size=self.world_size, num_workers=self.num_workers, rank=self.rank)
        if any(s < 0 for s in self.shard_sizes):
            raise ValueError(f"shard sizes must be >= 0, got {self.shard_sizes}")

    @property
    def num_records(self) -> int:
        return int(sum(self.shard_sizes))


def make_chunks(shard_sizes: Sequence[int], chunk_size: int) -> np.ndarray:
    """``(k, 2)`` array of global ``[start, stop)`` chunks, none crossing a shard boundary."""
    out = []
    offset = 0
    for size in shard_sizes:
        starts = np.arange(offset, offset + size, chunk_size, dtype=np.int64)
        out.append(np.stack([starts, np.minimum(starts + chunk_size, offset + size)], 1))
        offset += size
    return np.concatenate(out) if out else np.zeros((0, 2), np.int64)


def chunk_order(num_chunks: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which an epoch visits the chunks: drawn from (seed, epoch), or file order."""
    if not shuffle:
        return np.arange(num_chunks)
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, 0x5E0]))
    return rng.permutation(num_chunks)


def rank_bounds(n: int, rank: int, world_size: int, *, even: bool) -> Range:
    """Positions ``[lo, hi)`` of the epoch sequence that ``rank`` reads (step 3)."""
    if even:
        per = n // world_size
        return rank * per, (rank + 1) * per
    return rank * n // world_size, (rank + 1) * n // world_size


def slice_ranges(ranges: Sequence[Range], lo: int, hi: int) -> list[Range]:
    """The record ranges covering positions ``[lo, hi)`` of the concatenation of ``ranges``."""
    out: list[Range] = []
    pos = 0
    for start, stop in ranges:
        n = stop - start
        a, b = max(lo - pos, 0), min(hi - pos, n)
        if a < b:
            out.append((start + a, start + b))
        pos += n
        if pos >= hi:
            break
    return out


def batch_sizes(n: int, batch_size: int, drop_last: bool) -> list[int]:
    """Sizes of the batches a slice of ``n`` records makes (DataLoader's rule)."""
    full, rem = divmod(n, batch_size)
    return [batch_size] * full + ([rem] if rem and not drop_last else [])


def num_batches(spec: PlanSpec) -> int:
    """``len`` of one rank's epoch, without building the plan."""
    lo, hi = rank_bounds(spec.num_records, spec.rank, spec.world_size, even=spec.even)
    n = hi - lo
    return n // spec.batch_size if spec.drop_last else math.ceil(n / spec.batch_size)


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch: the record ranges its reader walks, in order, and the sizes of
    the batches cut from the (locally shuffled) stream.  Batch ``j`` is decoded by
    worker ``j % num_workers``."""

    epoch: int
    ranges: tuple[Range, ...]
    batch_sizes: tuple[int, ...]
    num_workers: int = 1
    #: the spec it was made from (a stage reading it may need the batch size or split size)
    spec: PlanSpec | None = None
    #: 0: the epoch's own plan; k > 0: the rest of the epoch after its k-th resume on
    #: other settings (its local shuffle is seeded apart: :mod:`seqloader.dataflow.remainder`)
    segment: int = 0

    @property
    def num_batches(self) -> int:
        return len(self.batch_sizes)

    @property
    def num_samples(self) -> int:
        return sum(self.batch_sizes)

    def worker_of(self, j: int) -> int:
        """The worker that decodes epoch batch ``j``."""
        return j % self.num_workers


def plan_epoch(spec: PlanSpec, epoch: int) -> EpochPlan:
    """The plan of ``epoch`` for ``spec.rank`` (see NOTE [ the epoch plan ])."""
    chunks = make_chunks(spec.shard_sizes, spec.chunk_size)
    order = chunk_order(len(chunks), seed=spec.seed, epoch=epoch, shuffle=spec.shuffle)
    sequence = [(int(a), int(b)) for a, b in chunks[order]]
    lo, hi = rank_bounds(spec.num_records, spec.rank, spec.world_size, even=spec.even)
    sizes = batch_sizes(hi - lo, spec.batch_size, spec.drop_last)
    mine = slice_ranges(sequence, lo, lo + sum(sizes))  # what drop_last drops is never read
    return EpochPlan(epoch, tuple(_merge(mine)), tuple(sizes), spec.num_workers, spec)


def _merge(ranges: list[Range]) -> list[Range]:
    """Join ranges that continue each other (fewer, longer sequential reads)."""
    out: list[Range] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


class PositionMap:
    """Stream position -> global record index, for a list of ranges."""

    def __init__(self, ranges: Sequence[tuple[int, int]]):
        self.starts = np.cumsum([0] + [b - a for a, b in ranges])
        self.firsts = np.asarray([a for a, _ in ranges] or [0])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __call__(self, p: int) -> int:
        i = int(np.searchsorted(self.starts, p, side="right")) - 1
        return int(self.firsts[i] + p - self.starts[i])

    def many(self, positions: np.ndarray) -> np.ndarray:
        """:meth:`__call__` of every position at once (int64)."""
        i = np.searchsorted(self.starts, positions, side="right") - 1
        return (self.firsts[i] + positions - self.starts[i]).astype(np.int64)


def skip_ranges(ranges: Sequence[tuple[int, int]], skip: int) -> list[tuple[int, int]]:
    """``ranges`` without their first ``skip`` records."""
    out = []
    for a, b in ranges:
        if skip >= b - a:
            skip -= b - a
            continue
        out.append((a + skip, b))
        skip = 0
    return out
