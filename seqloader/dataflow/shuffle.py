"""The local shuffle: one buffer algorithm, for stream positions or for items, and the
stage that runs it, :class:`LocallyShuffleData`.

NOTE [ local shuffle ]
A buffer of ``buffer_size`` items (the Loader's ``cache``: tensorpack's stage name
below the BayesWatch loader's argument name, which a user passes through unchanged); each output is drawn uniformly from the buffer.
Warm-up: output starts once ``warmup`` items are buffered; the first ``eager``
outputs (the Loader: one batch) are released one per input, so the first batch
needs only ``warmup + B - 1`` records read; after that, while the buffer is not
full, it takes two inputs per output, so it fills up while batches are
already flowing (the first batch never waits for a 50,000-record buffer).  At the
end of the stream the rest is drained in random order.  So a warm-up of the whole
stream (a split that fits in the buffer: :func:`default_warmup`) gives a uniform
permutation; a short one emits early inputs early, epoch after epoch.

The algorithm only moves positions around, so the whole output order of a worker's
stream is a pure function of (stream length, buffer_size, warmup, rng): the worker
runs it on positions and keeps the records read but not yet emitted (at most
``buffer_size``) in a dict.  Resuming mid-epoch replays it on positions only (no I/O)
and re-reads just the records that were in the buffer.

NOTE [ replay in constant time ]
A replay need not push every position one by one (1.6 s at ImageNet's 1.28 M records).
Once the buffer is full (``buffer_size - 1`` items before each push) every push releases
exactly one output: the new item lands in the last slot and the draw ``i`` picks slot
``i``; for ``i < buffer_size - 1`` that slot's item goes out and the new one takes its
place, for ``i = buffer_size - 1`` the new item goes straight out.  So the buffer after
``t`` such pushes is the buffer when it filled with each slot overwritten by the *last*
push that drew it -- a vectorised computation over the draws (:func:`replay`).  Only the
fill (about ``2 * buffer_size`` pushes) and the final drain are replayed step by step.  The
draws are one stream of doubles (``rng.random`` in blocks of 4096, one draw per output),
so the buffer replayed is the stepped one bit for bit, its generator state included.
"""
from __future__ import annotations

from typing import Any, Generic, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from ..read.plan import EpochPlan, PlanSpec, PositionMap, check_count, plan_epoch, skip_ranges
from .base import DataFlow, ProxyDataFlow, Records
from .lmdbdata import LMDBData, unpacked_records

__all__ = ["ShuffleBuffer", "shuffled", "shuffle_order", "default_warmup", "shuffle_rng",
           "LocallyShuffleData", "replay"]

T = TypeVar("T")
_BLOCK = 4096


class ShuffleBuffer(Generic[T]):
    """Incremental form: :meth:`push` an input, get back the outputs it releases.

    Not thread-safe.  State: ``items`` (buffered), ``consumed`` (inputs pushed) and
    ``produced`` (outputs released).
    """

    def __init__(self, buffer_size: int, rng: np.random.Generator, *, warmup: int | None = None,
                 eager: int = 0):
        if buffer_size < 1:
            raise ValueError(f"shuffle buffer_size must be >= 1, got {buffer_size}")
        if eager < 0:
            raise ValueError(f"eager must be >= 0, got {eager}")
        self.buffer_size = buffer_size
        self.warmup = max(1, min(buffer_size, warmup if warmup is not None else buffer_size))
        self.eager = eager
        self.rng = rng
        self.items: list[T] = []
        self.consumed = 0
        self.produced = 0
        self._u = rng.random(_BLOCK)
        self._k = 0

    def _pop(self) -> T:
        if self._k == _BLOCK:
            self._u, self._k = self.rng.random(_BLOCK), 0
        items = self.items
        i = int(self._u[self._k] * len(items))
        self._k += 1
        items[i], items[-1] = items[-1], items[i]
        self.produced += 1
        return items.pop()

    def push(self, item: T) -> list[T]:
        self.items.append(item)
        self.consumed += 1
        n = len(self.items)
        if n >= self.buffer_size or (n >= self.warmup and (self.produced < self.eager
                                                        or self.consumed % 2 == 0)):
            return [self._pop()]
        return []

    def drain(self) -> Iterator[T]:
        while self.items:
            yield self._pop()


