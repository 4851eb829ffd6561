"""The rest of an epoch resumed on other settings: which records were delivered -- a
pure function of the plan, the local shuffle and the position -- and the plan that
delivers the others.

NOTE [ elastic resume ]
A checkpoint holds no record list: only the position (batches yielded per rank, equal
on every rank in training) and the settings the epoch ran on.  From them the delivered
records are computed: rank ``r`` of those settings read a slice of the epoch sequence
(NOTE [ the epoch plan ]) and its local shuffle released ``sum(batch sizes[:position])``
of it; replaying the shuffle on positions (NOTE [ replay in constant time ]) gives the
stream prefix it read and the records still in its buffer, so delivered = the prefix
minus the buffer.  A resume on other settings (world size, batch size, cache, warm-up,
chunk size, ``drop_last``) continues the epoch with a new *segment*:

1. the rest sequence: the epoch sequence without the delivered records, in sequence
   order (so mostly the ranks' untouched tails: long sequential runs, plus the few
   records that were in the buffers);
2. the new ranks take contiguous slices of it by the loader's rule (training's ``even``:
   equal counts, the last ``M % world_size`` records of the rest dropped -- at most
   ``world_size - 1``); each shuffles its slice locally, seeded by (seed, epoch, rank,
   segment), and cuts it into its batches (``drop_last`` as usual).

A checkpoint taken inside a segment lists the segments before it (``before``), so the
rule chains: each segment's rest is the previous rest minus what that segment delivered.
Later epochs follow the new settings' own plan.  The uninterrupted order is untouched: a
resume on the same settings continues the same plan (segment 0 stays segment 0).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

import numpy as np

from ..read.plan import (EpochPlan, PlanSpec, batch_sizes, chunk_order, make_chunks,
                         rank_bounds)
from .shuffle import replay, shuffle_rng

__all__ = ["Segment", "Rest", "epoch_sequence", "delivered", "rest_sequence", "rest_plan",
           "runs"]


def _is_count(v: Any, least: int) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= least


@dataclass(frozen=True)
class Segment:
    """A stretch of one epoch run on one set of settings, and how far it got: every rank
    yielded ``position`` batches of its plan (fewer where its plan has fewer)."""

    world_size: int
    batch_size: int
    drop_last: bool
    even: bool
    shuffle: bool
    cache: int
    warmup: int
    chunk_size: int
    position: int

    @classmethod
    def of(cls, d: dict[str, Any], where: str = "checkpoint") -> "Segment":
        """From a checkpoint's keys (ValueError naming a missing or bad one)."""
        vals = {}
        for f in fields(cls):
            if f.name not in d:
                raise ValueError(f"cannot resume: the {where} has no {f.name!r}; is it a "
                                 "Loader.state_dict()?")
            v, least = d[f.name], 0 if f.name in ("position", "warmup") else 1
            ok = isinstance(v, bool) if f.type == "bool" else _is_count(v, least)
            if not ok:
                raise ValueError(f"cannot resume: the {where}'s {f.name} is {v!r}, not "
                                 + ("True or False" if f.type == "bool" else
                                    "a batch index" if f.name == "position" else
                                    f"an integer >= {least}"))
            vals[f.name] = bool(v) if f.type == "bool" else int(v)
        return cls(**vals)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def settings(self) -> tuple:
        """Everything but the position: what shapes this segment's order."""
        return tuple(v for k, v in asdict(self).items() if k != "position")


@dataclass(frozen=True)
class Rest:
    """One rank's plan for the rest of an epoch, and what the rule made of it."""

    plan: EpochPlan
    #: records not delivered before this segment
    remaining: int
    #: of those, the records no rank gets (training's even rule and ``drop_last``)
    dropped: int


def epoch_sequence(shard_sizes: Sequence[int], chunk_size: int, *, seed: int, epoch: int,
                   shuffle: bool) -> np.ndarray:
    """The record indices of the epoch sequence (chunks in the epoch's order), int64."""
    chunks = make_chunks(shard_sizes, chunk_size)
    order = chunk_order(len(chunks), seed=seed, epoch=epoch, shuffle=shuffle)
    if not len(chunks):
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in chunks[order]])


