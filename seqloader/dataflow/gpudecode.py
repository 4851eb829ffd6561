"""The main-process side of GPU decoding (``Loader(decode="gpu")``): decode each gathered
batch on the device and render it with the recipe's tensor operations, one batch ahead
of the caller.

NOTE [ GPU stream ]
Batch ``j + 1`` is decoded and rendered, on a side stream, inside the ``next()`` that
hands out batch ``j``: the training step the caller queued for batch ``j - 1`` runs on
the GPU meanwhile.  torchvision's nvJPEG call returns once its own stream has decoded
the batch (it synchronises that stream, not the device), so the batch buffer is free
when it returns; the rendering kernels are only queued.  The batch handed out carries
an event: the caller's current stream waits on it (no host synchronisation) and the
tensors are ``record_stream``-ed to that stream, so the caching allocator does not
reuse them early.  At most two rendered batches exist at a time, plus one batch's
decoded images: bounded device memory.  With ``pin_memory`` the labels are pinned
before their (non-blocking) copy, as with ``decode="cpu"``; the images are decoded on
the device, from the shared-memory buffer nvJPEG stages itself.
"""
from __future__ import annotations

import bisect
import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from ..errors import RecordError
from ..transforms.gpu import TensorRecipe, decode_jpegs
from .batch import BatchSpec
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

    def __init__(self, spec: BatchSpec, device: torch.device, *, pin_memory: bool = False,
                 db: Any = None):
        opts = spec.gpu
        self.spec, self.device, self.pin_memory, self.db = spec, device, pin_memory, db
        self.recipe = TensorRecipe(spec.fused, dtype=opts.dtype, channels_last=opts.channels_last)
        self.stats = DecodeStats()
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def batches(self, items: Iterator[tuple]) -> Iterator[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
        """``(j, (images, labels))`` for each ``(j, n, (labels, samples), whole, slot)`` of
        ``items``, the next batch decoded before this one is handed out."""
        pending = None
        for j, n, (labels, samples), whole, _ in items:
            ready = (j, self._prepare(n, labels, samples, whole))
            if pending is not None:
                yield self._handed(pending)
            pending = ready
        if pending is not None:
            yield self._handed(pending)

    def _handed(self, item: tuple) -> tuple[int, tuple[torch.Tensor, torch.Tensor]]:
        j, (images, labels, event) = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        return j, (images, labels)

    def _prepare(self, n: int, labels_v: np.ndarray, samples: np.ndarray,
                 whole: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, Any]:
        rows = params_view(samples[:n]).copy()
        kinds = rows[:, C["kind"]].astype(np.int64)
        gpu = np.flatnonzero(kinds == ON_GPU)
        cpu = np.flatnonzero(kinds != ON_GPU)
        data = [torch.from_numpy(whole[int(o):int(o) + int(ln)])
                for o, ln in rows[gpu][:, [C["offset"], C["length"]]]]
        labels = torch.from_numpy(labels_v[:n].copy())
        if self.pin_memory:
            labels = labels.pin_memory()
        ctx = (torch.cuda.stream(self.stream) if self.stream is not None
               else contextlib.nullcontext())
        with ctx:
            decoded = self._decode(data, rows[gpu])
            oh, ow = self.recipe.out_hw
            out = torch.zeros((n, 3, oh, ow), dtype=torch.float32, device=self.device)
            boxes = rows[gpu][:, [C["y0"], C["x0"], C["y1"], C["x1"], C["rh"], C["rw"]]]
            self.recipe.render(decoded, boxes, out, gpu.tolist())
            del decoded
            if cpu.size:  # rendered by the workers, flipped already (NOTE [ GPU batches ])
                pix = torch.from_numpy(pixels_view(samples[:n], (oh, ow))[cpu])
                out[torch.from_numpy(cpu).to(self.device)] = (
                    pix.to(self.device).permute(0, 3, 1, 2).float())
            flip = gpu[rows[gpu, C["flip"]] != 0]
            images = self.recipe.finish(out, torch.from_numpy(flip).to(self.device)
                                        if flip.size else None)
            labels = labels.to(self.device, non_blocking=self.pin_memory)
            event = self.stream.record_event() if self.stream is not None else None
        self._count(n, kinds)
        return images, labels, event

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
