"""What one worker does in an epoch: read its stream, shuffle locally, decode and
transform into batch buffers.  Runs inside worker processes (or in the caller's
process with ``num_workers=0``).
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import msgpack
import numpy as np

from .database import Database
from .reader import RangeReader
from .shuffle import ShuffleBuffer

__all__ = ["ProducerSpec", "Producer", "RecordError", "batch_rng", "worker_rng"]


class RecordError(RuntimeError):
    """Processing one record failed; carries the record index and the original traceback."""

    def __init__(self, message: str, index: int, tb: str):
        super().__init__(message)
        self.index = index
        self.tb = tb


def worker_rng(seed: int, epoch: int, rank: int, worker: int) -> np.random.Generator:
    """The local-shuffle generator of one (seed, epoch, rank, worker)."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, rank, worker, 1]))


def batch_rng(seed: int, epoch: int, rank: int, batch: int) -> np.random.Generator:
    """The augmentation generator of one batch: independent of the worker count and
    exact on resume."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, rank, batch, 2]))


@dataclass
class ProducerSpec:
    """Picklable description of the work; sent to each worker once.

    ``mode`` is ``"raw"`` (encoded bytes) or ``"decode"``.  In decode mode exactly one
    of ``fused`` (a :class:`~seqloader.transforms.FusedPipeline`) and ``transform``
    (``callable(img_rgb_uint8, rng) -> array``) is set, and every sample has
    ``sample_shape``/``sample_dtype``.
    """

    db: Database
    mode: str
    seed: int
    rank: int
    shuffle: bool
    cache: int
    warmup: int
    batch_size: int
    fused: Any = None
    transform: Callable | None = None
    target_transform: Callable | None = None
    sample_shape: tuple[int, ...] = ()
    sample_dtype: str = "float32"
    prefetch_bytes: int = 64 << 20

    def slot_nbytes(self) -> int:
        """Bytes of one batch buffer: samples, then int64 labels."""
        per = int(np.prod(self.sample_shape)) * np.dtype(self.sample_dtype).itemsize
        return self.batch_size * per + self.batch_size * 8


def batch_views(buf: memoryview | bytearray, spec: ProducerSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(images[:n], labels[:n]) views into a batch buffer laid out by ``slot_nbytes``."""
    B = spec.batch_size
    images = np.ndarray((B, *spec.sample_shape), spec.sample_dtype, buffer=buf)
    labels = np.ndarray((B,), np.int64, buffer=buf, offset=images.nbytes)
    return images[:n], labels[:n]


def _seed_global_rngs(rng: np.random.Generator) -> None:
    """Seed the global generators third-party transforms use (torch, random, numpy)."""
    s = int(rng.integers(2**31))
    import random
    random.seed(s)
    np.random.seed(s)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(s)


