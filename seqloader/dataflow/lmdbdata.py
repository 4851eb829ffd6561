"""The reader stage: :class:`LMDBData`, the plan-driven sequential reader of a database's
encoded records (NOTE [ planned stages ]); its local shuffle is
:class:`~seqloader.dataflow.shuffle.LocallyShuffleData`.

NOTE [ one reader per rank ]
Each rank has exactly one reader, which walks its slice of the file in order and
hands encoded records to the decode workers; workers never touch the disk.
Measured under hddsim (a 2 GB LMDB, 100 IO/s, 150 MiB/s; docs/how-it-works.md):
one sequential reader reaches ~98 % of the disk's bandwidth, while 2 and 4 workers
each reading their own interleaved batches got 80 % and 65 % -- every reader's
stream restarts the kernel's readahead and costs extra requests (and, on a real
disk, seeks).  A single reader also gives a *rank-wide* shuffle buffer (better
mixing than one small buffer per worker) and an order that does not depend on
the number of workers.
"""
from __future__ import annotations

import itertools
import weakref
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgpack

from ..read.database import Database, open_database
from ..read.plan import (DEFAULT_CHUNK, EpochPlan, PlanSpec, check_count, check_rank, plan_epoch,
                         rank_bounds, skip_ranges)
from ..read.reader import RangeReader
from .base import DataFlow, Records
from .feedthread import Stopped
from .passes import Pass

__all__ = ["LMDBData", "unpacked_records", "SHORT"]

#: NOTE [ short ranges ]
#: The rest of a resumed epoch (:mod:`seqloader.dataflow.remainder`) holds the records
#: that were in the old ranks' shuffle buffers: thousands of single records a few apart.
#: The sequential reader costs ~1.5 ms per range (its read-ahead and unmapping work per
#: part): read one range each, they made the first batch of a rest 0.7 s instead of
#: 0.2 s.  Ranges shorter than ``SHORT`` records are read record by record instead, by
#: random access, as a same-settings resume refills its buffer; the long runs around
#: them (whole chunks) stream as before.  Same records, same order: only the I/O path.
#: Only there: an epoch's own plan, and a remote database (whose sequential reads check
#: each record on arrival and batch many into one GET), always stream.
SHORT = 16


def unpacked_records(records: Records) -> Iterator[list]:
    """``[image, label]`` of each ``(index, value)`` record: the datapoints of a pass."""
    for _, value in records:
        rec = msgpack.unpackb(value, raw=False)
        yield [rec["image"], rec["label"]]


_SUPERSEDED = ("this LMDBData pass was ended by a new iter() of the same stage (stages are "
               "not reentrant): finish or drop a pass before starting the next, or use one "
               "LMDBData per concurrent pass")