def replay(n: int, buffer_size: int, rng: np.random.Generator, *, outputs: int,
           warmup: int | None = None, eager: int = 0) -> ShuffleBuffer[int]:
    """The :class:`ShuffleBuffer` of stream positions ``0..n-1`` after it released
    ``outputs`` of them (pushing positions in order, then draining): its ``items`` (the
    positions read but not released, in buffer order), ``consumed`` (positions pushed) and
    generator state are those of the stepped buffer, so pushing on from ``consumed`` (or
    draining) continues the same order.  Costs about ``2 * buffer_size`` pushes plus a few
    vectorised passes over ``outputs`` draws (NOTE [ replay in constant time ])."""
    if not 0 <= outputs <= n:
        raise ValueError(f"cannot replay {outputs} outputs of a stream of {n}")
    buf: ShuffleBuffer[int] = ShuffleBuffer(buffer_size, rng, warmup=warmup, eager=eager)
    pos = _fill(buf, n, outputs)
    steps = min(outputs - buf.produced, n - pos)
    if steps > 0:  # full: one output per push
        _steady(buf, pos, steps)
        pos += steps
    while buf.produced < outputs:  # (the drain)
        buf._pop()
    return buf


def _fill(buf: ShuffleBuffer[int], n: int, outputs: int) -> int:
    """:meth:`ShuffleBuffer.push` positions from 0 until the buffer is full, ``outputs``
    were released or the stream ended (the same steps, inlined: ~2 * buffer_size of them);
    returns the next position."""
    items, cap, warm, eager = buf.items, buf.buffer_size, buf.warmup, buf.eager
    u, k, produced = buf._u, buf._k, buf.produced
    draws = u.tolist()
    pos = 0
    while pos < n and produced < outputs and len(items) + 1 < cap:
        items.append(pos)
        pos += 1
        m = len(items)
        if m >= warm and (produced < eager or pos % 2 == 0):  # (pos: inputs pushed)
            if k == _BLOCK:
                u, k = buf.rng.random(_BLOCK), 0
                draws = u.tolist()
            i = int(draws[k] * m)
            k += 1
            items[i], items[-1] = items[-1], items[i]
            items.pop()
            produced += 1
    buf._u, buf._k, buf.produced, buf.consumed = u, k, produced, pos
    return pos


