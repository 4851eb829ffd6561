"""``MultiProcessMapAndBatchData``: decode a planned ``BatchData``'s batches of encoded
records in worker processes, straight into shared-memory batch buffers -- the Loader's
engine (NOTE [ planned stages ], NOTE [ worker lifecycle ])."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

import numpy as np

from ..read.plan import EpochPlan, plan_epoch
from .base import DataFlow, ProxyDataFlow
from ..errors import FormatError
from ..format.imagesize import DEFAULT_MAX_PIXELS, check_max_pixels
from . import targetregion as _targets
from .batch import Batch, BatchSpec, slot_views
from .decode import batch_rng, callers_rngs_kept, check_pixels, decode_batch, record_error
from .stats import StageCounters

__all__ = ["MultiProcessMapAndBatchData", "batch_spec"]


def batch_spec(df: Any, transform: Callable | None, target_transform: Callable | None = None,
               output: str = "float", gpu: Any = None,
               max_pixels: int | None = DEFAULT_MAX_PIXELS) -> tuple[BatchSpec, Any]:
    """The workers' spec for batches of the planned ``df`` and the device normalisation
    that ``output="uint8"`` leaves to the caller (or None).  ``transform=None``: raw mode.
    ``gpu`` (a :class:`~seqloader.dataflow.gpugather.GPUOptions`): mode "gpu", the
    workers gather batches for the device (NOTE [ GPU batches ]).
    A plain transform is run on record 0 here to learn the sample shape (a failure
    there raises :class:`~seqloader.errors.RecordError` naming record 0).  ``max_pixels``:
    a record whose image claims more pixels raises RecordError (NOTE [ pixel limit ])."""
    if output not in ("float", "uint8"):
        raise ValueError(f"output must be 'float' or 'uint8', got {output!r}")
    db, s = df.source.db, df.plan_spec
    common = dict(batch_size=s.batch_size, seed=s.seed, rank=s.rank, max_pixels=max_pixels,
                  target_transform=target_transform,
                  mean_record=db.image_bytes / max(1, db.num_records),
                  # HOOK [ any targets ]: target kind and region (NOTE [ target region ])
                  **_targets.spec_fields(db, s.batch_size, target_transform))
    if transform is None:
        return BatchSpec(mode="raw", sample_shape=(0,), sample_dtype="uint8", **common), None
    from ..transforms import adapt, compile_fused, decode_rgb

    if gpu is not None:
        return _gpu_spec(db, transform, gpu, common), None

    fused = compile_fused(transform, output=output)
    normalize = None
    if output == "uint8":
        if fused is None:
            raise ValueError("output='uint8' needs a standard seqloader recipe (RandomResizedCrop "
                             "or Resize+CenterCrop, optional flip, ToTensor, Normalize) to move "
                             "normalisation to the device; use output='float' for this transform")
        normalize = fused.device_normalize()
    if fused is not None:
        return BatchSpec(mode="decode", fused=fused, sample_shape=tuple(fused.out_shape),
                         sample_dtype=np.dtype(fused.out_dtype).name, **common), normalize
    fn = adapt(transform)
    rec = db.first_record()  # infer the sample shape from record 0
    try:
        if rec.shape is None:
            check_pixels(rec.image, max_pixels)
        with callers_rngs_kept():
            img = (decode_rgb(rec.image) if rec.shape is None  # HOOK [ stored pixels ]
                   else np.frombuffer(rec.image, np.uint8).reshape(rec.shape).copy())
            sample = np.asarray(fn(img, batch_rng(s.seed, 0, s.rank, 0)))
    except Exception as e:  # named like every other record's failure
        raise record_error(e, 0, rec.path) from e
    return BatchSpec(mode="decode", transform=fn, sample_shape=sample.shape,
                     sample_dtype=sample.dtype.name, **common), None


def _gpu_spec(db: Any, transform: Callable, gpu: Any, common: dict) -> BatchSpec:
    from ..transforms import compile_fused
    from .gpugather import sample_nbytes

    fused = compile_fused(transform, output="uint8")
    if fused is None:
        raise ValueError("decode='gpu' needs a standard recipe (RandomResizedCrop or Resize + "
                         "CenterCrop, optional flip, ToTensor, Normalize: seqloader's or "
                         f"torchvision's classes) to run on the device, got {transform!r}; "
                         "use decode='cpu' for other transforms")
    if common["target_kind"] != "class":
        raise ValueError("decode='gpu' yields integer class labels; this database holds other "
                         "targets: use decode='cpu'")
    return BatchSpec(mode="gpu", fused=fused, gpu=gpu, sample_shape=(sample_nbytes(fused.out_hw),),
                     sample_dtype="uint8",
                     stored_pixels=db.metas[0].image_format == "pixels", **common)


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
    Workers start at the first iteration and persist until :meth:`close`."""

    def __init__(self, df: DataFlow, num_workers: int, transform: Callable | None = None, *,
                 target_transform: Callable | None = None, output: str = "float",
                 prefetch: int = 2, timeout: float = 0, start_method: str | None = None,
                 read_ahead: bool = True, gpu: Any = None,
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
        self.read_ahead, self.gpu = read_ahead, gpu
        self.max_pixels = check_max_pixels(max_pixels)
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
            self._spec, self.device_normalize = batch_spec(self.df, self.transform,
                                                           self.target_transform, self.output,
                                                           self.gpu, self.max_pixels)
        return self._spec

    @property
    def in_process(self) -> bool:
        """Batches are made in this process: raw mode (nothing to decode) or no workers."""
        return self.spec.mode == "raw" or self.num_workers == 0

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
            yield from self._in_process(spec, plan, first)
            return
        self.start()
        # the workers go on into the next epoch (the one that follows unless the next
        # run asks for another; then that work is cancelled)
        ahead = self.plan(epoch + 1) if self.read_ahead else None
        gpu = spec.mode == "gpu"
        for j, n, (labels, samples), slot in self.pool.epoch(plan, self.df, first, ahead):
            whole = slot_views(self.pool.slot_buffer(slot), spec, 0)[2] if gpu else None
            yield Batch(j, labels, samples, None, slot, whole)
            del whole

    def _in_process(self, spec: BatchSpec, plan: EpochPlan, first: int):
        if spec.mode == "gpu":
            yield from self._gathered(spec, plan, first)
            return
        B = spec.batch_size
        labels = _targets.target_region(spec.target_kind, spec.labels_nbytes)  # HOOK [ any targets ]
        samples = np.empty((B, *spec.sample_shape), spec.sample_dtype)
        if (spec.mode == "raw" and spec.target_transform is None and spec.target_kind == "class"
                and self.source.db.metas[0].image_format == "jpeg"):  # (stored pixels: arrays)
            yield from self._raw(spec, plan, first, labels, samples)
            return
        for j, recs in self.df.batches(plan, first):
            n = len(recs)
            with callers_rngs_kept() if spec.transform is not None else contextlib.nullcontext():
                region = _targets.region_view(spec.target_kind, labels, n)  # HOOK [ any targets ]
                raw = decode_batch(spec, [v for _, v in recs], [i for i, _ in recs], region,
                                   samples[:n], batch_rng(spec.seed, plan.epoch, spec.rank, j))
            yield Batch(j, region, samples[:n], raw)

    def _gathered(self, spec: BatchSpec, plan: EpochPlan, first: int):
        """Mode "gpu" without workers: the reader copies each batch's records into one
        buffer laid out as a worker's (each image copied once), then gathers it (NOTE
        [ GPU batches ])."""
        from .gpugather import gather_batch

        buf = np.empty(spec.slot_nbytes, np.uint8)
        labels, samples, whole = slot_views(buf, spec, spec.batch_size)
        for j, recs in self.df.batches(plan, first, release=False):
            n = len(recs)
            start = spec.input_start([len(v) for _, v in recs])
            values: list[Any] = []
            for _, v in recs:  # (a batch too large for the buffer: gathered from the views)
                if start is None:
                    values.append(v)
                    continue
                self.df.copy_into(v, whole[start:start + len(v)])
                values.append(whole[start:start + len(v)].data)
                start += len(v)
            gather_batch(spec, whole, values, [i for i, _ in recs], labels[:n], samples[:n],
                         batch_rng(spec.seed, plan.epoch, spec.rank, j))
            del values
            yield Batch(j, labels[:n], samples[:n], whole=whole)

    def _raw(self, spec: BatchSpec, plan: EpochPlan, first: int, labels: np.ndarray,
             samples: np.ndarray):
        """Raw batches from the reader itself (``RangeReader.encoded``: NOTE [ raw batches ]
        in :mod:`seqloader.read.raw`), each image copied once into its own ``bytes`` (a
        raw batch outlives the reader and pickles, as a DataLoader's does); a record the
        reader cannot parse goes through ``decode_batch``, which raises the usual
        :class:`~seqloader.errors.RecordError` naming it."""
        reader = self.source.reader
        for j, recs in self.df.batches(plan, first, release=False):
            n = len(recs)
            try:
                views, got = reader.encoded(recs)
                raw = [v if isinstance(v, bytes) else bytes(v) for v in views]
                del views
                labels[:n] = got
            except FormatError:
                try:
                    raw = decode_batch(spec, [v for _, v in recs], [i for i, _ in recs],
                                       labels[:n], samples[:n], None)
                finally:  # (after decode_batch, which maps the values' pages again)
                    reader.release([v for _, v in recs])
            yield Batch(j, labels[:n], samples[:n], raw)

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
