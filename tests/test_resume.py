"""EpochState and the checkpoint rules, on their own (no Loader, no data)."""
from __future__ import annotations

import pytest

from seqloader.read.plan import PlanSpec
from seqloader.resume import STATE_VERSION, EpochState, check_checkpoint, checkpoint


def test_an_iteration_takes_its_epoch_at_its_first_batch():
    s = EpochState()
    assert s.epoch == 0 and s.where(5) == (0, 0)
    s.start(0, 0)
    s.position = 2
    assert s.epoch == 0 and s.where(5) == (0, 2)  # mid-epoch
    s.position = 5
    assert s.where(5) == (1, 0)  # every batch yielded: the next epoch
    s.between()
    assert s.epoch == 1 and s.where(5) == (1, 0)


def test_a_finished_epoch_resumes_at_the_next_one():
    s = EpochState()
    s.start(3, 0)
    s.done = True
    assert s.where(0) == (4, 0)


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
    c = checkpoint((1, 2), SPEC, cache=10, warmup=4, fingerprint="f")
    c.update(changes)
    return c


def test_a_checkpoint_holds_the_position_and_what_shapes_the_order():
    c = _mine()
    assert c["version"] == STATE_VERSION and (c["epoch"], c["position"]) == (1, 2)
    assert (c["batch_size"], c["world_size"], c["num_records"], c["shard_sizes"]) == (4, 2, 64,
                                                                                      [40, 24])
    assert check_checkpoint(c, _mine(), default_warmup=False) is None


def test_settings_that_shape_the_order_must_match_but_workers_and_rank_need_not():
    assert check_checkpoint(_mine(num_workers=7, rank=1), _mine(), default_warmup=False) is None
    with pytest.raises(ValueError, match=r"'seed': \(4, 3\)"):
        check_checkpoint(_mine(seed=4), _mine(), default_warmup=False)
    with pytest.raises(ValueError, match="the database is not the one"):
        check_checkpoint(_mine(fingerprint="g"), _mine(), default_warmup=False)


def test_a_default_warmup_adopts_the_checkpoints_and_an_explicit_one_must_match():
    assert check_checkpoint(_mine(warmup=10), _mine(), default_warmup=True) == 10
    old = _mine()
    del old["warmup"]  # (before the key existed: the old default, one batch)
    assert check_checkpoint(old, _mine(), default_warmup=True) is None
    with pytest.raises(ValueError, match="warmup"):
        check_checkpoint(_mine(warmup=10), _mine(), default_warmup=False)
