"""The GPU decode mode (``decode="gpu"``): workers gather each batch for the device
(NOTE [ GPU batches ]), the main process decodes it with nvJPEG and renders it there
(NOTE [ GPU stream ]); the caller gets device tensors (NOTE [ decode modes ]).

NOTE [ GPU setup ]
Everything that depends on the machine rather than on a record is settled when the
Loader is built, so that it fails there, once, with the fix -- never as a
``RecordError`` of record 0 in the first batch:

* the device gets an explicit index (:func:`resolve_device`): the one asked for, else
  ``LOCAL_RANK`` (torchrun, accelerate), else the current device.  torchvision keeps
  one nvJPEG decoder per process and rebuilds it -- leaking its state on purpose --
  whenever the device it is given changes, so ``cuda`` and ``cuda:0`` must not both
  reach it;
* several ranks of one job that would decode on one GPU by accident (``device="cuda"``
  under DDP with neither ``LOCAL_RANK`` nor ``torch.cuda.set_device``) are an error;
* torchvision is imported and checked (>= 0.19) and a tiny JPEG is decoded on the
  device (:class:`~seqloader.transforms.gpu.JpegDecoder`).

The streams are made later, in the first iteration, after the workers have started.
A failure of the device while decoding -- out of memory -- raises
:class:`~seqloader.errors.DeviceError`; an image the device refuses is decoded on the
CPU instead and counted (NOTE [ GPU stream ]).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ..transforms.gpu import JpegDecoder
from .batch import Batch, BatchSpec, slot_views
from .decode import batch_rng
from .gpudecode import DecodeStats, GPUDecoder
from .gpugather import GatherMode, GPUOptions, gather_batch, sample_nbytes

__all__ = ["GPUMode", "resolve_device"]


def resolve_device(device: Any, *, rank: int = 0, world_size: int = 1) -> torch.device:
    """``device`` with an explicit index (NOTE [ GPU setup ]); other devices unchanged."""
    d = torch.device(device)
    if d.type != "cuda":
        return d
    if not torch.cuda.is_available():
        raise ValueError(f"decode='gpu' with device={str(device)!r}, but CUDA is not "
                         "available here (no GPU, or a CPU-only torch); use device='cpu' "
                         "to run the same path on CPU tensors, or decode='cpu'")
    count = torch.cuda.device_count()
    local = os.environ.get("LOCAL_RANK", "").strip()
    if d.index is not None:
        index = d.index
    elif local.isdigit():
        index = int(local)
    else:
        index = torch.cuda.current_device()
        if world_size > 1 and count > 1 and index == 0 and rank % count != 0:
            raise ValueError(
                f"decode='gpu' with device='cuda' on rank {rank} of {world_size}: without "
                "LOCAL_RANK or torch.cuda.set_device() every rank would decode on cuda:0; "
                f"pass device=f'cuda:{{local_rank}}' (0..{count - 1}) or call "
                "torch.cuda.set_device(local_rank) before building the Loader")
    if not 0 <= index < count:
        raise ValueError(f"decode='gpu' on cuda:{index}, but {count} CUDA device(s) are "
                         f"visible{' (LOCAL_RANK=' + local + ')' if d.index is None else ''}: "
                         "pass device='cuda:N' with N below that, or check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", index)


class GPUMode(GatherMode):
    """Decode on ``device`` (resolved: :func:`resolve_device`) as ``options`` say;
    checks the device decoder when built (NOTE [ GPU setup ]).  The workers get its
    :class:`~seqloader.dataflow.gpugather.GatherMode` (no torch, no device state)."""

    def __init__(self, options: GPUOptions, device: torch.device):
        super().__init__(options)
        self.device = device
        self.jpeg: JpegDecoder | None = JpegDecoder(device)  # (raises DeviceError)
        self._stats = DecodeStats()
        self._decoder: GPUDecoder | None = None

    def __reduce__(self) -> tuple:
        """What a worker needs: the gathering, with the options."""
        return GatherMode, (self.options,)

    @property
    def stats(self) -> DecodeStats:
        return self._stats

    def batch_spec(self, df: Any, transform: Callable | None, common: dict[str, Any],
                   output: str) -> tuple[BatchSpec, Any]:
        from ..transforms import compile_fused

        fused = compile_fused(transform, output="uint8")
        if fused is None:
            raise ValueError("decode='gpu' needs a standard recipe (RandomResizedCrop or Resize "
                             "+ CenterCrop, optional flip, ToTensor, Normalize: seqloader's or "
                             f"torchvision's classes) to run on the device, got {transform!r}; "
                             "use decode='cpu' for other transforms")
        if common["target_kind"] != "class":
            raise ValueError("decode='gpu' yields integer class labels; this database holds "
                             "other targets: use decode='cpu'")
        db = df.source.db
        return BatchSpec(mode=self, fused=fused, sample_shape=(sample_nbytes(fused.out_hw),),
                         sample_dtype="uint8", stored_pixels=db.metas[0].image_format == "pixels",
                         **common), None

    def local_batches(self, engine: Any, plan: Any, first: int) -> Iterator[Batch]:
        """Without workers: the reader copies each batch's records into one buffer laid
        out as a worker's (each image copied once), then gathers it (NOTE [ GPU batches ])."""
        spec = engine.spec
        buf = np.empty(spec.slot_nbytes, np.uint8)
        labels, samples, whole = slot_views(buf, spec, spec.batch_size)
        for j, recs in engine.df.batches(plan, first, release=False):
            n = len(recs)
            start = spec.input_start([len(v) for _, v in recs])
            values: list[Any] = []
            for _, v in recs:  # (a batch too large for the buffer: gathered from the views)
                if start is None:
                    values.append(v)
                    continue
                engine.df.copy_into(v, whole[start:start + len(v)])
                values.append(whole[start:start + len(v)].data)
                start += len(v)
            gather_batch(spec, whole, values, [i for i, _ in recs], labels[:n], samples[:n],
                         batch_rng(spec.seed, plan.epoch, spec.rank, j))
            del values
            yield Batch(j, labels[:n], samples[:n], whole=whole)

    def delivered(self, batches: Iterator[Batch], delivery: Any) -> Iterator[tuple[int, Any]]:
        """NOTE [ GPU stream ]; the decoder (and its streams) is made here, at the first
        iteration, once the workers run."""
        if self._decoder is None:
            engine = delivery.engine
            self._decoder = GPUDecoder(engine.spec, self.device, db=engine.source.db,
                                       jpeg=self.jpeg, stats=self._stats)
        for j, (images, labels, host_labels) in self._decoder.batches(batches):
            yield j, delivery.collated((images, labels), host_labels)

    def reset(self) -> None:
        self._decoder = None
