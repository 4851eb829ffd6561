"""EpochState and the checkpoint rules, on their own (no Loader, no data)."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from seqloader.dataflow.remainder import Segment
from seqloader.read.plan import PlanSpec
from seqloader.resume import STATE_VERSION, EpochState, Resumed, check_checkpoint, checkpoint


def test_an_iteration_takes_its_epoch_at_its_first_batch():
    s = EpochState()
    assert s.epoch == 0 and s.where(5) == (0, 0, ())
    s.start(0, 0)
    s.position = 2
    assert s.epoch == 0 and s.where(5) == (0, 2, ())  # mid-epoch
    s.position = 5
    assert s.where(5) == (1, 0, ())  # every batch yielded: the next epoch
    s.between()
    assert s.epoch == 1 and s.where(5) == (1, 0, ())


def test_a_finished_epoch_resumes_at_the_next_one():
    s = EpochState()
    s.start(3, 0)
    s.done = True
    assert s.where(0) == (4, 0, ())


def test_a_loaded_position_is_kept_for_its_epoch_and_dropped_for_another():
    s = EpochState()
    s.load(2, 3, num_batches=5)
    assert (s.next_epoch, s.resume, s.current) == (2, 3, None)
    s.set_epoch(2)  # the checkpoint's epoch: kept
    assert s.resume == 3
    with pytest.warns(UserWarning, match=r"set_epoch\(4\) discards the position loaded for epoch 2"):
        s.set_epoch(4)
    assert (s.next_epoch, s.resume) == (4, 0)


def test_a_trainer_moving_on_ends_a_loaded_epoch_silently(recwarn):
    s = EpochState()
    s.load(2, 3, num_batches=5)
    s.set_epoch(3, trainer=True)
    assert (s.next_epoch, s.resume) == (3, 0) and not recwarn.list


@pytest.mark.parametrize("epoch,position,match", [(-1, 0, "epoch is -1"), (1.5, 0, "epoch is 1.5"),
                                                  (0, 6, "position is 6"), (0, True, "position is True")])
def test_load_refuses_what_is_not_a_position(epoch, position, match):
    with pytest.raises(ValueError, match=match):
        EpochState().load(epoch, position, num_batches=5)


def test_set_epoch_refuses_a_non_integer():
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        EpochState().set_epoch(-2)


SPEC = PlanSpec((40, 24), 4, 8, True, False, 3, 0, 2, 2, True)


def _mine(**changes):
    c = checkpoint((1, 2, ()), SPEC, cache=10, warmup=4, fingerprint="f")
    c.update(changes)
    return c


def test_a_checkpoint_is_small_and_the_same_on_every_rank():
    c = _mine()
    assert c["version"] == STATE_VERSION and (c["epoch"], c["position"]) == (1, 2)
    assert (c["batch_size"], c["world_size"], c["num_records"], c["shard_sizes"]) == (4, 2, 64,
                                                                                      [40, 24])
    other_rank = checkpoint((1, 2, ()), dataclasses.replace(SPEC, rank=1), cache=10, warmup=4,
                            fingerprint="f")
    assert other_rank == c and "rank" not in c
    assert len(pickle.dumps(c)) < 1024
    assert check_checkpoint(c, _mine(), default_warmup=False) == Resumed(1, 2, ())


def test_the_same_settings_continue_the_plan_and_others_resume_the_rest():
    # workers only decode: the same plan, from the same batch
    assert check_checkpoint(_mine(num_workers=7), _mine(), default_warmup=False).first == 2
    for k, v in (("world_size", 3), ("batch_size", 5), ("cache", 12), ("warmup", 2),
                 ("chunk_size", 16), ("drop_last", True)):
        r = check_checkpoint(_mine(**{k: v}), _mine(), default_warmup=False)
        assert (r.epoch, r.first) == (1, 0) and len(r.before) == 1, k
        assert getattr(r.before[0], k) == v and r.before[0].position == 2
    # nothing delivered yet: the epoch's own plan on the new settings
    assert check_checkpoint(_mine(world_size=3, position=0), _mine(),
                            default_warmup=False) == Resumed(1, 0, ())
    # a checkpoint taken in a rest: its segments come along, the rest continues
    seg = Segment.of(_mine(world_size=3))
    inner = _mine(before=[seg.as_dict()], position=1)
    assert check_checkpoint(inner, _mine(), default_warmup=False) == Resumed(1, 1, (seg,))


@pytest.mark.parametrize("change,match", [
    (dict(seed=4), r"seed is 4, this loader's 3 .*construct the Loader with seed=4"),
    (dict(fingerprint="g"), "the database is not the one the checkpoint was written with"),
    (dict(num_records=65), r"num_records: 65, now 64"),
    (dict(shard_sizes=[41, 23]), r"shard_sizes: \[41, 23\], now \[40, 24\]"),
    (dict(version=9), "version is 9"),
    (dict(epoch=-1), "epoch is -1"),
    (dict(before=[{"world_size": 2}]), r"before\[0\] has no 'batch_size'"),
])
def test_what_cannot_be_honoured_is_refused_in_one_line(change, match):
    with pytest.raises(ValueError, match=match) as e:
        check_checkpoint(_mine(**change), _mine(), default_warmup=False)
    assert "\n" not in str(e.value)


def test_a_default_warmup_adopts_the_checkpoints():
    assert check_checkpoint(_mine(warmup=10), _mine(), default_warmup=True).adopt == 10
    old = _mine(version=1)
    del old["warmup"]  # (before the key existed: the old default, one batch)
    assert check_checkpoint(old, _mine(), default_warmup=True) == Resumed(1, 2, ())
    # an explicit one that differs: the rest on this loader's warm-up
    r = check_checkpoint(_mine(warmup=10), _mine(), default_warmup=False)
    assert r.adopt is None and r.before[0].warmup == 10


def test_a_loaded_rest_is_dropped_with_its_position_for_another_epoch(recwarn):
    seg = Segment.of(_mine(world_size=3))
    s = EpochState()
    s.load(1, 0, num_batches=5, before=(seg,))
    assert s.where(9) == (1, 0, (seg,))  # between iterations: the loaded rest
    s.start(1, 0, before=(seg,), batches=4)
    s.position = 4  # the rest's last batch: the next epoch, on its own plan
    assert s.where(9) == (2, 0, ())
    s.load(1, 0, num_batches=5, before=(seg,))
    s.set_epoch(2, trainer=True)
    assert (s.next_epoch, s.resume, s.pending) == (2, 0, ()) and not recwarn.list
