import numpy as np

from seqloader import Loader, open_database
from seqloader.read.plan import PlanSpec
from seqloader.tools.quality import (distinct_ratio, epoch_correlation, epoch_order,
                                     expected_distinct, shuffle_quality)


def test_epoch_order_is_what_the_loader_yields(lmdb_dir):
    db = open_database(lmdb_dir, "train")
    index_of = {}
    from conftest import read_records
    for i, r in read_records(lmdb_dir / "ILSVRC-train.lmdb"):
        index_of[r.image] = i
    for nw in (0, 2):
        loader = Loader(lmdb_dir, "train", None, batch_size=4, shuffle=True, num_workers=nw,
                        cache=6, chunk_size=5, seed=9)
        for epoch in range(2):
            got = [index_of[bytes(b)] for raw, _ in loader for b in raw]
            want = epoch_order(loader.plan_spec, epoch, cache=6)
            assert got == want.tolist()
        loader.close()
    assert len(db.labels()) == db.num_records


def test_metrics_on_known_orders():
    labels = np.repeat(np.arange(10), 100)  # class-sorted
    assert abs(expected_distinct(labels, 1) - 1) < 1e-9
    sorted_order = np.arange(1000)
    assert distinct_ratio(labels, sorted_order, 50) < 0.2
    rng = np.random.default_rng(0)
    perm = rng.permutation(1000)
    assert 0.95 < distinct_ratio(labels, perm, 50) < 1.05
    assert epoch_correlation(sorted_order, sorted_order) > 0.999
    assert abs(epoch_correlation(perm, rng.permutation(1000))) < 0.1


def test_local_shuffle_of_sorted_data_depends_on_buffer():
    labels = np.repeat(np.arange(20), 500)
    small = shuffle_quality(labels, PlanSpec((10000,), 64, 100, num_workers=2), cache=50)
    big = shuffle_quality(labels, PlanSpec((10000,), 64, 100, num_workers=2), cache=2000)
    assert small.distinct_ratio < big.distinct_ratio
    assert big.epoch_correlation < 0.5


def test_a_split_that_fits_in_the_buffer_is_uniformly_shuffled_every_epoch(lmdb_dir):
    """Default warm-up with records <= cache: each epoch is a uniform permutation, so
    consecutive epochs are uncorrelated (a one-batch warm-up emitted early records
    early every epoch: +0.4 here).  The Loader's real order, with workers, and
    epoch_order's agree."""
    from conftest import read_records

    index_of = {r.image: i for i, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")}
    n = len(index_of)
    loader = Loader(lmdb_dir, "train", None, batch_size=4, shuffle=True, num_workers=2,
                    cache=n, chunk_size=n, seed=5)  # one chunk: the stream is the same every epoch
    orders = []
    for epoch in range(12):
        orders.append(np.asarray([index_of[bytes(b)] for raw, _ in loader for b in raw]))
        assert orders[-1].tolist() == epoch_order(loader.plan_spec, epoch, cache=n).tolist()
    loader.close()
    corr = [epoch_correlation(a, b) for a, b in zip(orders, orders[1:])]
    assert abs(np.mean(corr)) < 0.15, corr
    # the stream's first records are not favoured: mean output position of the first
    # quarter of the stream (file order: one chunk) is about the middle
    first = np.concatenate([np.flatnonzero(o < n // 4) for o in orders])
    assert abs(first.mean() / n - 0.5) < 0.1
    # with the old default (warm-up of one batch) both fail
    old = [epoch_order(loader.plan_spec, e, cache=n, warmup=4) for e in range(12)]
    assert np.mean([epoch_correlation(a, b) for a, b in zip(old, old[1:])]) > 0.25
