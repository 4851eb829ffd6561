"""The main-process side of GPU decoding (``Loader(decode="gpu")``): decode each gathered
batch on the device and render it with the recipe's tensor operations.

NOTE [ GPU stream ]
Two threads of the main process share the work, so that the nvJPEG decode of one batch
overlaps the rendering of the one before. A decode thread
(:class:`~seqloader.dataflow.gputhread.DecodeThread`) iterates the workers' gathered
batches and decodes each, batched (torchvision's call returns once its own stream has
decoded the batch: it synchronises that stream, not the device, and releases the GIL
meanwhile), then hands the decoded images on through a queue of one and releases the
batch buffer. A batch whose images take more than ``GPUOptions.decoded_bytes`` at full
resolution is decoded in parts, and no part is decoded before the bytes of the parts
not yet rendered fit in that budget (one image larger than the budget goes alone): the
decoded images -- and nvJPEG's own buffers, which grow with them -- are bounded in
bytes, not in batches. The decoded images are allocated on a stream of their own and
``record_stream``-ed to the rendering stream before they are dropped: nvJPEG writes them
on torchvision's internal stream, so a block freed once the rendering is queued must not
go to the next decode until that rendering has run. The caller's thread renders each
batch (crop, resize, flip, normalise: kernels only queued) on a side stream inside the
``next()`` that hands it out -- not one ahead: the caller still holds its previous batch
during that ``next()``, so rendering ahead would make three batches live; the training
step the caller queued for the previous batch runs on the GPU meanwhile. The batch
handed out carries an event: the caller's current stream waits on it (no host
synchronisation) and the tensors are ``record_stream``-ed to that stream, so the caching
allocator does not reuse them early. Labels, indices and fallback samples go to the
device through pinned memory (non-blocking), whatever ``pin_memory`` says -- a batch on
the device is what ``pin_memory`` exists for; the images are decoded from the
shared-memory buffer, which nvJPEG stages through its own pinned buffers.

An image the device decoder refuses (nvJPEG rejects some chroma subsamplings the CPU
decoder reads) is decoded on the CPU and counted; only a failure there too is the
record's :class:`~seqloader.errors.RecordError`. The device running out of memory is a
:class:`~seqloader.errors.DeviceError` naming the budget to lower. Every wait polls with
a timeout; a failure in the decode thread (a worker's error, a record that does not
decode) is raised in the caller; ending the iteration stops and joins the thread, which
closes the workers' epoch before anything else may touch the pool. The workers are
started by the caller's thread beforehand (a worker dies with the thread that forked it,
``PR_SET_PDEATHSIG``, and the decode thread ends with every iteration), and the streams
are made after them (NOTE [ GPU setup ]).
"""
from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ..errors import DeviceError, RecordError
from ..transforms.gpu import JpegDecoder, TensorRecipe, cpu_decode
from .batch import Batch, BatchSpec
from .gpugather import C, ON_GPU, REASONS, params_view, pixels_view
from .gputhread import ByteBudget, DecodeThread

__all__ = ["GPUDecoder", "DecodeStats", "REFUSED"]

#: The fallback reason of an image the device decoder refused (decoded on the CPU).
REFUSED = "refused by the device decoder"


@dataclass
class DecodeStats:
    """What ``decode="gpu"`` did since the Loader was made: ``images`` delivered,
    ``on_gpu`` of them decoded on the device, ``fallback`` decoded on the CPU instead,
    counted by reason (:data:`~seqloader.dataflow.gpugather.REASONS`, :data:`REFUSED`)."""

    images: int = 0
    on_gpu: int = 0
    fallback: dict[str, int] = field(default_factory=dict)

    @property
    def fallbacks(self) -> int:
        return sum(self.fallback.values())


@dataclass
class _Part:
    """Decoded images of batch ``j`` (the next of its images to decode on the device,
    with their ``boxes``); the last part of a batch also carries what the whole batch
    needs."""

    j: int
    decoded: list
    boxes: np.ndarray
    nbytes: int
    refused: int
    batch: tuple | None = None  # last part: (n, rows, gpu, cpu, pixels, labels)


def _device_fault(e: BaseException) -> bool:
    """A failure of the device or the setup, not of one image (NOTE [ GPU setup ])."""
    return (isinstance(e, (torch.OutOfMemoryError, ImportError, AttributeError, TypeError,
                           NotImplementedError))
            or "out of memory" in str(e).lower())


