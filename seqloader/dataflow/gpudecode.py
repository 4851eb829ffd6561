"""The main-process side of GPU decoding (``Loader(decode="gpu")``): decode each gathered
batch on the device and render it with the recipe's tensor operations, one batch ahead
of the caller.

NOTE [ GPU stream ]
Two threads of the main process share the work, so that the nvJPEG decode of one batch
overlaps the rendering of the one before. A decode thread iterates the workers' gathered
batches and decodes each, batched (torchvision's call returns once its own stream has
decoded the batch: it synchronises that stream, not the device, and releases the GIL
meanwhile), then hands the decoded images on through a queue of one and releases the
batch buffer. The decoded images are allocated on a stream of their own and
``record_stream``-ed to the rendering stream before they are dropped: nvJPEG writes them
on torchvision's internal stream, so a block freed once the rendering is queued must not
go to the next decode until that rendering has run. The caller's thread renders them
(crop, resize, flip, normalise: kernels only queued) on a side stream, inside the
``next()`` that hands out the batch before: the training step the caller queued for that
one runs on the GPU meanwhile. The batch handed out carries an event: the caller's
current stream waits on it (no host synchronisation) and the tensors are
``record_stream``-ed to that stream, so the caching allocator does not reuse them early.
Bounded device memory: two rendered batches and up to three batches of decoded images at
a time. Labels, indices and fallback samples go to the device through pinned memory
(non-blocking), whatever ``pin_memory`` says -- a batch on the device is what
``pin_memory`` exists for; the images are decoded from the shared-memory buffer, which
nvJPEG stages through its own pinned buffers. Every wait polls with a timeout; a failure
in the decode thread (a worker's error, a record that does not decode) is raised in the
caller; ending the iteration stops and joins the thread, which closes the workers' epoch
before anything else may touch the pool. The workers are started by the caller's thread
beforehand (``MultiProcessMapAndBatchData.start``): a worker dies with the thread that
forked it (``PR_SET_PDEATHSIG``), and the decode thread ends with every iteration.
"""
from __future__ import annotations

import bisect
import contextlib
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from ..errors import RecordError
from ..transforms.gpu import TensorRecipe, decode_jpegs
from .batch import Batch, BatchSpec
from .gpugather import C, ON_GPU, REASONS, params_view, pixels_view

__all__ = ["GPUDecoder", "DecodeStats"]


@dataclass
class DecodeStats:
    """What ``decode="gpu"`` did since the Loader was made: ``images`` delivered,
    ``on_gpu`` of them decoded on the device, ``fallback`` rendered by the workers'
    CPU path, counted by reason (:data:`~seqloader.dataflow.gpugather.REASONS`)."""

    images: int = 0
    on_gpu: int = 0
    fallback: dict[str, int] = field(default_factory=dict)

    @property
    def fallbacks(self) -> int:
        return sum(self.fallback.values())


