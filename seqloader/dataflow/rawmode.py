"""The raw mode (``transform=None``): the encoded images are the batch, made in the
caller's process -- nothing to decode (NOTE [ decode modes ], NOTE [ raw batches ] in
:mod:`seqloader.read.raw`)."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import FormatError
from . import targetregion as _targets
from .batch import Batch, BatchSpec
from .cpumode import batches_here
from .decode import decode_records
from .decodemode import DecodeMode

__all__ = ["RawMode"]


class RawMode(DecodeMode):
    """``(list of encoded images, labels)`` batches, in this process whatever
    ``num_workers`` says."""

    in_process = True

    def batch_spec(self, df: Any, transform: Callable | None, common: dict[str, Any],
                   output: str) -> tuple[BatchSpec, Any]:
        return BatchSpec(mode=self, sample_shape=(0,), sample_dtype="uint8", **common), None

    def fill(self, spec: BatchSpec, whole: np.ndarray | None, values: Sequence[Any],
             indices: Sequence[int], labels: np.ndarray, samples: np.ndarray,
             rng: np.random.Generator | None) -> list[bytes]:
        raw: list[bytes] = []
        decode_records(spec, values, indices, labels, lambda i, idx, rec, data: raw.append(data))
        return raw

    def local_batches(self, engine: Any, plan: Any, first: int) -> Iterator[Batch]:
        spec = engine.spec
        if (spec.target_transform is None and spec.target_kind == "class"
                and engine.source.db.metas[0].image_format == "jpeg"):  # (stored pixels: arrays)
            return _from_reader(engine, spec, plan, first)
        return batches_here(engine, spec, plan, first)

    def delivered(self, batches: Iterator[Batch], delivery: Any) -> Iterator[tuple[int, Any]]:
        for batch in batches:
            yield batch.index, delivery.raw(batch)


def _from_reader(engine: Any, spec: BatchSpec, plan: Any, first: int) -> Iterator[Batch]:
    """Raw batches from the reader itself (``RangeReader.encoded``: NOTE [ raw batches ]
    in :mod:`seqloader.read.raw`), each image copied once into its own ``bytes`` (a raw
    batch outlives the reader and pickles, as a DataLoader's does); a record the reader
    cannot parse goes through :meth:`RawMode.fill`, which raises the usual
    :class:`~seqloader.errors.RecordError` naming it."""
    B = spec.batch_size
    labels = _targets.target_region(spec.target_kind, spec.labels_nbytes)
    samples = np.empty((B, *spec.sample_shape), spec.sample_dtype)
    reader = engine.source.reader
    for j, recs in engine.df.batches(plan, first, release=False):
        n = len(recs)
        try:
            views, got = reader.encoded(recs)
            raw = [v if isinstance(v, bytes) else bytes(v) for v in views]
            del views
            labels[:n] = got
        except FormatError:
            try:
                raw = spec.mode.fill(spec, None, [v for _, v in recs], [i for i, _ in recs],
                                     labels[:n], samples[:n], None)
            finally:  # (after the fill, which maps the values' pages again)
                reader.release([v for _, v in recs])
        yield Batch(j, labels[:n], samples[:n], raw)