def _rank_plan(n: int, seg: Segment, rank: int) -> tuple[int, list[int]]:
    """``(lo, batch sizes)`` of ``rank``'s slice of a sequence of ``n`` records."""
    lo, hi = rank_bounds(n, rank, seg.world_size, even=seg.even)
    return lo, batch_sizes(hi - lo, seg.batch_size, seg.drop_last)


def delivered(n: int, seg: Segment, *, seed: int, epoch: int, segment: int) -> np.ndarray:
    """Which positions of a sequence of ``n`` records segment number ``segment`` of
    ``epoch`` delivered (bool, by sequence position) -- computed, NOTE [ elastic resume ].
    Raises ValueError if ``seg.position`` is past every rank's batches."""
    taken = np.zeros(n, bool)
    most = 0
    for r in range(seg.world_size):
        lo, sizes = _rank_plan(n, seg, r)
        most = max(most, len(sizes))
        k = min(seg.position, len(sizes))
        outputs = sum(sizes[:k])
        if not seg.shuffle or outputs == 0:
            taken[lo:lo + outputs] = True
            continue
        buf = replay(sum(sizes), seg.cache, shuffle_rng(seed, epoch, r, segment), outputs=outputs,
                     warmup=seg.warmup, eager=sizes[0])
        taken[lo:lo + buf.consumed] = True
        taken[lo + np.asarray(buf.items, np.int64)] = False
    if seg.position > most:
        raise ValueError(f"cannot resume: the checkpoint's position is {seg.position}, not a "
                         f"batch index in 0..{most} (its batches per epoch); is the state from "
                         "a loader of this database?")
    return taken


def rest_sequence(shard_sizes: Sequence[int], segments: Sequence[Segment], *, seed: int,
                  epoch: int) -> np.ndarray:
    """The records of ``epoch`` that ``segments`` (run one after the other) did not
    deliver, in sequence order (record indices, int64)."""
    first = segments[0]
    seq = epoch_sequence(shard_sizes, first.chunk_size, seed=seed, epoch=epoch,
                         shuffle=first.shuffle)
    for k, seg in enumerate(segments):
        seq = seq[~delivered(len(seq), seg, seed=seed, epoch=epoch, segment=k)]
    return seq


def runs(records: np.ndarray) -> tuple[tuple[int, int], ...]:
    """``records`` (int64, in order) as ``[start, stop)`` ranges of consecutive indices."""
    if not len(records):
        return ()
    cut = np.flatnonzero(np.diff(records) != 1) + 1
    starts, stops = np.r_[0, cut], np.r_[cut, len(records)]
    return tuple(zip(records[starts].tolist(), (records[stops - 1] + 1).tolist()))


def rest_plan(spec: PlanSpec, epoch: int, segments: Sequence[Segment]) -> Rest:
    """The plan of ``spec.rank`` for the rest of ``epoch`` after ``segments`` (NOTE
    [ elastic resume ]); its ``segment`` is ``len(segments)``."""
    seq = rest_sequence(spec.shard_sizes, segments, seed=spec.seed, epoch=epoch)
    m = len(seq)
    lo, hi = rank_bounds(m, spec.rank, spec.world_size, even=spec.even)
    sizes = batch_sizes(hi - lo, spec.batch_size, spec.drop_last)
    kept = 0
    for r in range(spec.world_size):  # (what every rank keeps: the drop, said once)
        a, b = rank_bounds(m, r, spec.world_size, even=spec.even)
        kept += (b - a) if not spec.drop_last else (b - a) // spec.batch_size * spec.batch_size
    plan = EpochPlan(epoch, runs(seq[lo:lo + sum(sizes)]), tuple(sizes), spec.num_workers, spec,
                     segment=len(segments))
    return Rest(plan, m, m - kept)

