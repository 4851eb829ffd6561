"""The batch types: :class:`BatchSpec` (what a worker needs to fill a batch buffer, and
the buffer's layout), :class:`Batch` (a filled buffer on its way to the caller) and
:class:`BatchData` (the stage that groups datapoints, or a plan's records, into batches).
The decode that fills a buffer is :mod:`seqloader.dataflow.decode`'s.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import msgpack
import numpy as np

from ..format.imagesize import DEFAULT_MAX_PIXELS
from ..read.plan import EpochPlan, check_count, num_batches, plan_epoch
from . import targetregion as _targets
from .base import DataFlow, ProxyDataFlow

if TYPE_CHECKING:
    from .decodemode import DecodeMode

__all__ = ["BatchSpec", "Batch", "BatchData", "slot_views"]

EncodedBatch = list[tuple[int, memoryview]]


@dataclass
class BatchSpec:
    """What a worker needs to fill a batch buffer; picklable, sent to each worker once.

    ``mode`` is the :class:`~seqloader.dataflow.decodemode.DecodeMode` that fills it
    (NOTE [ decode modes ]).  Where samples are decoded exactly one of ``fused`` (a
    :class:`~seqloader.transforms.FusedPipeline`) and ``transform``
    (``callable(img_rgb_uint8, rng) -> array``) is set, and every sample has
    ``sample_shape``/``sample_dtype``.  ``seed`` and ``rank`` seed the batches'
    generators (:func:`~seqloader.dataflow.decode.batch_rng`); ``mean_record`` (the
    database's mean encoded record, bytes) sizes the buffers' tail.  The reader's
    settings (cache, I/O, chunks) are the stages' (:mod:`seqloader.dataflow.stages`), not
    the workers'.
    """

    mode: DecodeMode
    batch_size: int
    seed: int = 0
    rank: int = 0
    fused: Any = None
    transform: Callable | None = None
    target_transform: Callable | None = None
    sample_shape: tuple[int, ...] = ()
    sample_dtype: str = "float32"
    mean_record: float = 0.0
    #: "class" (int64 labels) or "any" (packed targets: NOTE [ target region ] in targets.py)
    target_kind: str = "class"
    #: the labels region's size for "any" targets (``targets.labels_nbytes``)
    target_nbytes: int = 0
    #: the records hold stored pixels (NOTE [ stored pixels ])
    stored_pixels: bool = False
    #: an image whose header claims more pixels is a RecordError before any decode (NOTE
    #: [ pixel limit ]); None: no limit
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    @property
    def keeps_inputs(self) -> bool:
        """The records must outlive the workers' pass (the mode's main-process part
        reads them), so they lie after the samples region, not over it."""
        return self.mode.keeps_inputs

    @property
    def sample_nbytes(self) -> int:
        return int(np.prod(self.sample_shape)) * np.dtype(self.sample_dtype).itemsize

    @property
    def labels_nbytes(self) -> int:
        """The labels region at the front of a buffer: int64 x B, or the target region."""
        return 8 * self.batch_size if self.target_kind == "class" else self.target_nbytes

    @property
    def output_nbytes(self) -> int:
        return self.batch_size * self.sample_nbytes + self.labels_nbytes

    @property
    def tail_nbytes(self) -> int:
        """Bytes after the samples region: 1 MiB, plus whatever ``1.25x`` a mean batch of
        records (a sum of 256 record sizes rarely strays 10 % from its mean) needs beyond
        80 % of the samples region (small outputs, large JPEGs)."""
        excess = self.mean_record + 64 - (0 if self.keeps_inputs else 0.8 * self.sample_nbytes)
        return (1 << 20) + int(1.25 * self.batch_size * max(0.0, excess))

    @property
    def slot_nbytes(self) -> int:
        return self.output_nbytes + self.tail_nbytes

    def input_start(self, sizes: Sequence[int]) -> int | None:
        """Where a batch of records of ``sizes`` goes in a buffer: packed so that they end
        where the buffer ends, or None when they do not fit (NOTE [ batch buffer layout ])."""
        total = int(sum(sizes))
        start = self.slot_nbytes - total
        L, S = self.labels_nbytes, self.sample_nbytes
        if start < (L + self.batch_size * S if self.keeps_inputs else L):
            return None
        if S and len(sizes) > 1 and not self.keeps_inputs:
            # record i+1 must begin at or after the end of sample i, for every i
            ends = start + np.cumsum(np.asarray(sizes[:-1], np.int64))
            if np.any(ends < L + S * np.arange(1, len(sizes))):
                return None
        return start


# NOTE [ batch buffer layout ]
# A buffer is [labels: int64 x B][samples: B x sample_shape][tail] (the labels region
# holds packed targets instead for "any" targets: NOTE [ target region ] in targets.py).  The reader packs a
# batch's encoded records so that they *end* where the buffer ends: they overlap the
# last samples.  The decoder handles record i before it writes sample i, and records
# i+1.. lie beyond the end of sample i (checked per batch by `input_start`; a batch
# that does not fit goes through the pipe instead), so a record is always read
# before its bytes are overwritten.  At 224 px float32 a sample is 602 KB and a JPEG
# ~110 KB, so the records need no room of their own: this saves ~33 MB per buffer
# (~130 MB of shared memory at 2 workers x 2 batches ahead).


def slot_views(buf: Any, spec: BatchSpec, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels[:n], samples[:n], the whole buffer as bytes) views into a batch buffer.

    The views hold an export of ``buf`` (``np.frombuffer``) for as long as they, or
    arrays and tensors made from them, live: a shared-memory buffer cannot be unmapped
    under them -- ``SharedMemory.close()`` raises BufferError instead (NOTE [ zero-copy
    batches ] in ``seqloader/loader.py``).  ``np.ndarray(buffer=...)`` does not hold one:
    closing the pool unmapped batches the caller still held, and reading them crashed."""
    B, L = spec.batch_size, spec.labels_nbytes
    whole = np.frombuffer(buf, np.uint8, count=spec.slot_nbytes)
    region = whole[:L].view(np.int64) if spec.target_kind == "class" else whole[:L]
    samples = whole[L:L + B * spec.sample_nbytes].view(spec.sample_dtype).reshape(
        B, *spec.sample_shape)
    return _targets.region_view(spec.target_kind, region, n), samples[:n], whole


