"""What training frameworks (Lightning, accelerate, DDP scripts) expect of a DataLoader,
as far as the :class:`~seqloader.Loader` provides it.

NOTE [ epochs and iterators ]
An epoch belongs to the iterator that yields its first batch, not to ``iter()`` itself:
trainers call ``iter(loader)`` to check that it is iterable (Lightning does, at every
``fit``) and take no batch from it, and that must not use up an epoch.  An iterator
cut short (``limit_train_batches``, a ``break``) holds its epoch until the next
``iter()``: until then ``state_dict()`` says "epoch e, k batches yielded" (a checkpoint
taken there resumes the rest of epoch e); the next iterator starts epoch e + 1.

Whether a checkpoint taken after k batches is mid-epoch or at the end of a cut-short
epoch is the trainer's knowledge, not the loader's: the trainer says it with
``loader.sampler.set_epoch(e)`` at the start of each epoch (Lightning calls
``set_epoch`` on ``dataloader.sampler`` before every training epoch).  The epoch loaded
keeps its position; the one after it means the trainer ended that epoch, and the
position is dropped without a warning (``Loader.set_epoch`` called directly warns, as
there it is more likely a mistaken epoch counter).

NOTE [ accelerate's gradient window ]
``accelerator.accumulate(model)`` steps the optimizer every ``gradient_accumulation_steps``
batches and at the end of the dataloader, which it learns from its ``GradientState``: a
prepared DataLoader registers itself there while it is iterated and sets
``end_of_dataloader`` before yielding its last batch.  ``prepare`` hands a Loader back as
it is, so the Loader does the same itself (:class:`GradientWindow`): with 15 batches and
4 steps a window, the steps fall at batches 3, 7, 11 and 14 of every epoch, as with a
prepared DataLoader, not at 3, 7, 11 and then 0 of the next epoch (the last batches of a
run never reaching a step).  accelerate is not imported for this: the window is opened
only when the program has imported it.  ``remainder`` is -1: a Loader pads no batch, so
``gather_for_metrics`` has nothing to drop.
"""
from __future__ import annotations

import sys
from typing import Any

from .resume import EpochState

__all__ = ["TrainerEpochs", "TrainerFacing", "GradientWindow", "NO_DATASET"]

NO_DATASET = (
    "a seqloader Loader has no .dataset (it reads a database, not a torch Dataset); "
    "accelerate's skip_first_batches() rebuilds a torch DataLoader from .dataset and cannot "
    "skip batches of a Loader -- resume with the Loader's own state instead: "
    "accelerator.register_for_checkpointing(loader) before save_state()/load_state(), "
    "then iterate the loader as usual (it yields exactly the batches not yet seen), or "
    "loader.load_state_dict(state) with a state_dict() you saved")


class TrainerEpochs:
    """``loader.sampler``: an object with DistributedSampler's ``set_epoch``, which trainers
    call at the start of each epoch.  ``set_epoch(e)`` makes ``e`` the loader's next
    epoch, as :meth:`Loader.set_epoch`, except that ``e`` = a loaded position's epoch + 1
    drops that position silently (the trainer cut that epoch short and moved on)."""

    __slots__ = ("_epochs",)

    def __init__(self, epochs: EpochState) -> None:
        self._epochs = epochs

    def set_epoch(self, epoch: int) -> None:
        self._epochs.set_epoch(epoch, trainer=True)


class TrainerFacing:
    """The DataLoader attributes trainers look for, on the :class:`~seqloader.Loader`
    (whose ``epochs`` is its :class:`~seqloader.resume.EpochState`)."""

    epochs: EpochState

    @property
    def sampler(self) -> TrainerEpochs:
        """DataLoader's ``sampler`` as far as trainers use it: ``loader.sampler.set_epoch(e)``
        (what Lightning and DDP scripts call each epoch) is :meth:`set_epoch`, except that
        the epoch after a loaded position's ends that epoch without a warning (a trainer
        that cut it short has moved on)."""
        return TrainerEpochs(self.epochs)

    #: DataLoader's, for trainers that look for it: ``None`` (the Loader batches itself).
    batch_sampler = None

    @property
    def dataset(self) -> Any:
        """There is none: accessing it raises AttributeError naming the supported resume
        (accelerate's ``skip_first_batches`` rebuilds a torch DataLoader from it)."""
        raise AttributeError(NO_DATASET)

    #: accelerate's ``GradientState`` reads these of the dataloader being iterated (NOTE
    #: [ accelerate's gradient window ]): set during an iteration
    end_of_dataloader: bool = False
    remainder: int = -1


class GradientWindow:
    """One iteration's registration with accelerate's ``GradientState`` (NOTE
    [ accelerate's gradient window ]); does nothing where accelerate is not imported.
    :meth:`batch` before yielding each batch, :meth:`close` when the iteration ends."""

    __slots__ = ("_loader", "_state", "_total")

    def __init__(self, loader: TrainerFacing, total: int) -> None:
        self._loader, self._total = loader, total
        mod = sys.modules.get("accelerate.state")
        self._state = mod.GradientState() if mod is not None else None
        loader.end_of_dataloader = False
        if self._state is not None:  # (as accelerate's DataLoaderStateMixin.begin)
            self._state._add_dataloader(loader)

    def batch(self, j: int) -> None:
        """Batch ``j`` (of ``total``) is about to be yielded."""
        self._loader.end_of_dataloader = j + 1 >= self._total

    def close(self) -> None:
        if self._state is not None:
            self._state._remove_dataloader(self._loader)
            self._state = None
