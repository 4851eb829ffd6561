"""A bounded, order-preserving parallel map over threads (:func:`thread_map`, for
work that releases the GIL: file reads, hashing)."""
from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["thread_map"]

T = TypeVar("T")
R = TypeVar("R")


def thread_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int,
                window: int | None = None) -> Iterator[R]:
    """Yield ``fn(item)`` for each item, in input order, computed by ``workers`` threads.

    At most ``window`` (default ``4 * workers``) results are in flight or waiting, so
    memory stays bounded however long ``items`` is.  An exception from ``fn`` is
    raised here, at that item's position.  Closing the generator early cancels work
    not yet started and waits for running calls (no thread outlives it).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    window = window or 4 * workers
    if workers == 1:
        yield from map(fn, items)
        return
    pending: collections.deque[Future[R]] = collections.deque()
    it = iter(items)
    with ThreadPoolExecutor(workers, thread_name_prefix="seqloader-io") as ex:
        try:
            for item in it:
                pending.append(ex.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
