"""Checkpoints of a Loader's position: ``state_dict`` / ``load_state_dict``.

A mixin of :class:`~seqloader.loader.Loader` (it reads the Loader's plan, settings and
epoch bookkeeping); kept apart because what a checkpoint holds, and which of its
settings must match for the resumed order to be the uninterrupted one, is its own
contract (README "Semantics": mid-epoch resume).
"""
from __future__ import annotations

import numbers
from typing import Any

__all__ = ["Resumable", "is_int", "STATE_VERSION"]

#: Bumped when a checkpoint of the previous version could be misread.
STATE_VERSION = 1


def is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class Resumable:
    """``state_dict``/``load_state_dict`` for the Loader (see the module docstring)."""

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the epoch in progress and the batches of it already
        yielded (or the next epoch, position 0, between epochs)."""
        s = self.plan_spec
        if self._cur_epoch is None:
            epoch, position = self._next_epoch, self._resume
        elif self._cur_done or self._position >= len(self):
            epoch, position = self._cur_epoch + 1, 0
        else:
            epoch, position = self._cur_epoch, self._position
        return {"version": STATE_VERSION, "epoch": epoch, "position": position,
                "seed": self.seed, "batch_size": s.batch_size, "num_workers": s.num_workers,
                "world_size": s.world_size, "rank": s.rank, "cache": self.cache,
                "chunk_size": s.chunk_size, "shuffle": s.shuffle, "drop_last": s.drop_last,
                "num_records": s.num_records, "even": s.even,
                "warmup": self._warmup, "shard_sizes": list(s.shard_sizes),
                "fingerprint": self.db.metas[0].fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches of that
        epoch that had not been yielded.  The settings that shape the order must match."""
        mine = self.state_dict()
        # num_workers and rank may differ: the order depends on neither (all ranks are at
        # the same position in training, and workers only decode)
        keys = ("seed", "batch_size", "world_size", "cache", "chunk_size", "shuffle",
                "drop_last", "num_records", "even")
        diff = {k: (state.get(k), mine[k]) for k in keys if state.get(k) != mine[k]}
        # the shuffle buffer's warmup, the shard layout and the database itself shape the
        # order too (checked where the checkpoint has them: older ones do not)
        diff.update({k: (state[k], mine[k]) for k in ("warmup", "shard_sizes", "fingerprint")
                     if k in state and state[k] != mine[k]})
        # a default warm-up adopts the checkpoint's: the default changed in 0.2.0 for
        # splits that fit in the buffer (an explicit warm-up must match).  Checkpoints from
        # before the key existed all used the old default, one batch.
        adopt_warmup = None
        if self.warmup is None:
            then = state.get("warmup", min(self.cache, self.batch_size))
            diff.pop("warmup", None)
            if not is_int(then):
                diff["warmup"] = (then, mine["warmup"])
            elif then != mine["warmup"]:
                adopt_warmup = int(then)
        if state.get("version") != STATE_VERSION or diff:
            why = ""
            if set(diff) == {"fingerprint"}:
                why = (" -- the database is not the one the checkpoint was written with "
                       "(another preprocessing run, options or source tree); resume with "
                       "that database, or start a new epoch without load_state_dict")
            raise ValueError(f"cannot resume: the checkpoint's loader settings differ from this "
                             f"loader's (checkpoint, now): {diff}{why}; construct the Loader "
                             "with the checkpoint's settings to continue the same sequence")
        epoch, position = state["epoch"], state["position"]
        if not (is_int(epoch) and epoch >= 0):
            raise ValueError(f"cannot resume: the checkpoint's epoch is {epoch!r}, not an "
                             "integer >= 0")
        if not (is_int(position) and 0 <= position <= len(self)):
            raise ValueError(f"cannot resume: the checkpoint's position is {position!r}, not "
                             f"a batch index in 0..{len(self)} (this loader's batches per "
                             "epoch); is the state from this loader?")
        if adopt_warmup is not None:
            self._end_active(superseded=True)  # (its next() raises: not a short epoch)
            self._stop_workers()  # (they and the feeder were made with the other warm-up)
            self._adopted_warmup = adopt_warmup
        self._next_epoch, self._resume, self._cur_epoch = int(epoch), int(position), None

