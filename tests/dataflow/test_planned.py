"""The planned-stage contract (NOTE [ planned stages ]): each stage fixes its part of the
plan when built, never changes its upstream, and says which protocol it follows."""
from __future__ import annotations

import pytest

from seqloader import (BatchData, LMDBData, Loader, LocallyShuffleData, MapData,
                       MultiProcessMapAndBatchData)
from seqloader.dataflow.base import ProxyDataFlow


def test_downstream_stages_leave_their_upstream_plan_alone(lmdb_dir):
    src = LMDBData(lmdb_dir, "train", shuffle=True, chunk_size=4, seed=2)
    before = src.plan_spec
    shuffled = LocallyShuffleData(src, 6)
    batched = BatchData(shuffled, 5, remainder=False)
    engine = MultiProcessMapAndBatchData(batched, 3)
    assert src.plan_spec == before and (before.batch_size, before.num_workers) == (1, 1)
    assert shuffled.plan_spec == before and len(src) == before.num_records
    assert (batched.plan_spec.batch_size, batched.plan_spec.drop_last) == (5, True)
    assert engine.plan_spec.num_workers == 3 and engine.plan_spec.batch_size == 5
    # two pipelines over one reader stage do not disturb each other
    other = BatchData(src, 7, remainder=True)
    assert batched.plan_spec.batch_size == 5 and other.plan_spec.batch_size == 7
    assert [s.planned for s in (src, shuffled, batched, engine)] == ["records", "records",
                                                                   "batches", None]


class _Passthrough(ProxyDataFlow):
    """A user's stage that follows PlannedRecords by delegating to its upstream."""

    planned = "records"

    def __init__(self, df):
        super().__init__(df)
        self.source, self.plan_spec, self.seen = df.source, df.plan_spec, 0

    def records(self, plan, skip=0, eager=0, stop=None):
        for rec in self.df.records(plan, skip, eager, stop):
            self.seen += 1
            yield rec

    def copy_into(self, value, out):
        self.df.copy_into(value, out)

    def release(self, values):
        self.df.release(values)


def test_a_user_stage_that_declares_the_protocol_is_planned(lmdb_dir):
    def batches(df):
        df = BatchData(df, 4, remainder=True)
        df.reset_state()
        try:
            return [(images, labels.tolist()) for images, labels in df]
        finally:
            df.close()

    want = batches(LMDBData(lmdb_dir, "train", shuffle=True, chunk_size=4, seed=2))
    user = _Passthrough(LMDBData(lmdb_dir, "train", shuffle=True, chunk_size=4, seed=2))
    assert batches(user) == want and user.seen == sum(len(b) for b, _ in want)


def test_a_plain_stage_is_not_planned(lmdb_dir):
    plain = MapData(LMDBData(lmdb_dir, "train"), lambda dp: dp)
    assert plain.planned is None and BatchData(plain, 4).planned is None
    with pytest.raises(TypeError, match="reads a BatchData over LMDBData"):
        MultiProcessMapAndBatchData(BatchData(plain, 4), 2)


def test_the_loaders_plan_is_its_pipelines(lmdb_dir):
    with Loader(lmdb_dir, "train", None, batch_size=3, num_workers=2, shuffle=True) as loader:
        assert loader.plan_spec is loader.pipeline.plan_spec
        assert (loader.plan_spec.batch_size, loader.plan_spec.num_workers) == (3, 2)
        assert len(loader) == len(loader.pipeline)