class GPUDecoder:
    """Turns gathered batches (``MultiProcessMapAndBatchData.run`` in the GPU mode) into
    ``(images, labels, host labels)`` on ``device`` (NOTE [ GPU stream ]).  Made at the
    first iteration, after the workers started (it makes the streams)."""

    def __init__(self, spec: BatchSpec, device: torch.device, *, db: Any = None,
                 jpeg: JpegDecoder | None = None, stats: DecodeStats | None = None):
        opts = spec.mode.options
        self.spec, self.device, self.db = spec, device, db
        self.jpeg = jpeg if jpeg is not None else JpegDecoder(device)
        self.recipe = TensorRecipe(spec.fused, dtype=opts.dtype, channels_last=opts.channels_last)
        self.budget_bytes = opts.decoded_bytes
        self.stats = stats if stats is not None else DecodeStats()
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None  # rendering
        self.decode_stream = torch.cuda.Stream(device) if cuda else None  # decoded images

    def batches(self, items: Iterator[Batch]
                ) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor, np.ndarray]]]:
        """``(j, (images, labels, host labels))`` for each gathered
        :class:`~seqloader.dataflow.batch.Batch` of ``items``, each rendered in the
        ``next()`` that hands it out (NOTE [ GPU stream ])."""
        budget = ByteBudget(self.budget_bytes)  # (per iteration: a broken-off one leaks none)
        thread = DecodeThread(items, self._decoded, self.decode_stream, budget)
        thread.start()
        try:
            outs: list[torch.Tensor] = []
            refused = 0
            for part in thread.results():
                outs.append(self._render(part))
                budget.release(part.nbytes)
                refused += part.refused
                if part.batch is not None:
                    yield self._handed(part.j, self._finish(outs, *part.batch, refused))
                    outs, refused = [], 0
        finally:
            thread.close()

    def _handed(self, j: int, item: tuple) -> tuple[int, tuple]:
        images, labels, host, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        return j, (images, labels, host)

    def _decoded(self, item: Batch, acquire: Callable[[int], None]) -> Iterator[_Part]:
        """In the decode thread: a gathered batch decoded in parts that fit the budget,
        and everything the rendering needs copied out of its buffer (which is released
        after this)."""
        j, labels_v, samples, whole = item.index, item.labels, item.samples, item.whole
        n = len(samples)
        rows = params_view(samples[:n]).copy()
        kinds = rows[:, C["kind"]].astype(np.int64)
        gpu = np.flatnonzero(kinds == ON_GPU)
        cpu = np.flatnonzero(kinds != ON_GPU)
        pixels = (torch.from_numpy(pixels_view(samples[:n], self.recipe.out_hw)[cpu])  # (a copy)
                  if cpu.size else None)
        sizes = (rows[gpu, C["height"]] * rows[gpu, C["width"]] * 3).astype(np.int64)
        bounds = _parts(sizes, self.budget_bytes)
        for k, (a, b) in enumerate(bounds):
            nbytes = int(sizes[a:b].sum())
            acquire(nbytes)
            sel = rows[gpu[a:b]]
            data = [torch.from_numpy(whole[int(o):int(o) + int(ln)])
                    for o, ln in sel[:, [C["offset"], C["length"]]]]
            decoded, refused = self._decode(data, sel, j)
            del data
            boxes = sel[:, [C["y0"], C["x0"], C["y1"], C["x1"], C["rh"], C["rw"]]]
            last = k == len(bounds) - 1
            yield _Part(j, decoded, boxes, nbytes, refused,
                        (n, rows, gpu, cpu, pixels, labels_v[:n].copy()) if last else None)

    def _render(self, part: _Part) -> torch.Tensor:
        """One part's images cropped and resized on the rendering stream (``[k, 3, H, W]``
        float grey levels); they are dropped here, which frees their budget."""
        ctx = (torch.cuda.stream(self.stream) if self.stream is not None
               else contextlib.nullcontext())
        with ctx:
            if self.stream is not None:
                self.stream.wait_stream(self.decode_stream)
            out = self.recipe.render(part.decoded, part.boxes).to(self.device)
            if self.stream is not None:  # (freed now, reused only once the render is done)
                for img in part.decoded:
                    img.record_stream(self.stream)
        part.decoded = []
        return out

    def _finish(self, outs: list[torch.Tensor], n: int, rows: np.ndarray, gpu: np.ndarray,
                cpu: np.ndarray, pixels: torch.Tensor | None, labels_np: np.ndarray,
                refused: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, Any]:
        labels = torch.from_numpy(labels_np)
        ctx = (torch.cuda.stream(self.stream) if self.stream is not None
               else contextlib.nullcontext())
        with ctx:
            out = outs[0] if len(outs) == 1 else torch.cat(outs)
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
        self._count(n, rows[:, C["kind"]].astype(np.int64), refused)
        return images, labels, labels_np, event

    def _to(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a CPU tensor) on the device without waiting for the stream: a copy
        from pageable memory may synchronise the side stream per batch (NOTE [ GPU
        stream ]), so it goes through torch's cached pinned memory (which keeps the
        block until the copy is done)."""
        if self.stream is None:
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _decode(self, data: list[torch.Tensor], rows: np.ndarray, j: int
                ) -> tuple[list[torch.Tensor], int]:
        """Decode images on the device, batched; one the device refuses (or decodes to
        another size than its header's) is decoded on the CPU instead -- ``(images,
        how many were refused)``.  A failure on the CPU too raises :class:`RecordError`
        naming the record; a fault of the device raises :class:`DeviceError`."""
        try:
            decoded: list = self.jpeg(data)
        except Exception as e:
            self._check_device(e, rows, j)
            decoded = []
        if len(decoded) != len(data):
            decoded = [None] * len(data)
        out, refused = [], 0
        for d, img, row in zip(data, decoded, rows):
            if img is None:
                try:  # (only on failure: one at a time, on the device first)
                    img, = self.jpeg([d])
                except Exception as e:
                    self._check_device(e, rows[:1], j)
                    img = None
            if img is None or not self._fits(img, row):
                img = self._on_cpu(d, row)
                refused += 1
            out.append(img)
        return out, refused

    @staticmethod
    def _fits(img: torch.Tensor, row: np.ndarray) -> bool:
        return tuple(img.shape[1:]) == (int(row[C["height"]]), int(row[C["width"]]))

    def _check_device(self, e: Exception, rows: np.ndarray, j: int) -> None:
        if _device_fault(e):
            mb = float((rows[:, C["height"]] * rows[:, C["width"]] * 3).sum()) / 2**20
            raise DeviceError(
                f"decode='gpu' failed on {self.device} decoding batch {j} ({len(rows)} images, "
                f"{mb:.0f} MiB at full resolution): {type(e).__name__}: {e} -- a fault of the "
                f"device, not of a record: lower GPUOptions(decoded_bytes=...) (now "
                f"{self.budget_bytes}) or the batch size, free device memory, or use "
                "decode='cpu'") from e

    def _on_cpu(self, d: torch.Tensor, row: np.ndarray) -> torch.Tensor:
        """The CPU decoder's image (the device refused it); RecordError if it fails too."""
        try:
            img = cpu_decode(d)
            if not self._fits(img, row):
                raise ValueError(f"decoded {tuple(img.shape[1:])}, but the JPEG header says "
                                 f"{int(row[C['height']])}x{int(row[C['width']])}")
        except Exception as e:
            idx = int(row[C["index"]])
            raise RecordError.of(e, idx, _record_path(self.db, idx)) from e
        return img.to(self.device)

    def _count(self, n: int, kinds: np.ndarray, refused: int) -> None:
        s = self.stats
        s.images += n
        s.on_gpu += int((kinds == ON_GPU).sum()) - refused
        for k in kinds[kinds != ON_GPU].tolist():
            reason = REASONS.get(int(k), f"kind {k}")
            s.fallback[reason] = s.fallback.get(reason, 0) + 1
        if refused:
            s.fallback[REFUSED] = s.fallback.get(REFUSED, 0) + refused


def _parts(sizes: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """``[(a, b), ...]``: consecutive runs of images whose ``sizes`` sum to at most
    ``budget`` (an image larger than that alone); ``[(0, 0)]`` for none."""
    out, a, total = [], 0, 0
    for i, size in enumerate(sizes.tolist()):
        if i > a and total + size > budget:
            out.append((a, i))
            a, total = i, 0
        total += size
    out.append((a, len(sizes)))
    return out


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
