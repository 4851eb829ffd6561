import itertools

import numpy as np
import pytest

from seqloader.read.plan import (PlanSpec, batch_sizes, make_chunks, num_batches,
                                 plan_epoch)
from seqloader.dataflow.shuffle import ShuffleBuffer, shuffle_order, shuffled


def records_of(ranges):
    return [i for a, b in ranges for i in range(a, b)]


def rank_records(spec, epoch):
    plan = plan_epoch(spec, epoch)
    recs = records_of(plan.ranges)
    assert len(recs) == plan.num_samples
    return plan, recs


CONFIGS = [
    # shard sizes, batch, chunk, world, workers, drop_last
    ((1000,), 32, 100, 1, 1, False),
    ((1000,), 32, 100, 1, 3, True),
    ((333, 500, 1), 17, 64, 2, 2, False),
    ((333, 500, 1), 17, 64, 3, 4, True),
    ((7,), 4, 3, 2, 2, False),
    ((10, 0, 10), 5, 4, 4, 1, False),
    ((1281,), 256, 1024, 8, 4, False),
]


@pytest.mark.parametrize("shards,B,C,R,W,drop", CONFIGS)
@pytest.mark.parametrize("shuffle", [True, False])
def test_each_record_at_most_once_and_disjoint(shards, B, C, R, W, drop, shuffle):
    N = sum(shards)
    for epoch in range(3):
        seen = []
        counts = []
        for r in range(R):
            spec = PlanSpec(shards, B, C, shuffle, drop, seed=7, rank=r, world_size=R,
                            num_workers=W, even=shuffle)
            plan, recs = rank_records(spec, epoch)
            assert plan.num_batches == num_batches(spec) == len(plan.batch_sizes)
            assert all(n == B for n in plan.batch_sizes[:-1])
            assert not plan.batch_sizes or 0 < plan.batch_sizes[-1] <= B
            if drop:
                assert all(n == B for n in plan.batch_sizes)
            seen.extend(recs)
            counts.append(plan.num_batches)
        assert len(seen) == len(set(seen))  # disjoint across workers and ranks
        assert set(seen) <= set(range(N))
        if shuffle:  # training: equal batches on every rank, at most R-1 (+ drop_last) dropped
            assert len(set(counts)) == 1
            lost = N - len(seen)
            assert lost <= (R - 1) + (R * (B - 1) if drop else 0)
        elif not drop:  # evaluation: every record exactly once overall
            assert sorted(seen) == list(range(N))
            assert max(counts) - min(counts) <= 1


def test_evaluation_reads_in_file_order_and_batches_go_round_robin():
    spec = PlanSpec((100, 50), 16, 32, shuffle=False, num_workers=3, even=False)
    plan = plan_epoch(spec, 0)
    assert records_of(plan.ranges) == list(range(150)) and plan.ranges == ((0, 150),)
    assert [plan.worker_of(j) for j in range(5)] == [0, 1, 2, 0, 1]


def test_order_does_not_depend_on_worker_count():
    a = plan_epoch(PlanSpec((500,), 8, 16, num_workers=1), 3)
    b = plan_epoch(PlanSpec((500,), 8, 16, num_workers=4), 3)
    assert a.ranges == b.ranges and a.batch_sizes == b.batch_sizes


def test_same_seed_same_order_new_epoch_new_order():
    spec = PlanSpec((5000,), 64, 100, seed=3, num_workers=2)
    a, b = plan_epoch(spec, 0), plan_epoch(spec, 0)
    assert a == b
    c = plan_epoch(spec, 1)
    assert c.ranges != a.ranges
    other = PlanSpec((5000,), 64, 100, seed=4, num_workers=2)
    assert plan_epoch(other, 0).ranges != a.ranges


def test_chunks_never_cross_shards():
    ch = make_chunks((10, 3, 7), 4)
    assert ch.tolist() == [[0, 4], [4, 8], [8, 10], [10, 13], [13, 17], [17, 20]]


def test_batch_sizes_match_dataloader():
    assert batch_sizes(10, 4, False) == [4, 4, 2]
    assert batch_sizes(10, 4, True) == [4, 4]
    assert batch_sizes(8, 4, False) == [4, 4]


@pytest.mark.parametrize("bad", [dict(batch_size=0), dict(chunk_size=0), dict(rank=2, world_size=2),
                                 dict(num_workers=0)])
def test_plan_spec_validation(bad):
    kw = dict(shard_sizes=(10,), batch_size=2)
    kw.update(bad)
    with pytest.raises(ValueError, match="must be|not in"):
        PlanSpec(**kw)


def test_shuffle_buffer_is_a_permutation_with_bounded_memory():
    for n, cap, warm in [(0, 5, 1), (1, 5, 1), (100, 1, 1), (1000, 64, 8), (1000, 5000, 100)]:
        buf = ShuffleBuffer(cap, np.random.default_rng(0), warmup=warm)
        out = []
        peak = 0
        for x in range(n):
            out.extend(buf.push(x))
            peak = max(peak, len(buf.items))
        out.extend(buf.drain())
        assert sorted(out) == list(range(n)) and peak <= cap


def test_shuffle_warmup_starts_output_early():
    rng = np.random.default_rng(0)
    buf = ShuffleBuffer(50_000, rng, warmup=256)
    first_out = next(i for i in itertools.count() if buf.push(i))
    assert first_out < 300


def test_first_batch_needs_warmup_plus_one_batch_of_reads_then_the_buffer_fills():
    B, warm, cap = 256, 256, 5000
    buf = ShuffleBuffer(cap, np.random.default_rng(0), warmup=warm, eager=B)
    out, reads_for_first = [], None
    for i in range(20_000):
        out.extend(buf.push(i))
        if reads_for_first is None and len(out) >= B:
            reads_for_first = i + 1
    assert reads_for_first == warm + B - 1  # not warm + 2B - 1 (two reads per output)
    assert len(buf.items) >= cap - 1  # and the buffer still fills up, two reads per output
    plain = ShuffleBuffer(cap, np.random.default_rng(0), warmup=warm)
    reads = 0
    while plain.produced < B:
        plain.push(reads)
        reads += 1
    assert reads == warm + 2 * B - 2
    with pytest.raises(ValueError, match="eager"):
        ShuffleBuffer(10, np.random.default_rng(0), eager=-1)


def test_shuffle_is_seeded():
    a = shuffle_order(500, 50, np.random.default_rng(1))
    assert (a == shuffle_order(500, 50, np.random.default_rng(1))).all()
    assert (a != shuffle_order(500, 50, np.random.default_rng(2))).any()
    assert list(shuffled(range(5), 1, np.random.default_rng(0))) == list(range(5))