def _steady(buf: ShuffleBuffer[int], pos: int, steps: int) -> None:
    """Push positions ``pos .. pos+steps-1`` into the full ``buf``, each releasing one."""
    c, m = buf.buffer_size, buf.produced
    first_block = m - buf._k  # (the draw index of buf._u[0])
    need = m + steps - (first_block + _BLOCK)  # draws beyond the current block
    extra = -(-max(0, need) // _BLOCK)
    draws = np.concatenate([buf._u, buf.rng.random(extra * _BLOCK)]) if extra else buf._u
    k0 = m - first_block
    slot = (draws[k0:k0 + steps] * c).astype(np.int64)  # (as int(u * len(items)))
    last = np.full(c, -1, np.int64)
    np.maximum.at(last, slot, np.arange(steps, dtype=np.int64))
    items = np.asarray(buf.items, np.int64)
    kept = last[:c - 1] >= 0
    items[kept] = pos + last[:c - 1][kept]
    buf.items = items.tolist()
    buf.consumed += steps
    buf.produced += steps
    end = k0 + steps  # the next draw, in `draws`
    if extra:  # the generator stands after the last block made: keep that block
        start = len(draws) - _BLOCK
        buf._u, buf._k = draws[start:], end - start
    else:
        buf._k = end


def shuffled(items: Iterable[T], buffer_size: int, rng: np.random.Generator, *,
             warmup: int | None = None, eager: int = 0) -> Iterator[T]:
    """Yield ``items`` locally shuffled (see NOTE [ local shuffle ]).  Finite if ``items`` is."""
    buf: ShuffleBuffer[T] = ShuffleBuffer(buffer_size, rng, warmup=warmup, eager=eager)
    for x in items:
        yield from buf.push(x)
    yield from buf.drain()


def shuffle_order(n: int, buffer_size: int, rng: np.random.Generator, *,
                  warmup: int | None = None, eager: int = 0) -> np.ndarray:
    """The output order of ``shuffled(range(n), ...)`` as an array (for analysis)."""
    return np.fromiter(shuffled(range(n), buffer_size, rng, warmup=warmup, eager=eager), np.int64, n)


def default_warmup(buffer_size: int, batch_size: int, num_records: int, world_size: int) -> int:
    """The Loader's default ``warmup``: one batch (the first batch then needs only
    ``warmup + B - 1`` records read) -- unless a rank's whole share of the split fits in
    the buffer (ceil(``num_records`` / ``world_size``) <= ``buffer_size``): then the
    whole buffer, so every epoch is a uniform permutation.  With a one-batch warm-up a
    share that fits emits its early records early every epoch (480 records in one chunk:
    consecutive epochs' orders correlated 0.44 instead of ~0); the cost is reading that
    share before its first batch."""
    return (buffer_size if -(-num_records // world_size) <= buffer_size
            else min(buffer_size, batch_size))


def shuffle_rng(seed: int, epoch: int, rank: int, segment: int = 0) -> np.random.Generator:
    """The local-shuffle generator of one (seed, epoch, rank); ``segment`` > 0: of the
    rest of an epoch resumed on other settings (:mod:`seqloader.dataflow.remainder`)."""
    key = [seed, epoch, rank, 1] + ([segment] if segment else [])
    return np.random.default_rng(np.random.SeedSequence(key))


class LocallyShuffleData(ProxyDataFlow):
    """Shuffle within a buffer of ``buffer_size`` datapoints (NOTE [ local shuffle ]).

    Over an :class:`LMDBData` (NOTE [ planned stages ]) it shuffles the encoded records
    as the Loader does -- seeded from the source's (seed, epoch, rank), ``warmup``
    records before the first output (default: the Loader's,
    :func:`default_warmup`) -- and holds positions, so a
    resumed epoch skips its first outputs without reading them.  Over any other stage
    it shuffles datapoints, seeded from (``seed``, its own epoch count).  Memory:
    ``buffer_size`` records (page cache) or datapoints."""

    def __init__(self, df: DataFlow, buffer_size: int, *, seed: int = 0, warmup: int | None = None):
        super().__init__(df)
        check_count("buffer_size", buffer_size, 1)
        if warmup is not None:
            check_count("warmup", warmup, 0)
        self.buffer_size, self.seed, self.warmup = int(buffer_size), seed, warmup
        # it shuffles records by position, reading the root's files directly
        self.source = df if isinstance(df, LMDBData) else None
        self.planned = "records" if self.source is not None else None
        self.epoch = 0
        #: the shuffle buffer of the pass in progress (or the last), or None
        self.buffer: ShuffleBuffer | None = None

    @property
    def plan_spec(self) -> PlanSpec:
        """The records' plan, as its source's (NOTE [ planned stages ])."""
        return self.source.plan_spec

    def _warmup(self, plan: EpochPlan) -> int:
        """The warm-up for ``plan`` (default: one of its batches,
        :func:`default_warmup`)."""
        if self.warmup is not None:
            return self.warmup
        s = plan.spec
        return default_warmup(self.buffer_size, s.batch_size, s.num_records, s.world_size)

    def records(self, plan: EpochPlan, skip: int = 0, eager: int = 0, stop: Any = None) -> Records:
        """The plan's records in output (shuffled) order, minus the first ``skip``
        outputs, which are skipped on positions only (NOTE [ local shuffle ]; ``eager``
        as there: the first batch's size).  Raises :class:`Stopped` once ``stop`` is set."""
        src = self.source
        if not src.shuffle:  # (file order: evaluation)
            yield from src.records(plan, skip, eager, stop)
            return
        index_of = PositionMap(plan.ranges)
        n = len(index_of)
        # fast-forward on positions, no I/O (NOTE [ replay in constant time ])
        buf = replay(n, self.buffer_size, shuffle_rng(src.seed, plan.epoch, src.rank, plan.segment),
                     outputs=min(skip, n), warmup=self._warmup(plan), eager=eager)
        pos = buf.consumed
        self.buffer = buf  # (its fill, for the Loader's stats)
        # the records read but not yet emitted, as (index, value) by stream position;
        # first the buffer at `skip`
        held = {int(p): (int(i), src.get(int(i)))
                for p, i in zip(buf.items, index_of.many(np.asarray(buf.items, np.int64)))}
        stream = src.read(skip_ranges(plan.ranges, pos), stop, short=src.short_for(plan))
        for p in range(pos, n):
            held[p] = next(stream)
            for out in buf.push(p):
                yield held.pop(out)
        for out in buf.drain():
            yield held.pop(out)

    def plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(self.plan_spec, epoch)

    def copy_into(self, value: memoryview, out: Any) -> None:
        self.source.copy_into(value, out)

    def release(self, values: Sequence[memoryview]) -> None:
        self.source.release(values)

    def __iter__(self) -> Iterator[Any]:
        if self.source is not None:
            return self.source.new_pass(lambda epoch: unpacked_records(self.records(self.plan(epoch))))
        rng = shuffle_rng(self.seed, self.epoch, 0)
        self.epoch += 1
        return shuffled(self.df, self.buffer_size, rng, warmup=self.warmup)
