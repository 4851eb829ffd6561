"""Bounded, order-preserving parallel maps: over threads (:func:`ordered_map`, for
work that releases the GIL: file reads, hashing) and over forked processes
(:func:`ordered_process_map`, for decoding), whose large results come back through
shared memory.
"""
from __future__ import annotations

import collections
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["ordered_map", "ordered_process_map"]

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int,
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


class _InArena(tuple):
    """Where a worker left a large ``bytes`` result: (slot, offset, length) in the arena."""


#: arena id -> its slots (shared anonymous mappings).  Set before the workers fork, so
#: they inherit the mappings: nothing has a name, nothing can leak in /dev/shm.  An
#: entry lives as long as its map.
_ARENAS: dict[int, list] = {}
_arena_ids = itertools.count()


def _apply(fn: Callable[[T], R], chunk: list[T], arena: int | None = None,
           slot: int = 0, min_bytes: int = 0) -> list[R]:
    """In a worker: ``fn`` over ``chunk``; ``bytes`` elements (of at least ``min_bytes``)
    of tuple results are written to the arena slot and replaced by :class:`_InArena`
    while they fit (NOTE [ results through shared memory ])."""
    if arena is None:
        return [fn(x) for x in chunk]
    buf, pos, out = _ARENAS[arena][slot], 0, []
    for x in chunk:
        r = fn(x)
        if isinstance(r, tuple):
            items = list(r)
            for k, v in enumerate(items):
                if type(v) is bytes and min_bytes <= len(v) <= len(buf) - pos:
                    buf[pos:pos + len(v)] = v
                    items[k] = _InArena((slot, pos, len(v)))
                    pos += len(v)
            r = tuple(items)
        out.append(r)
    return out


def _collect(results: list, slots: list) -> list:
    """In the parent: replace every :class:`_InArena` by a copy of its bytes."""
    out = []
    for r in results:
        if isinstance(r, tuple) and any(type(v) is _InArena for v in r):
            r = tuple(slots[v[0]][v[1]:v[1] + v[2]] if type(v) is _InArena else v for v in r)
        out.append(r)
    return out


# NOTE [ results through shared memory ]
# A forked worker's results come back pickled through one pipe that the executor's
# management thread in the parent reads: for ~100 KB of record per image that is
# four copies (pickle, pipe write, pipe read, unpickle), 64 KB pipe-sized syscalls
# and GIL time in the parent.  Instead, each chunk is given a slot of a shared
# anonymous mapping made before the fork: the worker writes the large ``bytes`` of
# its results there and sends only (slot, offset, length); the parent copies them
# out (one copy) and reuses the slot.  Measured on the writer's decode check (10,000
# images, 2 cores): 11 % less wall time when no bytes cross at all; the slots get
# nearly all of that.  A value larger than what is left of its slot goes by pipe.


def ordered_process_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int,
                        window: int | None = None, chunk: int = 16,
                        slot_bytes: int = 4 << 20, min_bytes: int = 4096) -> Iterator[R]:
    """Like :func:`ordered_map`, but in ``workers`` forked processes (for CPU-bound work
    that does not scale in threads: OpenCV's JPEG decoding gains only ~1.3x from a
    second thread here, ~1.8x from a second process).  ``fn`` must be a module-level
    function; state it needs is inherited through ``fork``.  Items go in chunks of ``chunk``
    (fewer round trips through the executor).  Results are pickled back, except the
    ``bytes`` elements (of at least ``min_bytes``) of tuple results, which come through
    shared memory (NOTE [ results through shared memory ]; ``slot_bytes`` per chunk in
    flight, ``slot_bytes=0`` to pickle everything).  An exception from ``fn`` is raised
    here with the worker's traceback as its cause; a killed worker raises
    ``BrokenProcessPool`` instead of hanging.  Not reentrant across threads."""
    import mmap
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from .threads import forking_single_threaded, prepare_worker

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    window = window or 2 * workers
    arena = next(_arena_ids) if slot_bytes > 0 else None
    slots = [mmap.mmap(-1, slot_bytes) for _ in range(window)] if arena is not None else []
    if arena is not None:
        _ARENAS[arena] = slots
    try:
        with forking_single_threaded("fork"):
            ex = ProcessPoolExecutor(workers, mp.get_context("fork"), initializer=prepare_worker)
            ex.submit(int).result()  # start every worker now, single-threaded
    except BaseException:
        _ARENAS.pop(arena, None)
        raise
    free = list(range(len(slots)))
    pending: collections.deque[tuple[Future[list[R]], int]] = collections.deque()
    it = iter(items)

    def take() -> list[R]:
        fut, slot = pending.popleft()
        if arena is None:
            return fut.result()
        out = _collect(fut.result(), slots)
        free.append(slot)
        return out

    try:
        while batch := list(itertools.islice(it, chunk)):
            slot = free.pop() if arena is not None else 0
            pending.append((ex.submit(_apply, fn, batch, arena, slot, min_bytes), slot))
            if len(pending) >= window:
                yield from take()
        while pending:
            yield from take()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        _ARENAS.pop(arena, None)  # kept until now: a worker forked late still finds it
        for m in slots:
            m.close()
