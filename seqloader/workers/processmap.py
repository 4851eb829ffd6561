"""An ordered map over worker processes (:class:`ProcessMap`), for the DataFlow map
stage (:class:`~seqloader.dataflow.stages.MultiProcessMapData`), the writer's decode checks and ``verify``; on the
same :class:`~seqloader.workers.processgroup.ProcessGroup` as the Loader's pool, so with its
shutdown protocol and error contract (NOTE [ pool shutdown ], NOTE [ one error
contract ]).

A feed thread sends chunks of items round-robin (chunk ``s`` to worker ``s % W``; at
most ``window`` chunks in flight) while the caller receives the results in order: the
pipes are read while they are written, so large items and results cannot deadlock.
"""
from __future__ import annotations

import mmap
import queue
import threading
import traceback
from typing import Any, Callable, Iterable, Iterator, TypeVar

from ..errors import RecordError
from .arena import ARENAS, InArena, arena_ids, collect
from .processgroup import ProcessGroup, kill, serve
from .threads import prepare_worker

__all__ = ["ProcessMap", "process_map", "named_errors"]

T = TypeVar("T")
R = TypeVar("R")
Where = Callable[[Any], "tuple[int, Any]"]


def named_errors(fn: Callable[[T], R], where: Where) -> Callable[[T], R]:
    """``fn``, raising :class:`RecordError` (index and path from ``where(item)``) for an
    exception: what a worker of :class:`ProcessMap` reports, for work in this process."""
    def call(item: T) -> R:
        try:
            return fn(item)
        except Exception as e:
            index, path = where(item)
            raise RecordError.of(e, index, path) from e
    return call


def _map_worker(fn: Callable, arena: int | None, min_bytes: int, conn: Any, main_pid: int) -> None:
    prepare_worker()

    def handle(msg: tuple) -> None:
        _, seq, slot, items = msg
        buf = ARENAS[arena][slot] if arena is not None else None
        pos, out = 0, []
        for k, x in enumerate(items):
            try:
                r = fn(x)
                if buf is not None and isinstance(r, tuple):  # NOTE [ results through
                    r, pos = _to_arena(r, buf, slot, pos, min_bytes)  # shared memory ]
                out.append(r)
            except Exception as e:
                conn.send(("error", seq, k, type(e).__name__, str(e), traceback.format_exc()))
                return
        try:
            conn.send(("done", seq, out))
        except Exception as e:  # (a result that cannot be pickled)
            conn.send(("error", seq, 0, type(e).__name__, str(e), traceback.format_exc()))
    serve(conn, main_pid, handle)


def _to_arena(r: tuple, buf: Any, slot: int, pos: int, min_bytes: int) -> tuple[tuple, int]:
    items = list(r)
    for k, v in enumerate(items):
        if type(v) is bytes and min_bytes <= len(v) <= len(buf) - pos:
            buf[pos:pos + len(v)] = v
            items[k] = InArena((slot, pos, len(v)))
            pos += len(v)
    return tuple(items), pos


class _Feed(threading.Thread):
    """Sends the chunks of ``items`` to the workers, at most ``window`` in flight."""

    def __init__(self, pm: "ProcessMap", items: Iterable, sent: "queue.Queue"):
        super().__init__(name="seqloader-map-feed", daemon=True)
        self.pm, self.items, self.sent = pm, items, sent
        self.stop = threading.Event()
        self.error: tuple[BaseException, str] | None = None

    def run(self) -> None:
        pm, it = self.pm, iter(self.items)
        try:
            seq = 0
            while not self.stop.is_set():
                chunk = [x for _, x in zip(range(pm.chunk), it)]
                if not chunk:
                    break
                slot = None
                while slot is None and not self.stop.is_set():
                    try:
                        slot = pm.free.get(timeout=0.2)
                    except queue.Empty:
                        pass
                if slot is None:
                    return
                self.sent.put((seq, chunk, slot))
                pm.group.send(seq % pm.group.num_workers, ("chunk", seq, slot, chunk))
                seq += 1
        except BaseException as e:  # reported by the consumer, with this traceback
            self.error = (e, traceback.format_exc())
        finally:
            self.sent.put(None)


