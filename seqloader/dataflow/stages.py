"""Composable DataFlow stages, in the spirit of tensorpack's, with exact semantics.

The protocol: ``__iter__`` yields one **finite** epoch and calling it again starts
the next epoch; ``__len__`` is exact (or raises ``TypeError`` when unknowable);
``reset_state()`` must be called once, in the process that iterates, before the
first ``iter()`` (it opens files and builds generators: nothing fork-unsafe
happens in constructors, so a stage can be built in a parent and sent to a
worker).  Stages are not thread-safe and not reentrant: one iteration at a time.

``Loader`` does not stack these stages at run time (it fuses the same steps into
each worker, see :mod:`seqloader.dataflow.batch`); they are for composing your own
pipelines, with the names people know from tensorpack and the BayesWatch loader::

    df = LMDBData("lmdb/ILSVRC-train.lmdb", shuffle=True)
    df = LocallyShuffleData(df, 5000)
    df = MapDataComponent(df, decode_rgb, 0)
    df = MultiProcessMapData(df, 2, augment)
    df = BatchData(df, 256)
"""
from __future__ import annotations

import collections
import math
import multiprocessing as mp
import traceback
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import numpy as np

from ..read.database import open_database
from ..errors import WorkerError
from .passes import Pass
from ..read.plan import check_count, check_rank, chunk_order, make_chunks, rank_bounds, slice_ranges
from .batch import seed_global_rngs
from ..read.reader import RangeReader
from .shuffle import shuffled
from .threads import forking_single_threaded, prepare_worker

__all__ = ["DataFlow", "LMDBData", "LocallyShuffleData", "MapData", "MapDataComponent",
           "BatchData", "MultiProcessMapData"]


