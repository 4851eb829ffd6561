"""A seeded reshuffle of copied records with sequential I/O only: the external shuffle
of the writer (NOTE [ external shuffle ] in ``seqloader/write/extshuffle.py``) over
stored record values instead of source images.

Record ``i`` of the input (the concatenation of the sources, in order) gets the key
:func:`~seqloader.write.extshuffle.record_keys` ``(seed, identity)[i]``; the output
order is the records sorted by (key, i): a uniform permutation fixed by the seed and
the inputs alone.  Pass 1 reads the inputs once, front to back, appending each value
to the bucket of its key range (in memory when they fit ``memory_budget``, else files
in ``scratch``); pass 2 reads one bucket at a time whole, and hands its values on in
key order.  An interrupted run starts pass 1 again (the scratch folder is discarded);
the shard files it had finished are kept and skipped.
"""
from __future__ import annotations

import io
import math
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ...progress import progress_bar
from ...write.buckets import FRAME, bucket_frames
from ...write.extshuffle import record_keys

__all__ = ["ShuffledValues", "MAX_BUCKET_BITS"]

#: At most 2**9 bucket files open at once (a common limit is 1,024 descriptors).
MAX_BUCKET_BITS = 9


class ShuffledValues:
    """``values(start, stop)`` of the shuffled order of ``n`` records that ``read(0, n)``
    yields (about ``nbytes`` of them); :attr:`order` is the permutation (output position
    -> input position)."""

    def __init__(self, read: Callable[[int, int], Iterator], n: int, nbytes: int, *, seed: int,
                 identity: str, memory_budget: int, scratch: Path, progress: bool = True):
        if memory_budget <= 0:
            raise ValueError(f"--memory-budget must be positive, got {memory_budget}")
        self.read, self.n, self.scratch, self.progress = read, n, Path(scratch), progress
        self.keys = record_keys(seed, identity, 0, n)
        self.order = np.lexsort((np.arange(n), self.keys))
        self.in_memory = nbytes * 1.1 <= memory_budget
        self.bits = 0 if self.in_memory else max(1, math.ceil(math.log2(nbytes * 2.5 / memory_budget)))
        if self.bits > MAX_BUCKET_BITS:
            raise ValueError(f"--memory-budget {memory_budget / 2**30:.2f} GiB is too small for "
                             f"{nbytes / 2**30:.1f} GiB of records; give at least "
                             f"{nbytes * 2.5 / (1 << MAX_BUCKET_BITS) / 2**30:.2f} GiB")
        counts = np.bincount((self.keys >> np.uint64(64 - self.bits)).astype(np.int64)
                             if self.bits else np.zeros(n, np.int64), minlength=1 << self.bits)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        self.buckets: list | None = None

    def _pass1(self) -> None:
        nb = 1 << self.bits
        if self.in_memory:
            self.buckets = [io.BytesIO() for _ in range(nb)]
        else:
            if self.scratch.exists():
                shutil.rmtree(self.scratch)
            self.scratch.mkdir(parents=True)
            self.buckets = [open(self.scratch / f"bucket-{b:04d}.bin", "w+b") for b in range(nb)]
        shift = np.uint64(64 - self.bits)
        with progress_bar(total=self.n, unit="rec", desc="shuffle pass 1",
                          progress=self.progress, dynamic_ncols=True) as bar:
            for i, value in enumerate(self.read(0, self.n)):
                key = self.keys[i]
                f = self.buckets[int(key >> shift) if self.bits else 0]
                f.write(FRAME.pack(int(key), i, len(value)))
                f.write(value)
                bar.update(1)
        for f in self.buckets:
            f.flush()

    def _bucket(self, b: int) -> Iterator[bytes]:
        """Bucket ``b``'s values in key order."""
        f = self.buckets[b]
        path = None if self.in_memory else self.scratch / f"bucket-{b:04d}.bin"
        frames = sorted(bucket_frames(f, f.seek(0, 2), path), key=lambda fr: (fr[0], fr[1]))
        if self.in_memory:
            buf = f.getbuffer()
            try:
                for _, _, off, size in frames:
                    yield bytes(buf[off:off + size])
            finally:
                del buf
        else:
            fd = f.fileno()
            for _, _, off, size in frames:
                yield os.pread(fd, size, off)

    def __call__(self, start: int, stop: int) -> Iterator[bytes]:
        if self.buckets is None:
            self._pass1()
        for b in range(1 << self.bits):
            lo, hi = self.starts[b], self.starts[b + 1]
            if hi <= start or lo >= stop:
                continue
            for pos, value in enumerate(self._bucket(b), lo):
                if pos >= stop:
                    break
                if pos >= start:
                    yield value

    def close(self) -> None:
        for f in self.buckets or ():
            f.close()
        self.buckets = None
        if not self.in_memory:
            shutil.rmtree(self.scratch, ignore_errors=True)