class ProcessMap:
    """Ordered ``fn(item)`` in ``workers`` processes; start with :meth:`start` (or the
    first :meth:`map`), stop with :meth:`close`.

    ``fn`` must be picklable for spawn/forkserver; with fork (the default) state it
    needs is inherited.  Results are pickled back, except the ``bytes`` elements (of at
    least ``min_bytes``) of tuple results, which come through shared memory with fork
    (NOTE [ results through shared memory ]; ``slot_bytes`` per chunk in flight, 0 to
    pickle everything).  An exception from ``fn`` raises :class:`RecordError` (the index
    and path from ``where(item)``, default: the item's position; named as ``what``
    says) from the worker's
    traceback; a dead worker raises :class:`~seqloader.errors.WorkerDiedError`, a silent
    one (``timeout`` s) :class:`~seqloader.errors.WorkerTimeoutError`."""

    def __init__(self, fn: Callable[[Any], Any], workers: int, *, window: int | None = None,
                 chunk: int = 16, slot_bytes: int = 4 << 20, min_bytes: int = 4096,
                 where: Where | None = None, start_method: str | None = "fork",
                 timeout: float = 0, what: str = "record {index}"):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.fn, self.chunk, self.where, self.timeout = fn, chunk, where, timeout
        self.what = what  # how an error names the item (format with index)
        self.window, self.min_bytes = window or 2 * workers, min_bytes
        self.group = ProcessGroup(workers, start_method=start_method, name="seqloader map worker")
        fork = self.group.ctx.get_start_method() == "fork"
        self.slot_bytes = slot_bytes if fork else 0
        self.arena: int | None = None
        self.free: queue.Queue[int] = queue.Queue()

    def start(self) -> None:
        if self.group.started:
            return
        self.close()
        if self.slot_bytes > 0:
            self.arena = next(arena_ids)
            ARENAS[self.arena] = [mmap.mmap(-1, self.slot_bytes) for _ in range(self.window)]
        self.free = queue.Queue()
        for s in range(self.window):
            self.free.put(s)
        self.group.start(_map_worker, lambda w: (self.fn, self.arena, self.min_bytes))

    def map(self, items: Iterable[Any], first: int = 0) -> Iterator[Any]:
        """``fn(item)`` for each item, in order; ``first``: the position of the first item
        (for the default ``where``).  Ending it early stops the workers (the next
        :meth:`map` starts new ones)."""
        self.start()
        sent: queue.Queue = queue.Queue()
        feed = _Feed(self, items, sent)
        feed.start()
        done = False
        try:
            pos = first
            while True:
                entry = self._next_sent(sent, feed)
                if entry is None:
                    break
                seq, chunk, slot = entry
                w = seq % self.group.num_workers
                msg = self.group.recv(w, self.timeout, f"chunk {seq}",
                                      check=lambda: self._check(feed))
                if msg[0] == "error":
                    _, _, k, exc_type, exc_message, tb = msg
                    index, path = self.where(chunk[k]) if self.where else (pos + k, None)
                    where = self.what.format(index=index) + (f" ({path})" if path else "")
                    err = RecordError(f"{where}: {exc_type}: {exc_message}", index, tb, path=path,
                                      exc_type=exc_type, exc_message=exc_message)
                    raise err.in_worker(w, self.group.pid(w)) from err.remote_cause()
                out = msg[2]
                if self.arena is not None:
                    out = collect(out, ARENAS[self.arena])
                self.free.put(slot)
                pos += len(chunk)
                yield from out
            self._check(feed)
            done = True
        finally:
            feed.stop.set()
            if not done:  # (workers may hold queued chunks: a new map starts afresh)
                kill(self.group.procs)
            feed.join(30)
            if not done:
                self.close(force=True)

    def _next_sent(self, sent: queue.Queue, feed: _Feed) -> Any:
        while True:
            try:
                return sent.get(timeout=1.0)
            except queue.Empty:
                self._check(feed)

    @staticmethod
    def _check(feed: _Feed) -> None:
        if feed.error is not None:  # the caller's own iterator failed: its exception,
            err, _ = feed.error        # unchanged (it names its input; the traceback is kept)
            raise err

    def close(self, force: bool = False) -> None:
        """NOTE [ pool shutdown ].  Idempotent."""
        self.group.close(force)
        if self.arena is not None:
            for m in ARENAS.pop(self.arena, []):
                m.close()
            self.arena = None


def process_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int,
                window: int | None = None, chunk: int = 16, slot_bytes: int = 4 << 20,
                min_bytes: int = 4096, where: Where | None = None) -> Iterator[R]:
    """``fn(item)`` for each item, in order, in ``workers`` forked processes started for
    this call (CPU-bound work that does not scale in threads: OpenCV's JPEG decoding
    gains ~1.3x from a second thread, ~1.8x from a second process); see
    :class:`ProcessMap`."""
    pm = ProcessMap(fn, workers, window=window, chunk=chunk, slot_bytes=slot_bytes,
                    min_bytes=min_bytes, where=where)
    try:
        yield from pm.map(items)
    finally:
        pm.close()
