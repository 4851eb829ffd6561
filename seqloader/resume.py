"""Where a Loader is in its epochs, and checkpoints of it: :class:`EpochState`.

The Loader owns one :class:`EpochState`; it holds everything a resume needs to know
about the position (the next epoch, a loaded position in it, the epoch in progress and
how many of its batches were yielded, and the segments of that epoch run on other
settings before it) and nothing else.  What a checkpoint holds besides the position --
the settings the epoch ran on, the seed and the database (README "Semantics": mid-epoch
resume) -- is :func:`checkpoint`; :func:`check_checkpoint` decides how a loader resumes
it: the same plan from the same batch (same settings), or the rest of the epoch on its
own settings (NOTE [ elastic resume ] in :mod:`seqloader.dataflow.remainder`).
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, replace
from typing import Any

from .dataflow.remainder import Segment
from .read.plan import PlanSpec

__all__ = ["EpochState", "Resumed", "checkpoint", "check_checkpoint", "is_int",
           "STATE_VERSION", "IDENTITY_KEYS"]

#: Bumped when a checkpoint of the previous version could be misread (2: no rank, and the
#: epoch's earlier segments; version 1 is still read).
STATE_VERSION = 2

#: What a checkpoint must share with the loader that resumes it, on any settings: the
#: seed (the order of the rest is drawn from it) and the database (its shard sizes and
#: fingerprint where the checkpoint has them: older ones do not).  Everything else may differ (NOTE [ elastic resume ]).
IDENTITY_KEYS = ("seed", "num_records", "shard_sizes", "fingerprint")


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
    #: the segments of the loaded epoch before the loaded position (NOTE [ elastic resume ])
    pending: tuple[Segment, ...] = ()
    #: those of the epoch in progress
    before: tuple[Segment, ...] = ()
    #: batches of the iteration in progress (its plan's; None: the loader's ``len``)
    batches: int | None = None

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
        if epoch != self.next_epoch and (self.resume or self.pending):
            if not cut_short:
                warnings.warn(f"set_epoch({epoch}) discards the position loaded for epoch "
                              f"{self.next_epoch} (batch {self.resume}): epoch {epoch} "
                              "starts from its first batch; call set_epoch with the "
                              "checkpoint's epoch to resume it", stacklevel=3)
            self.resume, self.pending = 0, ()
        self.next_epoch, self.current = int(epoch), None

    def between(self) -> None:
        """No iteration is in progress (a new ``iter()`` has not taken its epoch yet)."""
        self.current = None

    def start(self, epoch: int, first: int, *, before: tuple[Segment, ...] = (),
              batches: int | None = None) -> None:
        """An iteration takes epoch ``epoch`` from batch ``first`` of the plan that follows
        the segments ``before`` (``batches`` long); the next is ``epoch + 1``."""
        self.current, self.position, self.done = epoch, first, False
        self.before, self.batches = before, batches
        self.next_epoch, self.resume, self.pending = epoch + 1, 0, ()

    def where(self, num_batches: int) -> tuple[int, int, tuple[Segment, ...]]:
        """``(epoch, position, segments before)`` to resume from: the epoch in progress and
        the batches of it yielded, or the next epoch (and its loaded position) between
        epochs.  ``num_batches``: the loader's ``len`` (an iteration's own count wins)."""
        if self.current is None:
            return self.next_epoch, self.resume, self.pending
        total = num_batches if self.batches is None else self.batches
        if self.done or self.position >= total:
            return self.current + 1, 0, ()
        return self.current, self.position, self.before

    def load(self, epoch: int, position: int, num_batches: int,
             before: tuple[Segment, ...] = ()) -> None:
        """Continue from batch ``position`` of ``epoch``'s plan after the segments ``before``
        (``num_batches`` long; ValueError naming a bad value)."""
        if not (is_int(epoch) and epoch >= 0):
            raise ValueError(f"cannot resume: the checkpoint's epoch is {epoch!r}, not an "
                             "integer >= 0")
        if not (is_int(position) and 0 <= position <= num_batches):
            raise ValueError(f"cannot resume: the checkpoint's position is {position!r}, not "
                             f"a batch index in 0..{num_batches} (this loader's batches per "
                             "epoch); is the state from this loader?")
        self.next_epoch, self.resume, self.current = int(epoch), int(position), None
        self.pending = tuple(before)


def checkpoint(where: tuple[int, int, tuple[Segment, ...]], spec: PlanSpec, *, cache: int,
               warmup: int, fingerprint: str) -> dict[str, Any]:
    """A loader's ``state_dict``: the position ``where`` and the settings it ran on --
    equal on every rank (no rank in it), a few hundred bytes."""
    epoch, position, before = where
    return {"version": STATE_VERSION, "epoch": epoch, "position": position,
            "seed": spec.seed, "num_records": spec.num_records,
            "shard_sizes": list(spec.shard_sizes), "fingerprint": fingerprint,
            "world_size": spec.world_size, "batch_size": spec.batch_size,
            "drop_last": spec.drop_last, "even": spec.even, "shuffle": spec.shuffle,
            "cache": cache, "warmup": warmup, "chunk_size": spec.chunk_size,
            "num_workers": spec.num_workers, "before": [b.as_dict() for b in before]}


@dataclass(frozen=True)
class Resumed:
    """How a loader continues a checkpoint (:func:`check_checkpoint`)."""

    epoch: int
    #: the first batch of the plan to yield
    first: int
    #: the segments of ``epoch`` before that plan (empty: the epoch's own plan)
    before: tuple[Segment, ...]
    #: a warm-up to adopt (the checkpoint's default one), or None
    adopt: int | None = None


def check_checkpoint(state: dict[str, Any], mine: dict[str, Any], *,
                     default_warmup: bool) -> Resumed:
    """How a loader whose checkpoint is ``mine`` continues ``state`` (ValueError in one
    line naming what cannot be honoured: another seed or database, a malformed state).
    On the checkpoint's settings: the same plan from the same batch.  On others: the
    rest of the epoch (NOTE [ elastic resume ]).  With ``default_warmup`` (the loader's
    warm-up is the default) a checkpoint that differs only in its warm-up is continued
    exactly by adopting that warm-up (the default changed in 0.2.0 for splits that fit in
    the buffer, and checkpoints from before the key existed all used one batch)."""
    if not isinstance(state, dict):
        raise ValueError(f"cannot resume: a Loader state is a dict, got {type(state).__name__}")
    if state.get("version") not in (1, STATE_VERSION):
        raise ValueError(f"cannot resume: the checkpoint's version is {state.get('version')!r}; "
                         f"this seqloader reads versions 1 and {STATE_VERSION}")
    if state.get("seed") != mine["seed"]:
        raise ValueError(f"cannot resume: the checkpoint's seed is {state.get('seed')!r}, this "
                         f"loader's {mine['seed']!r} (the order of the rest of the epoch is drawn "
                         f"from it); construct the Loader with seed={state.get('seed')!r}")
    for k in IDENTITY_KEYS[1:]:
        if (k in state or k == "num_records") and state.get(k) != mine[k]:
            raise ValueError(f"cannot resume: the database is not the one the checkpoint was "
                             f"written with ({k}: {_short(state.get(k))}, now {_short(mine[k])}) "
                             "-- another preprocessing run, options or source tree; resume with "
                             "that database, or start a new epoch without load_state_dict")
    if not (is_int(state.get("epoch")) and state["epoch"] >= 0):
        raise ValueError(f"cannot resume: the checkpoint's epoch is {state.get('epoch')!r}, not "
                         "an integer >= 0")
    state = {"warmup": min(state.get("cache", 0), state.get("batch_size", 0)), **state}
    before = state.get("before", [])
    if not isinstance(before, list):
        raise ValueError(f"cannot resume: the checkpoint's before is {before!r}, not a list")
    segs = [Segment.of(b, f"checkpoint's before[{i}]") for i, b in enumerate(before)]
    last, now = Segment.of(state), Segment.of({**mine, "position": 0})
    adopt = None
    if (default_warmup and last.warmup != now.warmup
            and replace(last, warmup=now.warmup).settings() == now.settings()):
        adopt = last.warmup
    if adopt is not None or last.settings() == now.settings():
        done, first = segs, last.position  # the same plan, from the same batch
    else:
        done, first = segs + [last], 0  # the rest, on this loader's settings
    # (a segment that delivered nothing changes nothing: dropped, so a checkpoint taken
    # at an epoch's start resumes that epoch's own plan on any settings)
    return Resumed(int(state["epoch"]), first, tuple(s for s in done if s.position), adopt)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."