class DataFlow:
    """Base class: see the module docstring for the contract."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__} has no known length")

    def reset_state(self) -> None:
        """Prepare for iteration in this process (open files, seed generators)."""

    def close(self) -> None:
        """Release files, threads and processes, of this stage and those it reads from.
        Idempotent; iterating again needs :meth:`reset_state`."""


class ProxyDataFlow(DataFlow):
    def __init__(self, df: DataFlow):
        self.df = df

    def close(self) -> None:
        self.df.close()

    def __len__(self) -> int:
        return len(self.df)

    def reset_state(self) -> None:
        self.df.reset_state()


_SUPERSEDED = ("this LMDBData pass was ended by a new iter() of the same stage (stages are "
               "not reentrant): finish or drop a pass before starting the next, or use one "
               "LMDBData per concurrent pass")


class LMDBData(DataFlow):
    """Sequential reader of a seqloader database (one file or a shard set).

    Yields ``[image_bytes, label]`` per record.  Each epoch walks the file in
    contiguous chunks of ``chunk_size`` records, in an order drawn from
    (``seed``, epoch) when ``shuffle`` (file order otherwise); ``rank``/``world_size``
    take disjoint slices (equal sizes when ``even``).  ``io``: page cache or direct
    I/O, see :class:`~seqloader.read.reader.RangeReader`.  Reentrant: no.  Fork-safe:
    before ``reset_state`` only.
    """

    def __init__(self, path: str | Path, split: str | None = None, *, shuffle: bool = False,
                 chunk_size: int = 1024, seed: int = 0, rank: int = 0, world_size: int = 1,
                 even: bool = False, prefetch_bytes: int = 128 << 20, io: str = "auto"):
        for name, value, least in (("chunk_size", chunk_size, 1), ("world_size", world_size, 1),
                                   ("rank", rank, 0)):
            check_count(name, value, least)
        check_rank(rank, world_size)
        self.db = open_database(path, split)
        self.shuffle, self.chunk_size, self.seed = shuffle, chunk_size, seed
        self.rank, self.world_size, self.even = rank, world_size, even
        self.prefetch_bytes, self.io = prefetch_bytes, io
        self.epoch = 0
        self._reader: RangeReader | None = None
        self._pass: Pass | None = None  # the pass in progress

    def _bounds(self) -> tuple[int, int]:
        return rank_bounds(self.db.num_records, self.rank, self.world_size, even=self.even)

    def __len__(self) -> int:
        lo, hi = self._bounds()
        return hi - lo

    def reset_state(self) -> None:
        if self._reader is None:
            self._reader = RangeReader(self.db, prefetch_bytes=self.prefetch_bytes, io=self.io)
            # an LMDBData dropped without close() still returns its descriptors and thread
            self._closer = weakref.finalize(self, self._reader.close)

    def close(self) -> None:
        if self._reader is not None:
            self._closer()
            self._reader = None

    def __iter__(self) -> Iterator[list]:
        if self._reader is None:
            raise RuntimeError("call reset_state() in the iterating process before iterating")
        if self._pass is not None:  # one pass at a time: end an unfinished one (it held the
            self._pass.end()        # reader's buffers; direct I/O then waited forever)
        self._pass = Pass(self._records(), _SUPERSEDED)
        return self._pass

    def _records(self) -> Iterator[list]:
        chunks = make_chunks(self.db.shard_sizes, self.chunk_size)
        order = chunk_order(len(chunks), seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        self.epoch += 1
        lo, hi = self._bounds()
        ranges = slice_ranges([(int(a), int(b)) for a, b in chunks[order]], lo, hi)
        for _, value in self._reader.read(ranges):
            rec = msgpack.unpackb(value, raw=False)
            yield [rec["image"], rec["label"]]


class LocallyShuffleData(ProxyDataFlow):
    """Shuffle within a buffer of ``buffer_size`` datapoints (see NOTE [ local shuffle ]),
    seeded from (``seed``, epoch).  Memory: ``buffer_size`` datapoints."""

    def __init__(self, df: DataFlow, buffer_size: int, *, seed: int = 0, warmup: int | None = None):
        super().__init__(df)
        check_count("buffer_size", buffer_size, 1)
        self.buffer_size, self.seed, self.warmup = int(buffer_size), seed, warmup
        self.epoch = 0

    def __iter__(self) -> Iterator[Any]:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch]))
        self.epoch += 1
        yield from shuffled(self.df, self.buffer_size, rng, warmup=self.warmup)


class MapData(ProxyDataFlow):
    """Apply ``fn`` to each datapoint.  ``fn`` must not return None (no filtering here:
    lengths stay exact)."""

    def __init__(self, df: DataFlow, fn: Callable[[Any], Any]):
        super().__init__(df)
        self.fn = fn

    def __iter__(self) -> Iterator[Any]:
        for i, dp in enumerate(self.df):
            out = self.fn(dp)
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
    listed (bytes, objects).  ``remainder=True`` keeps a last smaller batch."""

    def __init__(self, df: DataFlow, batch_size: int, remainder: bool = False):
        super().__init__(df)
        check_count("batch_size", batch_size, 1)
        self.batch_size, self.remainder = int(batch_size), remainder

    def __len__(self) -> int:
        n = len(self.df)
        return math.ceil(n / self.batch_size) if self.remainder else n // self.batch_size

    def __iter__(self) -> Iterator[list]:
        buf: list = []
        for dp in self.df:
            buf.append(dp)
            if len(buf) == self.batch_size:
                yield [_stack(list(c), k) for k, c in enumerate(zip(*buf))]
                buf = []
        if buf and self.remainder:
            yield [_stack(list(c), k) for k, c in enumerate(zip(*buf))]


def _init_map_worker() -> None:
    prepare_worker()  # ignore Ctrl-C (the parent's), die with the parent, one thread


