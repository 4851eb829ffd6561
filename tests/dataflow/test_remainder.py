"""The rest of an epoch resumed on other settings, as pure functions (no data, no I/O):
each rank's delivered records are simulated with the stepped shuffle buffer -- the
algorithm the reader runs -- and compared with what ``delivered``/``rest_plan`` compute
(NOTE [ elastic resume ]); and the constant-time replay equals the stepped buffer."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from seqloader.read.plan import PositionMap
from seqloader.dataflow.remainder import (Segment, epoch_sequence, rest_plan, rest_sequence,
                                          runs)
from seqloader.dataflow.shuffle import ShuffleBuffer, default_warmup, replay, shuffle_rng, shuffled
from seqloader.read.plan import PlanSpec, plan_epoch

SHARDS = (700, 301)  # two shards: chunks never cross the boundary
SEED, EPOCH = 11, 3


def _stepped(n, capacity, seed, outputs, warmup, eager):
    buf = ShuffleBuffer(capacity, np.random.default_rng(seed), warmup=warmup, eager=eager)
    pos = emitted = 0
    while emitted < outputs and pos < n:
        emitted += len(buf.push(pos))
        pos += 1
    drain = buf.drain()
    for _ in range(outputs - emitted):
        next(drain)
    return buf


def test_replay_is_the_stepped_buffer_and_continues_its_order():
    rng = np.random.default_rng(0)
    for trial in range(400):
        n = int(rng.integers(0, 5000 if trial % 20 == 0 else 300))
        c, e = int(rng.integers(1, 60)), int(rng.integers(0, 10))
        w, out, seed = int(rng.integers(0, c + 2)), int(rng.integers(0, n + 1)), trial
        a = _stepped(n, c, seed, out, w, e)
        b = replay(n, c, np.random.default_rng(seed), outputs=out, warmup=w, eager=e)
        assert (a.items, a.consumed, a.produced) == (b.items, b.consumed, b.produced)
        rest_a = [x for p in range(a.consumed, n) for x in a.push(p)] + list(a.drain())
        rest_b = [x for p in range(b.consumed, n) for x in b.push(p)] + list(b.drain())
        assert rest_a == rest_b, (n, c, w, e, out)
    with pytest.raises(ValueError, match="cannot replay 5 outputs of a stream of 4"):
        replay(4, 3, np.random.default_rng(0), outputs=5)


def _spec(world, batch, rank=0, *, drop_last=False, chunk=64):
    return PlanSpec(SHARDS, batch, chunk, True, drop_last, SEED, rank, world, 2, True)


def _segment(spec, cache, position):
    warmup = default_warmup(cache, spec.batch_size, spec.num_records, spec.world_size)
    return Segment(spec.world_size, spec.batch_size, spec.drop_last, spec.even, spec.shuffle,
                   cache, warmup, spec.chunk_size, position)


def _stream(plan, seg, rank):
    """The records one rank yields from ``plan``, stepped as the reader does."""
    index_of = PositionMap(plan.ranges)
    n = len(index_of)
    order = shuffled(range(n), seg.cache, shuffle_rng(SEED, plan.epoch, rank, plan.segment),
                     warmup=seg.warmup, eager=plan.batch_sizes[0] if plan.batch_sizes else 0)
    return [index_of(p) for p in order]


def _run(specs_of, segs, before):
    """Each rank of the segment ``segs[-1]`` (plan after ``before``): all its records in
    order, and those of its first ``position`` batches."""
    out, upto = [], []
    for rank, spec in enumerate(specs_of):
        plan = rest_plan(spec, EPOCH, before).plan if before else plan_epoch(spec, EPOCH)
        stream = _stream(plan, segs[-1], rank)
        assert len(stream) == plan.num_samples
        out.append(stream)
        upto.append(stream[:sum(plan.batch_sizes[:segs[-1].position])])
    return out, upto


CHAINS = {  # (world size, batch size, cache, position) per segment; the last runs to the end
    "4->2": [(4, 8, 40, 3), (2, 8, 40, None)],
    "2->3": [(2, 8, 40, 10), (3, 8, 40, None)],
    "1->4": [(1, 8, 40, 50), (4, 8, 40, None)],
    "batch 32->48": [(2, 32, 100, 4), (2, 48, 100, None)],
    "in the first fill": [(4, 8, 200, 1), (2, 8, 200, None)],
    "before the last batch": [(4, 8, 40, 31), (2, 8, 40, None)],
    "after the last batch": [(4, 8, 40, 32), (3, 8, 40, None)],
    "4->2->3, other caches": [(4, 8, 40, 5), (2, 16, 90, 4), (3, 8, 20, None)],
    "drop_last": [(3, 10, 40, 4), (2, 7, 40, None, True)],
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_the_rest_delivers_every_undelivered_record_once(chain):
    n = sum(SHARDS)
    segs, before, seen = [], (), []
    for step in CHAINS[chain]:
        world, batch, cache, position = step[:4]
        drop_last = len(step) > 4
        specs = [_spec(world, batch, r, drop_last=drop_last) for r in range(world)]
        seg = _segment(specs[0], cache, position or 0)
        streams, upto = _run(specs, segs + [seg], before)
        if position is None:  # the last segment runs to its end
            rest = rest_plan(specs[0], EPOCH, before)
            lens = {len(s) for s in streams}
            assert len(lens) == 1  # equal counts on every rank (even rule)
            got = [i for s in streams for i in s]
            everything = seen + got
            assert len(everything) == len(set(everything))  # each record at most once
            missed = n - len(everything)
            assert missed == rest.dropped and rest.remaining == n - len(seen)
            if not drop_last:
                assert missed <= world - 1
            break
        # the computed delivered set is the one the stepped ranks delivered
        mine = [i for u in upto for i in u]
        left = rest_sequence(SHARDS, segs + [seg], seed=SEED, epoch=EPOCH)
        assert sorted(left.tolist()) == sorted(set(range(n)) - set(seen) - set(mine))
        seen += mine
        segs.append(seg)
        before = tuple(segs)


def test_the_rest_is_read_in_long_runs():
    """The rest is the old ranks' untouched tails (whole runs of chunks) plus at most a
    buffer's worth of single records per old rank."""
    n_chunks = len(epoch_sequence(SHARDS, 64, seed=SEED, epoch=EPOCH, shuffle=True)) // 64 + 2
    for cache in (10, 40):
        seg = _segment(_spec(4, 8), cache, 10)
        ranges = [r for rank in range(2)
                  for r in rest_plan(_spec(2, 8, rank), EPOCH, (seg,)).plan.ranges]
        short = [r for r in ranges if r[1] - r[0] < 8]
        assert sum(b - a for a, b in short) <= 4 * cache + 2 * 8
        assert len(ranges) - len(short) <= n_chunks + 4
    assert runs(np.array([3, 4, 5, 9, 10, 2])) == ((3, 6), (9, 11), (2, 3))


def test_a_position_past_the_plan_is_refused():
    seg = _segment(_spec(4, 8), 40, 33)
    with pytest.raises(ValueError, match="position is 33, not a batch index in 0..32"):
        rest_plan(_spec(2, 8), EPOCH, (seg,))


def test_segments_from_checkpoint_keys():
    seg = _segment(_spec(4, 8), 40, 3)
    assert Segment.of(seg.as_dict()) == seg
    with pytest.raises(ValueError, match="has no 'cache'"):
        Segment.of({k: v for k, v in seg.as_dict().items() if k != "cache"})
    with pytest.raises(ValueError, match="world_size is 0, not an integer >= 1"):
        Segment.of({**seg.as_dict(), "world_size": 0})
    with pytest.raises(ValueError, match="position is 1.5, not a batch index"):
        Segment.of({**seg.as_dict(), "position": 1.5})
    assert dataclasses.replace(seg, position=9).settings() == seg.settings()
