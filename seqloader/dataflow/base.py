"""The DataFlow protocol, in the spirit of tensorpack's, with exact semantics.

``__iter__`` yields one **finite** epoch and calling it again starts the next epoch;
``__len__`` is exact (or raises ``TypeError`` when unknowable); ``reset_state()`` must be
called once, in the process that iterates, before the first ``iter()`` (it opens files
and builds generators: nothing fork-unsafe happens in constructors, so a stage can be
built in a parent and sent to a worker).  Stages are not thread-safe and not reentrant:
one iteration at a time.

NOTE [ planned stages ]
The reader stages -- :class:`~seqloader.dataflow.reading.LMDBData`,
:class:`~seqloader.dataflow.reading.LocallyShuffleData` over it,
:class:`~seqloader.dataflow.stages.BatchData` over either and
:class:`~seqloader.dataflow.mapbatch.MultiProcessMapAndBatchData` over that -- share
one epoch plan (:func:`~seqloader.read.plan.plan_epoch`), owned by the ``LMDBData`` at
the root (their ``source``): ``BatchData`` sets its batch size and ``drop_last`` rule,
the map-and-batch stage its worker count.  Besides their public datapoints they pass
*encoded records* ``(index, memoryview)`` down with ``records(plan, skip, eager,
stop)`` and ``batches(plan, first, ...)``, which the Loader uses: a pipeline of these
stages composed by hand yields the Loader's order for the same seed, epoch and rank.
"""
from __future__ import annotations

from typing import Any, Iterator

__all__ = ["DataFlow", "ProxyDataFlow"]


class DataFlow:
    """Base class: see the module docstring for the contract."""

    #: the LMDBData whose plan this stage follows (NOTE [ planned stages ]), or None
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
