"""The public DataFlow stages, in the spirit of tensorpack's, with exact semantics
(the protocol: :mod:`seqloader.dataflow.base`).

The Loader is a pipeline of these stages (NOTE [ planned stages ]); composed by hand
they give its order for the same seed, epoch and rank::

    df = LMDBData("lmdb/ILSVRC-train.lmdb", shuffle=True, even=True)
    df = LocallyShuffleData(df, 5000)
    df = BatchData(df, 256)
    df = MultiProcessMapAndBatchData(df, 4, transform)   # = Loader(..., shuffle=True)

or, datapoint by datapoint, with the names people know from tensorpack::

    df = MapDataComponent(LocallyShuffleData(LMDBData(path, shuffle=True), 5000), decode_rgb, 0)
    df = BatchData(MultiProcessMapData(df, 2, augment), 256)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator

import msgpack
import numpy as np

from ..errors import RecordError
from ..read.plan import EpochPlan, check_count, num_batches, plan_epoch
from .base import DataFlow, ProxyDataFlow
from .imap import MultiProcessMapData
from .mapbatch import MultiProcessMapAndBatchData
from .reading import LMDBData, LocallyShuffleData

__all__ = ["DataFlow", "LMDBData", "LocallyShuffleData", "MapData", "MapDataComponent",
           "BatchData", "MultiProcessMapData", "MultiProcessMapAndBatchData"]

EncodedBatch = list[tuple[int, memoryview]]


class MapData(ProxyDataFlow):
    """Apply ``fn`` to each datapoint.  ``fn`` must not return None (no filtering here:
    lengths stay exact).  An exception in ``fn`` raises
    :class:`~seqloader.errors.RecordError` naming the datapoint, as
    :class:`MultiProcessMapData` does (NOTE [ one error contract ])."""

    def __init__(self, df: DataFlow, fn: Callable[[Any], Any]):
        super().__init__(df)
        self.fn = fn

    def __iter__(self) -> Iterator[Any]:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        for i, dp in enumerate(self.df):
            try:
                out = self.fn(dp)
            except Exception as e:
                raise RecordError.of(e, i, where=f"{type(self).__name__}: {name} failed on "
                                                 f"datapoint {i}") from e
            if out is None:
                raise ValueError(f"{self.fn!r} returned None for datapoint {i}; MapData keeps "
                                 "lengths exact and does not filter")
            yield out


class MapDataComponent(MapData):
    """Apply ``fn`` to component ``index`` of each (list) datapoint."""

    def __init__(self, df: DataFlow, fn: Callable[[Any], Any], index: int = 0):
        def apply(dp: Any) -> Any:
            dp = list(dp)
            dp[index] = fn(dp[index])
            return dp
        super().__init__(df, apply)
        self.component_fn, self.index = fn, index


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

