"""Where a Loader is in its epochs, and checkpoints of it: :class:`EpochState`.

The Loader owns one :class:`EpochState`; it holds everything a resume needs to know
about the position (the next epoch, a loaded position in it, the epoch in progress and
how many of its batches were yielded) and nothing else.  What a checkpoint holds
besides the position -- the settings that shape the order, which must match for the
resumed order to be the uninterrupted one (README "Semantics": mid-epoch resume) -- is
:func:`checkpoint` and :func:`check_checkpoint`.
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Any

from .read.plan import PlanSpec

__all__ = ["EpochState", "checkpoint", "check_checkpoint", "is_int", "STATE_VERSION",
           "ORDER_KEYS"]

#: Bumped when a checkpoint of the previous version could be misread.
STATE_VERSION = 1

#: The settings a checkpoint must share with the loader that resumes it (num_workers and
#: rank may differ: the order depends on neither -- all ranks are at the same position in
#: training, and workers only decode).
ORDER_KEYS = ("seed", "batch_size", "world_size", "cache", "chunk_size", "shuffle",
              "drop_last", "num_records", "even")


def is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass
class EpochState:
    """The epoch bookkeeping of one Loader (NOTE [ epochs and iterators ] in
    :mod:`seqloader.trainers`).

    Between iterations it names the next epoch and the batch it starts from
    (``resume``, > 0 after a loaded checkpoint); an iteration takes them at its first
    batch (:meth:`start`) and counts what it yielded (``position``)."""

    #: the epoch of the next iteration to yield a batch
    next_epoch: int = 0
    #: its first batch (> 0 after :meth:`load`)
    resume: int = 0
    #: the epoch of the iteration in progress (None: between iterations)
    current: int | None = None
    #: batches of it already yielded
    position: int = 0
    #: the iteration in progress ran to its end
    done: bool = False

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the next one between iterations."""
        return self.next_epoch if self.current is None else self.current

    def set_epoch(self, epoch: int, *, trainer: bool = False) -> None:
        """Make the next iteration epoch ``epoch``.  A position loaded for that same epoch
        is kept; one for another epoch is dropped, with a warning -- except that a
        trainer (``trainer=True``) starting the epoch after a loaded one ends that epoch,
        cut short by it, silently."""
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        cut_short = trainer and epoch == self.next_epoch + 1
        if epoch != self.next_epoch and self.resume:
            if not cut_short:
                warnings.warn(f"set_epoch({epoch}) discards the position loaded for epoch "
                              f"{self.next_epoch} (batch {self.resume}): epoch {epoch} "
                              "starts from its first batch; call set_epoch with the "
                              "checkpoint's epoch to resume it", stacklevel=3)
            self.resume = 0
        self.next_epoch, self.current = int(epoch), None

    def between(self) -> None:
        """No iteration is in progress (a new ``iter()`` has not taken its epoch yet)."""
        self.current = None

    def start(self, epoch: int, first: int) -> None:
        """An iteration takes epoch ``epoch`` from batch ``first``; the next is ``epoch + 1``."""
        self.current, self.position, self.done = epoch, first, False
        self.next_epoch, self.resume = epoch + 1, 0

    def where(self, num_batches: int) -> tuple[int, int]:
        """``(epoch, position)`` to resume from: the epoch in progress and the batches of it
        yielded, or the next epoch (and its loaded position) between epochs."""
        if self.current is None:
            return self.next_epoch, self.resume
        if self.done or self.position >= num_batches:
            return self.current + 1, 0
        return self.current, self.position

    def load(self, epoch: int, position: int, num_batches: int) -> None:
        """Continue from batch ``position`` of ``epoch`` (ValueError naming a bad value)."""
        if not (is_int(epoch) and epoch >= 0):
            raise ValueError(f"cannot resume: the checkpoint's epoch is {epoch!r}, not an "
                             "integer >= 0")
        if not (is_int(position) and 0 <= position <= num_batches):
            raise ValueError(f"cannot resume: the checkpoint's position is {position!r}, not "
                             f"a batch index in 0..{num_batches} (this loader's batches per "
                             "epoch); is the state from this loader?")
        self.next_epoch, self.resume, self.current = int(epoch), int(position), None


def checkpoint(where: tuple[int, int], spec: PlanSpec, *, cache: int, warmup: int,
               fingerprint: str) -> dict[str, Any]:
    """A loader's ``state_dict``: the position ``where`` and what shapes its order."""
    epoch, position = where
    return {"version": STATE_VERSION, "epoch": epoch, "position": position,
            "seed": spec.seed, "batch_size": spec.batch_size, "num_workers": spec.num_workers,
            "world_size": spec.world_size, "rank": spec.rank, "cache": cache,
            "chunk_size": spec.chunk_size, "shuffle": spec.shuffle, "drop_last": spec.drop_last,
            "num_records": spec.num_records, "even": spec.even,
            "warmup": warmup, "shard_sizes": list(spec.shard_sizes),
            "fingerprint": fingerprint}


def check_checkpoint(state: dict[str, Any], mine: dict[str, Any], *,
                     default_warmup: bool) -> int | None:
    """Raise ValueError unless ``state`` can resume a loader whose checkpoint is ``mine``;
    returns the warm-up to adopt, or None.  With ``default_warmup`` (the loader's warm-up
    is the default) a differing checkpoint warm-up is adopted rather than refused: the
    default changed in 0.2.0 for splits that fit in the buffer, and checkpoints from
    before the key existed all used the old default, one batch."""
    diff = {k: (state.get(k), mine[k]) for k in ORDER_KEYS if state.get(k) != mine[k]}
    # the shuffle buffer's warmup, the shard layout and the database itself shape the
    # order too (checked where the checkpoint has them: older ones do not)
    diff.update({k: (state[k], mine[k]) for k in ("warmup", "shard_sizes", "fingerprint")
                 if k in state and state[k] != mine[k]})
    adopt = None
    if default_warmup:
        then = state.get("warmup", min(mine["cache"], mine["batch_size"]))
        diff.pop("warmup", None)
        if not is_int(then):
            diff["warmup"] = (then, mine["warmup"])
        elif then != mine["warmup"]:
            adopt = int(then)
    if state.get("version") != STATE_VERSION or diff:
        why = ""
        if set(diff) == {"fingerprint"}:
            why = (" -- the database is not the one the checkpoint was written with "
                   "(another preprocessing run, options or source tree); resume with "
                   "that database, or start a new epoch without load_state_dict")
        raise ValueError(f"cannot resume: the checkpoint's loader settings differ from this "
                         f"loader's (checkpoint, now): {diff}{why}; construct the Loader "
                         "with the checkpoint's settings to continue the same sequence")
    return adopt
