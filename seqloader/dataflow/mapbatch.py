"""``MultiProcessMapAndBatchData``: decode a planned ``BatchData``'s batches of encoded
records in worker processes, straight into shared-memory batch buffers -- the Loader's
engine (NOTE [ planned stages ], NOTE [ worker lifecycle ])."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

from ..format.imagesize import DEFAULT_MAX_PIXELS, check_max_pixels
from ..read.plan import EpochPlan, plan_epoch
from . import targetregion as _targets
from .base import DataFlow, ProxyDataFlow
from .batch import Batch, BatchSpec, slot_views
from .decodemode import DecodeMode
from .modechoice import decode_mode
from .stats import StageCounters

__all__ = ["MultiProcessMapAndBatchData", "batch_spec"]


def batch_spec(df: Any, mode: DecodeMode, transform: Callable | None,
               target_transform: Callable | None = None, output: str = "float",
               max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[BatchSpec, Any]:
    """The workers' spec for batches of the planned ``df`` as ``mode`` fills them, and the
    device normalisation that ``output="uint8"`` leaves to the caller (or None).
    ``max_pixels``: a record whose image claims more pixels raises RecordError (NOTE
    [ pixel limit ])."""
    if output not in ("float", "uint8"):
        raise ValueError(f"output must be 'float' or 'uint8', got {output!r}")
    db, s = df.source.db, df.plan_spec
    common = dict(batch_size=s.batch_size, seed=s.seed, rank=s.rank, max_pixels=max_pixels,
                  target_transform=target_transform,
                  mean_record=db.image_bytes / max(1, db.num_records),
                  # HOOK [ any targets ]: target kind and region (NOTE [ target region ])
                  **_targets.spec_fields(db, s.batch_size, target_transform))
    return mode.batch_spec(df, transform, common, output)


class MultiProcessMapAndBatchData(ProxyDataFlow):
    """Apply ``transform`` to the records of each batch of ``df`` (a
    :class:`~seqloader.dataflow.batch.BatchData` over the reader stages) in
    ``num_workers`` processes, writing each batch straight into a shared-memory buffer.

    Yields ``[images, labels]`` per batch: ``images`` an array of ``[B, *sample_shape]``
    (``transform`` gets an HWC uint8 RGB array, seqloader transforms also a seeded
    ``rng``, and returns a fixed-shape array) or, with ``transform=None``, the list of
    encoded images; ``labels`` int64 (after ``target_transform``).  The order, the
    augmentation draws and the errors do not depend on ``num_workers`` (0: in this
    process): :class:`~seqloader.errors.RecordError` names the failing record.  A dead
    or stuck (``timeout`` s) worker raises :class:`~seqloader.errors.WorkerDiedError`.
    Workers start at the first iteration and persist until :meth:`close`.  ``decode``
    (``"cpu"``, ``"gpu"``, a :class:`~seqloader.dataflow.gpugather.GPUOptions` or a
    :class:`~seqloader.dataflow.decodemode.DecodeMode`) and ``device`` choose how
    batches are decoded (NOTE [ decode modes ])."""

    def __init__(self, df: DataFlow, num_workers: int, transform: Callable | None = None, *,
                 target_transform: Callable | None = None, output: str = "float",
                 prefetch: int = 2, timeout: float = 0, start_method: str | None = None,
                 read_ahead: bool = True, decode: Any = "cpu", device: Any = None,
                 max_pixels: int | None = DEFAULT_MAX_PIXELS):
        if df.planned != "batches":
            raise TypeError("MultiProcessMapAndBatchData reads a BatchData over LMDBData (and "
                            "optionally LocallyShuffleData); for other stages use "
                            "MultiProcessMapData and BatchData")
        super().__init__(df)
        self.source = df.source
        self.num_workers, self.transform = num_workers, transform
        self.target_transform, self.output = target_transform, output
        self.prefetch, self.timeout, self.start_method = prefetch, timeout, start_method
        self.read_ahead = read_ahead
        self.max_pixels = check_max_pixels(max_pixels)
        #: how batches are decoded (NOTE [ decode modes ]), chosen here, once
        self.mode: DecodeMode = decode_mode(decode, transform, output=output, device=device,
                                            rank=df.plan_spec.rank,
                                            world_size=df.plan_spec.world_size)
        #: the plan of its batches: ``df``'s, with batch ``j`` decoded by worker ``j % W``
        self.plan_spec = dataclasses.replace(df.plan_spec, num_workers=max(1, num_workers))
        self._spec: BatchSpec | None = None
        self.device_normalize: Any = None
        self.pool: Any = None
        #: the workers' and the feed thread's counters, kept across worker restarts
        #: (NOTE [ pipeline counters ])
        self.counters = StageCounters()

    @property
    def spec(self) -> BatchSpec:
        if self._spec is None:
            self._spec, self.device_normalize = batch_spec(self.df, self.mode, self.transform,
                                                           self.target_transform, self.output,
                                                           self.max_pixels)
        return self._spec

    @property
    def in_process(self) -> bool:
        """Batches are made in this process: the mode says so, or no workers."""
        return self.mode.in_process or self.num_workers == 0

    def plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(self.plan_spec, epoch)

    def start(self) -> None:
        """Start the workers now, in this thread (else the first :meth:`run` does).  A
        caller that iterates :meth:`run` in another thread must: workers get SIGKILL
        when the *thread* that started them ends (``PR_SET_PDEATHSIG``)."""
        if self.in_process:
            return
        if self.pool is None:
            from .pool import WorkerPool
            self.pool = WorkerPool(self.spec, self.num_workers, prefetch=self.prefetch,
                                   start_method=self.start_method, timeout=self.timeout)
            self.pool.counters = self.counters
        self.pool.start()

    def run(self, epoch: int, first: int = 0, plan: EpochPlan | None = None) -> Iterator[Batch]:
        """The :class:`Batch` es ``j >= first`` of ``epoch`` (of ``plan``, a plan of that
        epoch by this stage's spec, when given: the rest of a resumed epoch)."""
        plan = self.plan(epoch) if plan is None else plan
        spec = self.spec
        if self.in_process:
            yield from self.mode.local_batches(self, plan, first)
            return
        self.start()
        # the workers go on into the next epoch (the one that follows unless the next
        # run asks for another; then that work is cancelled)
        ahead = self.plan(epoch + 1) if self.read_ahead else None
        for j, n, (labels, samples), slot in self.pool.epoch(plan, self.df, first, ahead):
            whole = slot_views(self.pool.slot_buffer(slot), spec, 0)[2]
            yield Batch(j, labels, samples, None, slot, whole)
            del whole

    def __len__(self) -> int:
        return len(self.df)

    def __iter__(self) -> Iterator[list]:
        return self.source.new_pass(self._copies)

    def _copies(self, epoch: int) -> Iterator[list]:
        for b in self.run(epoch):
            yield [b.raw if b.raw is not None else b.samples.copy(), b.labels.copy()]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        super().close()
