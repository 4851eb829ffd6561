"""The CPU decode mode (``decode="cpu"``, the default): workers decode and transform each
record straight into the shared-memory batch; the caller gets tensors of it (NOTE
[ decode modes ], NOTE [ zero-copy batches ])."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import targetregion as _targets
from .batch import Batch, BatchSpec
from .decode import batch_rng, callers_rngs_kept, check_pixels, decode_batch, record_error
from .decodemode import DecodeMode

__all__ = ["CPUMode", "batches_here"]


class CPUMode(DecodeMode):
    """Decode on the CPU: the fused pipeline for a standard recipe, else any transform
    (``callable(img_rgb_uint8, rng) -> array``), run on record 0 here to learn the
    sample shape (a failure there raises :class:`~seqloader.errors.RecordError` naming
    record 0)."""

    def batch_spec(self, df: Any, transform: Callable | None, common: dict[str, Any],
                   output: str) -> tuple[BatchSpec, Any]:
        from ..transforms import adapt, compile_fused, decode_rgb

        fused = compile_fused(transform, output=output)
        normalize = None
        if output == "uint8":
            if fused is None:
                raise ValueError("output='uint8' needs a standard seqloader recipe "
                                 "(RandomResizedCrop or Resize+CenterCrop, optional flip, "
                                 "ToTensor, Normalize) to move normalisation to the device; "
                                 "use output='float' for this transform")
            normalize = fused.device_normalize()
        if fused is not None:
            return BatchSpec(mode=self, fused=fused, sample_shape=tuple(fused.out_shape),
                             sample_dtype=np.dtype(fused.out_dtype).name, **common), normalize
        fn = adapt(transform)
        db, s = df.source.db, df.plan_spec
        rec = db.first_record()  # infer the sample shape from record 0
        try:
            if rec.shape is None:
                check_pixels(rec.image, common["max_pixels"])
            with callers_rngs_kept():
                img = (decode_rgb(rec.image) if rec.shape is None  # HOOK [ stored pixels ]
                       else np.frombuffer(rec.image, np.uint8).reshape(rec.shape).copy())
                sample = np.asarray(fn(img, batch_rng(s.seed, 0, s.rank, 0)))
        except Exception as e:  # named like every other record's failure
            raise record_error(e, 0, rec.path) from e
        return BatchSpec(mode=self, transform=fn, sample_shape=sample.shape,
                         sample_dtype=sample.dtype.name, **common), None

    def fill(self, spec: BatchSpec, whole: np.ndarray | None, values: Sequence[Any],
             indices: Sequence[int], labels: np.ndarray, samples: np.ndarray,
             rng: np.random.Generator | None) -> None:
        decode_batch(spec, values, indices, labels, samples, rng)

    def local_batches(self, engine: Any, plan: Any, first: int) -> Iterator[Batch]:
        return batches_here(engine, engine.spec, plan, first)

    def delivered(self, batches: Iterator[Batch], delivery: Any) -> Iterator[tuple[int, Any]]:
        for batch in batches:
            out = delivery(batch)
            j = batch.index
            del batch  # (its views of the buffer)
            yield j, out


def batches_here(engine: Any, spec: BatchSpec, plan: Any, first: int) -> Iterator[Batch]:
    """The batches ``j >= first`` of ``plan``, each filled by ``spec.mode`` in this
    process into one reused buffer (the caller's global generators kept as they were)."""
    B = spec.batch_size
    labels = _targets.target_region(spec.target_kind, spec.labels_nbytes)  # HOOK [ any targets ]
    samples = np.empty((B, *spec.sample_shape), spec.sample_dtype)
    for j, recs in engine.df.batches(plan, first):
        n = len(recs)
        with callers_rngs_kept() if spec.transform is not None else contextlib.nullcontext():
            region = _targets.region_view(spec.target_kind, labels, n)  # HOOK [ any targets ]
            raw = spec.mode.fill(spec, None, [v for _, v in recs], [i for i, _ in recs],
                                 region, samples[:n],
                                 batch_rng(spec.seed, plan.epoch, spec.rank, j))
        yield Batch(j, region, samples[:n], raw)