class MultiProcessMapData(ProxyDataFlow):
    """Apply ``fn`` to each datapoint in ``num_proc`` processes, keeping the order.

    Datapoints and results are pickled (use :class:`~seqloader.Loader` for the
    shared-memory batch path).  At most ``buffer_size`` datapoints are in flight.
    An exception in ``fn`` is raised here as :class:`WorkerError` naming the
    datapoint, chained to the worker's traceback; a killed worker raises at once
    (``BrokenProcessPool``), never hangs.  ``fn`` must be picklable for spawn.
    Processes start in ``reset_state`` and stop in :meth:`close` (or at exit), and die
    with this process.  Before each call the worker seeds the generators random
    transforms draw from -- seqloader's default one, ``random``, numpy's global one and
    torch's CPU one (when torch is loaded in the worker: forked workers have it if this
    process imported torch before ``reset_state()``) -- from ``(seed, epoch, datapoint
    index)``: results do not depend on which worker took a datapoint, and forked
    workers do not repeat each other's draws.
    """

    def __init__(self, df: DataFlow, num_proc: int, fn: Callable[[Any], Any], *,
                 buffer_size: int = 64, start_method: str | None = None, seed: int = 0):
        super().__init__(df)
        check_count("num_proc", num_proc, 1)
        check_count("buffer_size", buffer_size, 1)
        self.num_proc, self.buffer_size = int(num_proc), int(buffer_size)
        self.fn, self.seed, self.start_method = fn, seed, start_method
        self._epoch = 0
        self._ex: ProcessPoolExecutor | None = None

    def reset_state(self) -> None:
        super().reset_state()
        if self._ex is not None and getattr(self._ex, "_broken", False):  # a worker died
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None
        if self._ex is None:
            ctx = mp.get_context(self.start_method)
            self._ex = ProcessPoolExecutor(self.num_proc, ctx, initializer=_init_map_worker)
            with forking_single_threaded(ctx.get_start_method()):
                self._ex.submit(int).result()  # start the processes now, see the NOTE

    def __iter__(self) -> Iterator[Any]:
        if self._ex is None:
            raise RuntimeError("call reset_state() before iterating")
        pending: collections.deque[tuple[int, Future]] = collections.deque()
        epoch, self._epoch = self._epoch, self._epoch + 1

        def result(i: int, f: Future) -> Any:
            try:
                return f.result()
            except BrokenProcessPool as e:
                raise WorkerError(f"MultiProcessMapData: a worker process died with datapoints "
                                  f"{i}..{i + len(pending)} in flight ({e}); reset_state() "
                                  "starts a new pool") from e
            except Exception as e:
                raise WorkerError(f"MultiProcessMapData: {self.fn!r} failed on datapoint {i}: "
                                  f"{type(e).__name__}: {e}") from e
        try:
            for i, dp in enumerate(self.df):
                try:  # (a pool broken by a dead worker refuses new work here)
                    fut = self._ex.submit(_call_reporting, self.fn, dp, (self.seed, epoch, i))
                except Exception as e:
                    when = (f"while datapoints {pending[0][0]}..{i - 1} were in flight"
                            if pending else "earlier (the pool is broken)")
                    raise WorkerError(f"MultiProcessMapData: a worker process died {when} "
                                      f"({type(e).__name__}: {e}); reset_state() starts a new "
                                      "pool") from e
                pending.append((i, fut))
                if len(pending) >= self.buffer_size:
                    yield result(*pending.popleft())
            while pending:
                yield result(*pending.popleft())
        finally:
            for _, f in pending:
                f.cancel()

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None
        super().close()


def _call_reporting(fn: Callable[[Any], Any], dp: Any, key: tuple[int, int, int]) -> Any:
    """``fn(dp)`` in a worker, the generators seeded from ``key`` (seed, epoch, index); an
    exception comes back as a RuntimeError carrying its type, message and traceback --
    some exceptions cannot be pickled or rebuilt in the parent, which the pool would
    report as a dead worker."""
    from ..transforms.rng import seed_default
    ss = np.random.SeedSequence([*key, 3])
    seed_default(ss)
    seed_global_rngs(int(ss.generate_state(1)[0]))
    try:
        return fn(dp)
    except Exception as e:
        raise RuntimeError(f"{type(e).__name__}: {e}\n\nWorker traceback:\n"
                           f"{traceback.format_exc()}") from None