class LMDBData(DataFlow):
    """Sequential reader of a seqloader database (one file or a shard set), driven by
    the epoch plan (NOTE [ the epoch plan ] in :mod:`seqloader.read.plan`).

    Yields ``[image_bytes, label]`` per record.  Each epoch walks the file in
    contiguous chunks of ``chunk_size`` records, in an order drawn from
    (``seed``, epoch) when ``shuffle`` (file order otherwise); ``rank``/``world_size``
    take disjoint slices (equal sizes when ``even``; default: when ``shuffle``, the
    Loader's rule).  ``io``: page cache or direct
    I/O, see :class:`~seqloader.read.reader.RangeReader`.  ``path`` may also be an
    open :class:`~seqloader.read.database.Database`.  Each ``iter()`` (of this or any stage
    of its pipeline) is the next epoch, :attr:`epoch` (settable).  Reentrant: no.  Fork-safe: before ``reset_state`` only.
    """

    def __init__(self, path: str | Path | Database, split: str | None = None, *,
                 shuffle: bool = False, chunk_size: int = DEFAULT_CHUNK, seed: int = 0,
                 rank: int = 0, world_size: int = 1, even: bool | None = None,
                 prefetch_bytes: int = 128 << 20, io: str = "auto", fault_in: bool = True):
        for name, value, least in (("chunk_size", chunk_size, 1), ("world_size", world_size, 1),
                                   ("rank", rank, 0), ("seed", seed, 0)):
            check_count(name, value, least)
        check_rank(rank, world_size)
        self.db = path if isinstance(path, Database) else open_database(path, split)
        #: the records' plan (batch size 1; the stages downstream add their batching)
        self.plan_spec = PlanSpec(self.db.shard_sizes, 1, chunk_size, shuffle, False, seed,
                                  rank, world_size, 1, shuffle if even is None else even)
        self.prefetch_bytes, self.io, self.fault_in = prefetch_bytes, io, fault_in
        self.epoch = 0
        self.source = self
        self._reader: RangeReader | None = None
        self._pass: Pass | None = None  # the pass in progress

    planned = "records"

    # the plan's settings, read-only
    shuffle = property(lambda self: self.plan_spec.shuffle)
    seed = property(lambda self: self.plan_spec.seed)
    rank = property(lambda self: self.plan_spec.rank)
    world_size = property(lambda self: self.plan_spec.world_size)
    chunk_size = property(lambda self: self.plan_spec.chunk_size)
    even = property(lambda self: self.plan_spec.even)

    def plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(self.plan_spec, epoch)

    def next_epoch(self) -> int:
        """The epoch of the next ``iter()`` of any stage of this pipeline, counted."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        return epoch

    def __len__(self) -> int:
        s = self.plan_spec
        lo, hi = rank_bounds(s.num_records, s.rank, s.world_size, even=s.even)
        return hi - lo

    def reset_state(self) -> None:
        if self._reader is None:
            self._reader = RangeReader(self.db, prefetch_bytes=self.prefetch_bytes,
                                       fault_in=self.fault_in, io=self.io)
            # an LMDBData dropped without close() still returns its descriptors and thread
            self._closer = weakref.finalize(self, self._reader.close)

    def close(self) -> None:
        if self._reader is not None:
            self._closer()
            self._reader = None

    @property
    def reader(self) -> RangeReader:
        if self._reader is None:
            raise RuntimeError("call reset_state() in the iterating process before iterating")
        return self._reader

    # ---------------------------------------------------- encoded records
    def read(self, ranges: Sequence[tuple[int, int]], stop: Any = None, *,
             short: int = 0) -> Records:
        """``(index, value)`` of the records of ``ranges``, in order; values are zero-copy
        views, valid until :meth:`close`.  Raises :class:`Stopped` once ``stop`` is set.
        Ranges of fewer than ``short`` records are read one record at a time (NOTE
        [ short ranges ]: :meth:`short_for` a plan)."""
        for long, group in itertools.groupby(ranges, key=lambda r: r[1] - r[0] >= short):
            stream = (self.reader.read(list(group)) if long
                      else ((i, self.reader.get(i)) for a, b in group for i in range(a, b)))
            for rec in stream:
                if stop is not None and stop.is_set():
                    raise Stopped()
                yield rec

    def records(self, plan: EpochPlan, skip: int = 0, eager: int = 0, stop: Any = None) -> Records:
        """The plan's records in file order, minus the first ``skip``."""
        return self.read(skip_ranges(plan.ranges, skip), stop, short=self.short_for(plan))

    def short_for(self, plan: EpochPlan) -> int:
        """Ranges of ``plan`` shorter than this are read record by record: ``SHORT`` in the
        rest of a resumed epoch from a local database, else 0 (NOTE [ short ranges ])."""
        return SHORT if plan.segment and self.db.remote is None else 0

    def get(self, index: int) -> memoryview:
        return self.reader.get(index)

    def copy_into(self, value: memoryview, out: Any) -> None:
        self.reader.copy_into(value, out)

    def release(self, values: Sequence[memoryview]) -> None:
        self.reader.release(values)

    def new_pass(self, make: Any) -> Pass:
        """A pass of the next epoch over this source, ``make(epoch)``'s generator; it
        ends the pass in progress, of any stage of the pipeline (one pass at a time: an
        unfinished one holds the reader's buffers; direct I/O then waited forever)."""
        self.reader  # (raises before reset_state)
        if self._pass is not None:
            self._pass.end()
        self._pass = Pass(make(self.next_epoch()), _SUPERSEDED)
        return self._pass

    def __iter__(self) -> Iterator[list]:
        return self.new_pass(lambda epoch: unpacked_records(self.records(self.plan(epoch))))
