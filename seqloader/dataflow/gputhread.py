"""The decode thread of ``decode="gpu"`` and the byte budget of the images it decodes
(NOTE [ GPU stream ] in :mod:`seqloader.dataflow.gpudecode`)."""
from __future__ import annotations

import queue
import threading
import time
import warnings
from typing import Any, Callable, Iterator

import torch

__all__ = ["ByteBudget", "DecodeThread", "Stopped"]


class Stopped(Exception):
    """The decode thread was asked to stop while it waited."""


class ByteBudget:
    """Bytes of device memory that decoded, not yet rendered images may take: the decode
    thread acquires a part's bytes before decoding it, the rendering releases them.
    One part larger than the whole budget takes all of it (it runs alone)."""

    def __init__(self, total: int):
        self.total = int(total)
        self.free = self.total
        self._cond = threading.Condition()

    def size(self, nbytes: int) -> int:
        """What a part of ``nbytes`` acquires (and its rendering releases)."""
        return min(int(nbytes), self.total)

    def acquire(self, nbytes: int, timeout: float) -> bool:
        n = self.size(nbytes)
        with self._cond:
            if self.free < n:
                self._cond.wait(timeout)
            if self.free < n:
                return False
            self.free -= n
            return True

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.free = min(self.total, self.free + self.size(nbytes))
            self._cond.notify_all()


class DecodeThread(threading.Thread):
    """Iterates ``items`` and puts each part ``work(item, acquire)`` yields into a queue
    of one (NOTE [ GPU stream ]); ``acquire(nbytes)`` waits for ``budget``, polling the
    stop event.  The generator is iterated, and closed, in this thread only."""

    POLL = 0.1

    def __init__(self, items: Iterator[Any], work: Callable[..., Iterator[Any]], stream: Any,
                 budget: ByteBudget):
        super().__init__(name="seqloader-gpu-decode", daemon=True)
        self.items, self.work, self.stream, self.budget = items, work, stream, budget
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        self.stop = threading.Event()

    def _put(self, msg: tuple) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(msg, timeout=self.POLL)
                return True
            except queue.Full:
                continue
        return False

    def acquire(self, nbytes: int) -> None:
        while not self.budget.acquire(nbytes, self.POLL):
            if self.stop.is_set():
                raise Stopped()

    def run(self) -> None:
        if self.stream is not None:
            torch.cuda.set_stream(self.stream)  # (this thread's current stream)
        try:
            for item in self.items:
                for part in self.work(item, self.acquire):
                    if not self._put(("part", part)):
                        return
                del item
            self._put(("end",))
        except Stopped:
            return
        except BaseException as e:  # raised in the caller's thread
            self._put(("error", e))
        finally:
            close = getattr(self.items, "close", None)
            if close is not None:
                close()

    def results(self) -> Iterator[Any]:
        """What the thread decoded, in order; its error raised here."""
        while True:
            try:
                msg = self.queue.get(timeout=self.POLL)
            except queue.Empty:
                if not self.is_alive() and self.queue.empty():
                    raise RuntimeError("the GPU decode thread ended without a word") from None
                continue
            if msg[0] == "end":
                return
            if msg[0] == "error":
                raise msg[1]
            yield msg[1]

    def close(self, timeout: float = 60) -> None:
        """Stop and join the thread (it closes the workers' epoch on its way out); warn
        if it is still waiting for a worker after ``timeout`` s (the Loader's ``timeout``
        bounds that wait)."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                pass
            self.join(self.POLL)
        if self.is_alive():
            warnings.warn(f"the GPU decode thread did not stop within {timeout:.0f} s (a worker "
                          "stuck in its batch? set the Loader's timeout=)", stacklevel=2)
