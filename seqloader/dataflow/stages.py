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

from typing import Any, Callable, Iterator

import numpy as np

from ..errors import RecordError
from ..read.plan import check_count
from ..workers.processmap import ProcessMap
from .base import DataFlow, ProxyDataFlow
from .batch import BatchData
from .decode import seed_global_rngs
from .mapbatch import MultiProcessMapAndBatchData
from .lmdbdata import LMDBData
from .shuffle import LocallyShuffleData

__all__ = ["DataFlow", "LMDBData", "LocallyShuffleData", "MapData", "MapDataComponent",
           "BatchData", "MultiProcessMapData", "MultiProcessMapAndBatchData"]

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


class _Seeded:
    """``fn(dp)`` for ``(i, dp)`` with the generators seeded from (seed, epoch, i)."""

    def __init__(self, fn: Callable[[Any], Any], seed: int):
        self.fn, self.seed, self.epoch = fn, seed, 0

    def __call__(self, item: tuple[int, int, Any]) -> Any:
        from ..transforms.rng import seed_default

        epoch, i, dp = item
        ss = np.random.SeedSequence([self.seed, epoch, i, 3])
        seed_default(ss)
        seed_global_rngs(int(ss.generate_state(1)[0]))
        return self.fn(dp)


def _datapoint(item: tuple[int, int, Any]) -> tuple[int, None]:
    return item[1], None


class MultiProcessMapData(ProxyDataFlow):
    """Apply ``fn`` to each datapoint in ``num_proc`` processes, keeping the order.

    Datapoints and results are pickled (use :class:`MultiProcessMapAndBatchData` for the
    shared-memory batch path).  At most ``buffer_size`` datapoints are in flight.  An
    exception in ``fn`` raises :class:`~seqloader.errors.RecordError` naming the
    datapoint (``index``), chained to the worker's traceback; a killed worker raises
    :class:`~seqloader.errors.WorkerDiedError` at once, never hangs, and the next
    iteration starts new processes.  ``fn`` must be picklable for spawn.  Processes
    start in ``reset_state`` and stop in :meth:`close` (or at exit), and die with this
    process.  Before each call the worker seeds the generators random transforms draw
    from -- seqloader's default one, ``random``, numpy's global one and torch's CPU one
    (when torch is loaded in the worker) -- from ``(seed, epoch, datapoint index)``:
    results do not depend on which worker took a datapoint."""

    def __init__(self, df: DataFlow, num_proc: int, fn: Callable[[Any], Any], *,
                 buffer_size: int = 64, start_method: str | None = None, seed: int = 0):
        super().__init__(df)
        check_count("num_proc", num_proc, 1)
        check_count("buffer_size", buffer_size, 1)
        self.num_proc, self.buffer_size = int(num_proc), int(buffer_size)
        self.fn, self.seed, self.start_method = fn, seed, start_method
        self._epoch = 0
        self._pm: ProcessMap | None = None

    def reset_state(self) -> None:
        super().reset_state()
        if self._pm is not None and not self._pm.group.started:  # a worker died: anew
            self._pm = None
        if self._pm is None:
            window = max(1, -(-self.buffer_size // 4))
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            self._pm = ProcessMap(_Seeded(self.fn, self.seed), self.num_proc, window=window,
                                  chunk=min(4, self.buffer_size), slot_bytes=0,
                                  start_method=self.start_method, where=_datapoint,
                                  what=f"MultiProcessMapData: {name} failed on datapoint {{index}}")
        self._pm.start()

    def __iter__(self) -> Iterator[Any]:
        if self._pm is None:
            raise RuntimeError("call reset_state() before iterating")
        epoch, self._epoch = self._epoch, self._epoch + 1
        yield from self._pm.map((epoch, i, dp) for i, dp in enumerate(self.df))

    def close(self) -> None:
        if self._pm is not None:
            self._pm.close()
            self._pm = None
        super().close()
