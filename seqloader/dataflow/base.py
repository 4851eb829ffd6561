"""The DataFlow protocol, in the spirit of tensorpack's, with exact semantics.

``__iter__`` yields one **finite** epoch and calling it again starts the next epoch;
``__len__`` is exact (or raises ``TypeError`` when unknowable); ``reset_state()`` must be
called once, in the process that iterates, before the first ``iter()`` (it opens files
and builds generators: nothing fork-unsafe happens in constructors, so a stage can be
built in a parent and sent to a worker).  Stages are not thread-safe and not reentrant:
one iteration at a time.

NOTE [ planned stages ]
The reader stages -- :class:`~seqloader.dataflow.lmdbdata.LMDBData`,
:class:`~seqloader.dataflow.shuffle.LocallyShuffleData` over it,
:class:`~seqloader.dataflow.batch.BatchData` over either and
:class:`~seqloader.dataflow.mapbatch.MultiProcessMapAndBatchData` over that -- follow
one epoch plan (:func:`~seqloader.read.plan.plan_epoch`).  Each fixes its part of the
plan when it is built and never changes its upstream: ``LMDBData`` the records (split,
chunks, seed, rank); ``BatchData`` adds its batch size and ``drop_last`` rule; the
map-and-batch stage its worker count.  Each has its own :attr:`plan_spec`, and the
downstream stage's plan is the one handed up (``records(plan, ...)``), so every stage
reads what the last one asked for.  Besides their public datapoints they pass *encoded
records* ``(index, memoryview)`` down: a stage says which of the two protocols below it
follows by :attr:`DataFlow.planned` -- ``"records"`` (:class:`PlannedRecords`) or
``"batches"`` (:class:`PlannedBatches`) -- and a stage written by a user either follows
one (and says so) or is a plain DataFlow (``planned = None``), which the planned stages
treat as any datapoint source.  The passes of a pipeline are counted by its root
``LMDBData`` (:attr:`DataFlow.source`): one pass at a time, each ``iter()`` of any stage
the next epoch.  A pipeline of these stages composed by hand yields the Loader's order
for the same seed, epoch and rank.
"""
from __future__ import annotations

from typing import Any, Iterator, Literal, Protocol, Sequence

from ..read.plan import EpochPlan, PlanSpec

__all__ = ["DataFlow", "ProxyDataFlow", "PlannedRecords", "PlannedBatches", "Records"]

#: ``(global record index, encoded record)`` in stream order
Records = Iterator[tuple[int, memoryview]]


class DataFlow:
    """Base class: see the module docstring for the contract."""

    #: the protocol this stage follows besides its datapoints (NOTE [ planned stages ]):
    #: ``"records"`` (:class:`PlannedRecords`), ``"batches"`` (:class:`PlannedBatches`), or
    #: None for a plain DataFlow
    planned: Literal["records", "batches"] | None = None
    #: the root ``LMDBData`` of a planned stage's pipeline (it counts the passes), or None
    source: Any = None

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


class PlannedRecords(Protocol):
    """A stage that yields the encoded records of an epoch plan (``planned ==
    "records"``): :class:`~seqloader.dataflow.lmdbdata.LMDBData` and
    :class:`~seqloader.dataflow.shuffle.LocallyShuffleData` over it
    (NOTE [ planned stages ])."""

    #: ``"records"``
    planned: Literal["records"]
    #: the root reader stage (an ``LMDBData``): the database, its reader, the passes
    source: Any
    #: this stage's part of the plan (batch size 1: records)
    plan_spec: PlanSpec

    def records(self, plan: EpochPlan, skip: int = 0, eager: int = 0,
                stop: Any = None) -> Records:
        """The records of ``plan`` (made by the stage downstream, from its own spec) in
        this stage's output order, minus the first ``skip``; ``eager``: the first
        batch's size (NOTE [ local shuffle ]); raise
        :class:`~seqloader.dataflow.feedthread.Stopped` once the Event ``stop`` is set.
        Values are zero-copy views, valid until ``close``."""
        ...

    def copy_into(self, value: memoryview, out: Any) -> None:
        """Copy a value :meth:`records` yielded into ``out`` without mapping its pages."""
        ...

    def release(self, values: Sequence[memoryview]) -> None:
        """The values are used: drop their mapped pages (NOTE [ mapped pages ])."""
        ...


class PlannedBatches(Protocol):
    """A stage that cuts the plan's records into its batches (``planned ==
    "batches"``): :class:`~seqloader.dataflow.batch.BatchData` over a
    :class:`PlannedRecords` stage.  What
    :class:`~seqloader.dataflow.mapbatch.MultiProcessMapAndBatchData` and the worker
    pool's feed thread read."""

    #: ``"batches"``
    planned: Literal["batches"]
    #: the root reader stage, as for :class:`PlannedRecords`
    source: Any
    #: the plan of its batches (batch size, ``drop_last``)
    plan_spec: PlanSpec

    def plan(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` by :attr:`plan_spec` -- pure, no I/O."""
        ...

    def batches(self, plan: EpochPlan, first: int = 0, *, release: bool = True,
                stop: Any = None) -> Iterator[tuple[int, list[tuple[int, memoryview]]]]:
        """``(j, [(index, value), ...])`` for batches ``j >= first`` of ``plan``."""
        ...

    def copy_into(self, value: memoryview, out: Any) -> None:
        ...

    def release(self, values: Sequence[memoryview]) -> None:
        ...
