"""The local shuffle buffer: one algorithm, for stream positions or for items.

NOTE [ local shuffle ]
A buffer of ``capacity`` items; each output is drawn uniformly from the buffer.
Warm-up: output starts once ``warmup`` items are buffered; the first ``eager``
outputs (the Loader: one batch) are released one per input, so the first batch
needs only ``warmup + B - 1`` records read; after that, while the buffer is below
capacity, it takes two inputs per output, so it fills up while batches are
already flowing (the first batch never waits for a 50,000-record buffer).  At the
end of the stream the rest is drained in random order.  So a warm-up of the whole
stream (a split that fits in the buffer: :func:`default_warmup`) gives a uniform
permutation; a short one emits early inputs early, epoch after epoch.

The algorithm only moves positions around, so the whole output order of a worker's
stream is a pure function of (stream length, capacity, warmup, rng): the worker
runs it on positions and keeps the records read but not yet emitted (at most
``capacity``) in a dict.  Resuming mid-epoch replays it on positions only (no I/O)
and re-reads just the records that were in the buffer.

NOTE [ replay in constant time ]
A replay need not push every position one by one (1.6 s at ImageNet's 1.28 M records).
Once the buffer is full (``capacity - 1`` items before each push) every push releases
exactly one output: the new item lands in the last slot and the draw ``i`` picks slot
``i``; for ``i < capacity - 1`` that slot's item goes out and the new one takes its
place, for ``i = capacity - 1`` the new item goes straight out.  So the buffer after
``t`` such pushes is the buffer when it filled with each slot overwritten by the *last*
push that drew it -- a vectorised computation over the draws (:func:`replay`).  Only the
fill (about ``2 * capacity`` pushes) and the final drain are replayed step by step.  The
draws are one stream of doubles (``rng.random`` in blocks of 4096, one draw per output),
so the buffer replayed is the stepped one bit for bit, its generator state included.
"""
from __future__ import annotations

from typing import Generic, Iterable, Iterator, TypeVar

import numpy as np

__all__ = ["ShuffleBuffer", "shuffled", "shuffle_order", "default_warmup", "replay"]

T = TypeVar("T")
_BLOCK = 4096


class ShuffleBuffer(Generic[T]):
    """Incremental form: :meth:`push` an input, get back the outputs it releases.

    Not thread-safe.  State: ``items`` (buffered), ``consumed`` (inputs pushed) and
    ``produced`` (outputs released).
    """

    def __init__(self, capacity: int, rng: np.random.Generator, *, warmup: int | None = None,
                 eager: int = 0):
        if capacity < 1:
            raise ValueError(f"shuffle buffer capacity must be >= 1, got {capacity}")
        if eager < 0:
            raise ValueError(f"eager must be >= 0, got {eager}")
        self.capacity = capacity
        self.warmup = max(1, min(capacity, warmup if warmup is not None else capacity))
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
        if n >= self.capacity or (n >= self.warmup and (self.produced < self.eager
                                                        or self.consumed % 2 == 0)):
            return [self._pop()]
        return []

    def drain(self) -> Iterator[T]:
        while self.items:
            yield self._pop()


def replay(n: int, capacity: int, rng: np.random.Generator, *, outputs: int,
           warmup: int | None = None, eager: int = 0) -> ShuffleBuffer[int]:
    """The :class:`ShuffleBuffer` of stream positions ``0..n-1`` after it released
    ``outputs`` of them (pushing positions in order, then draining): its ``items`` (the
    positions read but not released, in buffer order), ``consumed`` (positions pushed) and
    generator state are those of the stepped buffer, so pushing on from ``consumed`` (or
    draining) continues the same order.  Costs about ``2 * capacity`` pushes plus a few
    vectorised passes over ``outputs`` draws (NOTE [ replay in constant time ])."""
    if not 0 <= outputs <= n:
        raise ValueError(f"cannot replay {outputs} outputs of a stream of {n}")
    buf: ShuffleBuffer[int] = ShuffleBuffer(capacity, rng, warmup=warmup, eager=eager)
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
    were released or the stream ended (the same steps, inlined: ~2 * capacity of them);
    returns the next position."""
    items, cap, warm, eager = buf.items, buf.capacity, buf.warmup, buf.eager
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
    c, m = buf.capacity, buf.produced
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


def shuffled(items: Iterable[T], capacity: int, rng: np.random.Generator, *,
             warmup: int | None = None, eager: int = 0) -> Iterator[T]:
    """Yield ``items`` locally shuffled (see NOTE [ local shuffle ]).  Finite if ``items`` is."""
    buf: ShuffleBuffer[T] = ShuffleBuffer(capacity, rng, warmup=warmup, eager=eager)
    for x in items:
        yield from buf.push(x)
    yield from buf.drain()


def shuffle_order(n: int, capacity: int, rng: np.random.Generator, *,
                  warmup: int | None = None, eager: int = 0) -> np.ndarray:
    """The output order of ``shuffled(range(n), ...)`` as an array (for analysis)."""
    return np.fromiter(shuffled(range(n), capacity, rng, warmup=warmup, eager=eager), np.int64, n)


def default_warmup(cache: int, batch_size: int, num_records: int, world_size: int) -> int:
    """The Loader's default ``warmup``: one batch (the first batch then needs only
    ``warmup + B - 1`` records read) -- unless a rank's whole share of the split fits in
    the buffer (ceil(``num_records`` / ``world_size``) <= ``cache``): then the
    whole buffer, so every epoch is a uniform permutation.  With a one-batch warm-up a
    share that fits emits its early records early every epoch (480 records in one chunk:
    consecutive epochs' orders correlated 0.44 instead of ~0); the cost is reading that
    share before its first batch."""
    return cache if -(-num_records // world_size) <= cache else min(cache, batch_size)