class GPUDecoder:
    """Turns gathered batches (``MultiProcessMapAndBatchData.run`` in mode "gpu") into
    ``(images, labels)`` on ``device`` (NOTE [ GPU stream ])."""

    def __init__(self, spec: BatchSpec, device: torch.device, *, db: Any = None):
        opts = spec.gpu
        self.spec, self.device, self.db = spec, device, db
        self.recipe = TensorRecipe(spec.fused, dtype=opts.dtype, channels_last=opts.channels_last)
        self.stats = DecodeStats()
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None  # rendering
        self.decode_stream = torch.cuda.Stream(device) if cuda else None  # decoded images

    def batches(self, items: Iterator[Batch]
                ) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
        """``(j, (images, labels))`` for each gathered :class:`~seqloader.dataflow.batch.Batch`
        of ``items`` (NOTE [ GPU stream ])."""
        thread = _DecodeThread(items, self._decoded, self.decode_stream)
        thread.start()
        try:
            pending = None
            for got in thread.results():
                ready = (got[0], self._render(*got[1:]))
                if pending is not None:
                    yield self._handed(pending)
                pending = ready
            if pending is not None:
                yield self._handed(pending)
        finally:
            thread.close()

    def _handed(self, item: tuple) -> tuple[int, tuple[torch.Tensor, torch.Tensor]]:
        j, (images, labels, event) = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        return j, (images, labels)

    def _decoded(self, item: Batch) -> tuple:
        """In the decode thread: a gathered batch decoded, and everything the rendering
        needs copied out of its buffer (which is released after this)."""
        j, labels_v, samples, whole = item.index, item.labels, item.samples, item.whole
        n = len(samples)
        rows = params_view(samples[:n]).copy()
        kinds = rows[:, C["kind"]].astype(np.int64)
        gpu = np.flatnonzero(kinds == ON_GPU)
        cpu = np.flatnonzero(kinds != ON_GPU)
        data = [torch.from_numpy(whole[int(o):int(o) + int(ln)])
                for o, ln in rows[gpu][:, [C["offset"], C["length"]]]]
        decoded = self._decode(data, rows[gpu])
        del data
        pixels = (torch.from_numpy(pixels_view(samples[:n], self.recipe.out_hw)[cpu])  # (a copy)
                  if cpu.size else None)
        return j, n, rows, gpu, cpu, decoded, pixels, labels_v[:n].copy()

    def _render(self, n: int, rows: np.ndarray, gpu: np.ndarray, cpu: np.ndarray,
                decoded: list[torch.Tensor], pixels: torch.Tensor | None,
                labels_np: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, Any]:
        labels = torch.from_numpy(labels_np)
        ctx = (torch.cuda.stream(self.stream) if self.stream is not None
               else contextlib.nullcontext())
        with ctx:
            if self.stream is not None:
                self.stream.wait_stream(self.decode_stream)
            boxes = rows[gpu][:, [C["y0"], C["x0"], C["y1"], C["x1"], C["rh"], C["rw"]]]
            out = self.recipe.render(decoded, boxes).to(self.device)
            if self.stream is not None:  # (freed now, reused only once the render is done)
                for img in decoded:
                    img.record_stream(self.stream)
            del decoded
            if cpu.size:  # rendered by the workers, flipped already (NOTE [ GPU batches ])
                mixed = torch.zeros((n, *out.shape[1:]), dtype=out.dtype, device=self.device)
                mixed[self._to(torch.from_numpy(gpu))] = out
                mixed[self._to(torch.from_numpy(cpu))] = (
                    self._to(pixels).permute(0, 3, 1, 2).float())
                out = mixed
                flip = gpu[rows[gpu, C["flip"]] != 0]
            else:
                flip = np.flatnonzero(rows[:, C["flip"]] != 0)
            flips = self._to(torch.from_numpy(flip)) if flip.size else None
            images = self.recipe.finish(out, flips)
            labels = self._to(labels)
            event = self.stream.record_event() if self.stream is not None else None
        self._count(n, rows[:, C["kind"]].astype(np.int64))
        return images, labels, event

    def _to(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a CPU tensor) on the device without waiting for the stream: a copy
        from pageable memory may synchronise the side stream per batch (NOTE [ GPU
        stream ]), so it goes through torch's cached pinned memory (which keeps the
        block until the copy is done)."""
        if self.stream is None:
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _decode(self, data: list[torch.Tensor], rows: np.ndarray) -> list[torch.Tensor]:
        """Decode a batch; an image that fails (or decodes to another size than its
        header's) raises :class:`RecordError` naming its record, as on the CPU path."""
        try:
            decoded = decode_jpegs(data, self.device)
        except Exception:
            for d, row in zip(data, rows):  # which one? (only on failure: one at a time)
                try:
                    decode_jpegs([d], self.device)
                except Exception as e:
                    raise self._error(e, row) from e
            raise
        for img, row in zip(decoded, rows):
            if tuple(img.shape[1:]) != (int(row[C["height"]]), int(row[C["width"]])):
                try:
                    raise ValueError(f"decoded {tuple(img.shape[1:])}, but the JPEG header "
                                     f"says {int(row[C['height']])}x{int(row[C['width']])}")
                except ValueError as e:
                    raise self._error(e, row) from e
        return decoded

    def _error(self, e: Exception, row: np.ndarray) -> RecordError:
        idx = int(row[C["index"]])
        return RecordError.of(e, idx, _record_path(self.db, idx))

    def _count(self, n: int, kinds: np.ndarray) -> None:
        s = self.stats
        s.images += n
        s.on_gpu += int((kinds == ON_GPU).sum())
        for k in kinds[kinds != ON_GPU].tolist():
            reason = REASONS.get(int(k), f"kind {k}")
            s.fallback[reason] = s.fallback.get(reason, 0) + 1


def _record_path(db: Any, index: int) -> Any:
    """The source path record ``index`` of local database ``db`` names (for an error
    message; None when it has none or cannot be read)."""
    from ..format.keys import encode_key
    from ..format.records import unpack_record
    from ..read.database import close_env, open_env

    try:
        s = bisect.bisect_right(db.offsets, index) - 1
        env = open_env(db.paths[s])
        try:
            with env.begin() as txn:
                value = txn.get(encode_key(index - db.offsets[s]))
                return None if value is None else unpack_record(value).path
        finally:
            close_env(env)
    except Exception:
        return None


class _DecodeThread(threading.Thread):
    """Iterates ``items`` and puts ``work(item)`` for each into a queue of one (NOTE
    [ GPU stream ]); the generator is iterated, and closed, in this thread only."""

    POLL = 0.1

    def __init__(self, items: Iterator[Batch], work: Any, stream: Any):
        super().__init__(name="seqloader-gpu-decode", daemon=True)
        self.items, self.work, self.stream = items, work, stream
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

    def run(self) -> None:
        if self.stream is not None:
            torch.cuda.set_stream(self.stream)  # (this thread's current stream)
        try:
            for item in self.items:
                got = self.work(item)
                del item
                if not self._put(("batch", got)):
                    return
            self._put(("end",))
        except BaseException as e:  # raised in the caller's thread
            self._put(("error", e))
        finally:
            close = getattr(self.items, "close", None)
            if close is not None:
                close()

    def results(self) -> Iterator[tuple]:
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