@dataclass
class Batch:
    """One batch of :meth:`~seqloader.dataflow.mapbatch.MultiProcessMapAndBatchData.run`: batch ``index`` of its epoch
    as views of the buffer it was decoded into, valid until the next batch is asked for
    (unless the caller leases ``slot`` from the stage's ``pool``)."""

    #: its number in the epoch
    index: int
    #: the labels (int64), or for any targets the target region (NOTE [ target region ])
    labels: np.ndarray
    #: the decoded samples, ``[n, *sample_shape]``
    samples: np.ndarray
    #: the encoded images where they are the batch (``samples`` is then unused); else None
    raw: list[bytes] | None = None
    #: the worker pool's buffer holding it, or None (made in this process)
    slot: int | None = None
    #: the whole batch buffer (uint8) the samples' records lie in (NOTE [ GPU batches ]),
    #: or None
    whole: np.ndarray | None = None


def _stack(items: list, component: int = 0) -> Any:
    first = items[0]
    if isinstance(first, np.ndarray):
        shapes = {x.shape for x in items if isinstance(x, np.ndarray)}
        if len(shapes) > 1:
            raise ValueError(f"BatchData: component {component} of the datapoints has shapes "
                             f"{sorted(shapes)[:4]}{' ...' if len(shapes) > 4 else ''}; arrays "
                             "are stacked, so they need one shape -- end the map with a "
                             "fixed-size crop (e.g. RandomResizedCrop(224))")
        return np.stack(items)
    if isinstance(first, (int, float, np.number, bool)):
        return np.asarray(items)
    return list(items)


class BatchData(ProxyDataFlow):
    """Group ``batch_size`` datapoints; each component is stacked (arrays, numbers) or
    listed (bytes, objects).  ``remainder=True`` keeps a last smaller batch.

    Over a stage that follows :class:`~seqloader.dataflow.base.PlannedRecords` (the
    reader stages; NOTE [ planned stages ]) the batches are an epoch plan's: its
    :attr:`plan_spec` is the upstream's with this batch size and ``drop_last = not
    remainder`` (records a dropped last batch would hold are not read), and
    :meth:`batches` hands out the encoded records of each batch -- it then follows
    :class:`~seqloader.dataflow.base.PlannedBatches`."""

    def __init__(self, df: DataFlow, batch_size: int, remainder: bool = False):
        super().__init__(df)
        check_count("batch_size", batch_size, 1)
        self.batch_size, self.remainder = int(batch_size), remainder
        self.planned = "batches" if df.planned == "records" else None
        self.source = df.source if self.planned else None
        self.plan_spec = (dataclasses.replace(df.plan_spec, batch_size=self.batch_size,
                                              drop_last=not remainder)
                          if self.planned else None)

    def __len__(self) -> int:
        if self.planned:
            return num_batches(self.plan_spec)
        n = len(self.df)
        return math.ceil(n / self.batch_size) if self.remainder else n // self.batch_size

    def plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(self.plan_spec, epoch)

    def batches(self, plan: EpochPlan, first: int = 0, *, release: bool = True,
                stop: Any = None) -> Iterator[tuple[int, EncodedBatch]]:
        """Yield ``(j, [(index, value), ...])`` for batches ``j >= first`` of ``plan``.
        Values are zero-copy views, valid until :meth:`close`; use a batch before asking
        for the next (with ``release``, its pages are then unmapped; the values stay
        valid).  A caller that only copies values out with :meth:`copy_into` maps no
        pages and passes ``release=False``.  ``stop``: an Event that stops the reading
        (:class:`~seqloader.dataflow.feedthread.Stopped` is raised)."""
        sizes = plan.batch_sizes
        records = self.df.records(plan, sum(sizes[:first]), eager=sizes[0] if len(sizes) else 0,
                                  stop=stop)
        for j in range(first, len(sizes)):
            batch = [next(records) for _ in range(sizes[j])]
            yield j, batch
            if release:
                self.df.release([v for _, v in batch])  # used: NOTE [ mapped pages ]

    def copy_into(self, value: memoryview, out: Any) -> None:
        self.df.copy_into(value, out)

    def release(self, values: Any) -> None:
        self.df.release(values)

    def __iter__(self) -> Iterator[list]:
        if self.planned:
            return self.source.new_pass(self._planned)
        return self._grouped()

    def _planned(self, epoch: int) -> Iterator[list]:
        for _, batch in self.batches(self.plan(epoch)):
            recs = [msgpack.unpackb(v, raw=False) for _, v in batch]
            yield [[r["image"] for r in recs], np.asarray([r["label"] for r in recs])]

    def _grouped(self) -> Iterator[list]:
        buf: list = []
        for dp in self.df:
            buf.append(dp)
            if len(buf) == self.batch_size:
                yield [_stack(list(c), k) for k, c in enumerate(zip(*buf))]
                buf = []
        if buf and self.remainder:
            yield [_stack(list(c), k) for k, c in enumerate(zip(*buf))]

