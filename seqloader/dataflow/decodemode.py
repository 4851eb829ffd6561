"""The decode-mode seam: what a worker does to a batch, what the main process does after
it, and what the caller gets -- one :class:`DecodeMode` per way of decoding.

NOTE [ decode modes ]
A Loader (or a :class:`~seqloader.dataflow.mapbatch.MultiProcessMapAndBatchData`) picks
its mode once, when it is built (:func:`seqloader.settings.decode_mode`):

* :class:`~seqloader.dataflow.cpumode.CPUMode` -- workers decode and transform each
  record into the shared-memory batch (the fused pipeline, or any transform);
* :class:`~seqloader.dataflow.rawmode.RawMode` -- ``transform=None``: the encoded
  bytes are the batch, made in the caller's process;
* :class:`~seqloader.dataflow.gpumode.GPUMode` -- ``decode="gpu"``: workers gather each
  batch (boxes, flips, fallbacks) and the main process decodes and renders it on the
  device (NOTE [ GPU batches ], NOTE [ GPU stream ]).

The stages, the pool and the delivery ask the mode and never test which one it is.
Targets other than class indices (NOTE [ target region ]) are not a mode: every mode
that takes them handles them through :mod:`~seqloader.dataflow.targetregion`.  A mode
is sent to each worker inside the :class:`~seqloader.dataflow.batch.BatchSpec`, so it
pickles without its main-process state.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..read.plan import EpochPlan
    from .batch import Batch, BatchSpec

__all__ = ["DecodeMode"]


class DecodeMode(ABC):
    """One way of turning a batch of encoded records into what the caller gets."""

    #: batches are made in the caller's process whatever ``num_workers`` says
    in_process: bool = False
    #: the records must outlive the workers' pass (NOTE [ batch buffer layout ])
    keeps_inputs: bool = False
    #: batches made in the caller's process read the records in place (mapped pages)
    reads_in_place: bool = True
    #: the device the mode delivers on, or None (the caller's ``device``)
    device: Any = None

    @abstractmethod
    def batch_spec(self, df: Any, transform: Callable | None, common: dict[str, Any],
                   output: str) -> tuple[BatchSpec, Any]:
        """The workers' :class:`~seqloader.dataflow.batch.BatchSpec` for batches of the
        planned ``df`` (``common``: the fields every mode shares) and the device
        normalisation ``output="uint8"`` leaves to the caller (or None)."""

    @abstractmethod
    def fill(self, spec: BatchSpec, whole: np.ndarray | None, values: Sequence[Any],
             indices: Sequence[int], labels: np.ndarray, samples: np.ndarray,
             rng: np.random.Generator | None) -> list[bytes] | None:
        """What a worker (or the caller's process) does to one batch: fill ``labels`` and
        ``samples`` of the buffer ``whole`` from the record ``values``; returns the
        encoded images where they are the batch.  Raises
        :class:`~seqloader.errors.RecordError` naming the failing record."""

    @abstractmethod
    def local_batches(self, engine: Any, plan: EpochPlan, first: int) -> Iterator[Batch]:
        """The batches ``j >= first`` of ``plan`` made in this process (no workers)."""

    @abstractmethod
    def delivered(self, batches: Iterator[Batch], delivery: Any) -> Iterator[tuple[int, Any]]:
        """``(j, what the caller gets)`` for each batch, in order: the main process's part
        after the workers' (``delivery``: a :class:`~seqloader.dataflow.delivery.Delivery`)."""

    def reset(self) -> None:
        """Drop the main-process state of the last iteration (workers closed)."""

    @property
    def stats(self) -> Any:
        """What the mode counted (``Loader.decode_stats``), or None."""
        return None
