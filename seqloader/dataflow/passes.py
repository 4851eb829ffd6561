"""One pass at a time: an iterator that a newer pass of the same source ends.

The Loader and :class:`~seqloader.dataflow.lmdbdata.LMDBData` serve one epoch at a time (their
workers or reader belong to it).  Starting a new pass ends the old one; the old
iterator's ``next()`` then raises RuntimeError -- it must not just stop, which would
look like a finished (short) epoch to whatever consumes it.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

__all__ = ["Pass"]


class Pass:
    """Wraps a generator; :meth:`end` with ``superseded`` makes ``next()`` raise
    RuntimeError(``message``) instead of StopIteration.  ``len()`` is ``length`` when
    given (a callable: its value at the time).  Not thread-safe."""

    __slots__ = ("_gen", "_len", "_message", "superseded", "__weakref__")

    def __init__(self, gen: Iterator, message: str,
                 length: int | Callable[[], int] | None = None) -> None:
        self._gen, self._message, self._len, self.superseded = gen, message, length, False

    def __iter__(self) -> "Pass":
        return self

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError("this pass has no known length")
        return self._len() if callable(self._len) else self._len

    def __next__(self) -> Any:
        if self.superseded:
            raise RuntimeError(self._message)
        return next(self._gen)

    def end(self, superseded: bool = True) -> None:
        """Stop the pass (closing its generator); ``superseded``: a newer pass ended it."""
        self.superseded = superseded
        self._gen.close()