class Producer:
    """One worker's epochs.  Create in the process that runs it (opens LMDB lazily)."""

    def __init__(self, spec: ProducerSpec, worker: int):
        self.spec = spec
        self.worker = worker
        self.reader = RangeReader(spec.db, prefetch_bytes=spec.prefetch_bytes)

    def records(self, epoch: int, ranges: Sequence[tuple[int, int]], skip: int
                ) -> Iterator[tuple[int, memoryview]]:
        """The worker's stream for ``epoch`` in output (shuffled) order, minus the first
        ``skip`` outputs -- skipped on positions only; see NOTE [ local shuffle ]."""
        spec = self.spec
        if not spec.shuffle:
            yield from self.reader.read(_skip_ranges(ranges, skip))
            return
        n = sum(b - a for a, b in ranges)
        buf: ShuffleBuffer[int] = ShuffleBuffer(spec.cache, worker_rng(spec.seed, epoch, spec.rank,
                                                                      self.worker),
                                                warmup=spec.warmup)
        emitted = 0
        pos = 0
        while emitted < skip and pos < n:  # fast-forward on positions, no I/O
            emitted += len(buf.push(pos))
            pos += 1
        while emitted < skip:
            next(buf.drain())
            emitted += 1
        # records of the stream by position; start with what the buffer holds
        index_of = _PositionMap(ranges)
        held = {p: self.reader.get(index_of(p)) for p in buf.items}
        stream = self.reader.read(_skip_ranges(ranges, pos))
        for p in range(pos, n):
            idx, value = next(stream)
            held[p] = value
            for out in buf.push(p):
                yield index_of(out), held.pop(out)
        for out in buf.drain():
            yield index_of(out), held.pop(out)

    def fill(self, records: Iterator[tuple[int, memoryview]], n: int, rng: np.random.Generator,
             out: tuple[np.ndarray, np.ndarray] | None) -> list[bytes] | None:
        """Take ``n`` records; decode+transform them into ``out`` (decode mode) or return
        their encoded bytes (raw mode, labels into ``out[1]``)."""
        spec = self.spec
        images, labels = out
        raw: list[bytes] = []
        if spec.transform is not None:
            _seed_global_rngs(rng)
        for i in range(n):
            idx, value = next(records)
            rec: dict = {}
            try:
                rec = msgpack.unpackb(value, raw=False)
                data, label = rec["image"], rec["label"]
                if spec.target_transform is not None:
                    label = spec.target_transform(label)
                labels[i] = label
                if spec.mode == "raw":
                    raw.append(data)
                elif spec.fused is not None:
                    spec.fused(data, images[i], rng)
                else:
                    self._generic(data, images[i], rng)
            except Exception as e:
                path = rec.get("path") if isinstance(rec, dict) else None
                where = f"record {idx}" + (f" ({path})" if path else "")
                raise RecordError(f"{where}: {type(e).__name__}: {e}", idx,
                                  traceback.format_exc()) from e
        return raw if spec.mode == "raw" else None

    def _generic(self, data: bytes, out: np.ndarray, rng: np.random.Generator) -> None:
        from .transforms import decode_rgb

        result = np.asarray(self.spec.transform(decode_rgb(data), rng))
        if result.shape != out.shape:
            raise ValueError(f"the transform returned shape {result.shape}, but the first record "
                             f"gave {out.shape}; batches need equal shapes (end the transform "
                             "with a fixed-size crop such as CenterCrop/RandomResizedCrop)")
        np.copyto(out, result, casting="same_kind")

    def epoch(self, epoch: int, ranges: Sequence[tuple[int, int]], sizes: Sequence[int],
              first_batch: int, batch_index: Callable[[int], int]
              ) -> Iterator[tuple[int, int, Callable]]:
        """Yield ``(k, n, fill_k)`` for this worker's batches ``k >= first_batch``;
        ``fill_k(out)`` must be called before the next item is requested."""
        skip = sum(sizes[:first_batch])
        records = self.records(epoch, ranges, skip)
        for k in range(first_batch, len(sizes)):
            n = sizes[k]
            rng = batch_rng(self.spec.seed, epoch, self.spec.rank, batch_index(k))
            yield k, n, (lambda out, n=n, rng=rng: self.fill(records, n, rng, out))

    def close(self) -> None:
        self.reader.close()


class _PositionMap:
    """Stream position -> global record index, for a list of ranges."""

    def __init__(self, ranges: Sequence[tuple[int, int]]):
        self.starts = np.cumsum([0] + [b - a for a, b in ranges])
        self.firsts = np.asarray([a for a, _ in ranges] or [0])

    def __call__(self, p: int) -> int:
        i = int(np.searchsorted(self.starts, p, side="right")) - 1
        return int(self.firsts[i] + p - self.starts[i])


def _skip_ranges(ranges: Sequence[tuple[int, int]], skip: int) -> list[tuple[int, int]]:
    out = []
    for a, b in ranges:
        if skip >= b - a:
            skip -= b - a
            continue
        out.append((a + skip, b))
        skip = 0
    return out
