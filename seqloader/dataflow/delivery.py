"""How the map-and-batch stage's batches reach the caller as tensors: zero-copy views
of the shared buffers (leased from the pool), or copies that are pinned and moved to a
device; device normalisation for ``output="uint8"``; targets unpacked and collated
(NOTE [ zero-copy batches ], NOTE [ target region ])."""
from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np
import torch

from . import targetregion
from .batch import Batch
from .mapbatch import MultiProcessMapAndBatchData

__all__ = ["Delivery"]


class Delivery:
    """Turns each :class:`~seqloader.dataflow.batch.Batch` of ``engine.run`` into what
    the Loader yields: ``(images, labels)`` tensors -- or ``(list of bytes, labels)`` in
    raw mode, ``(images, default_collate(targets))`` for any targets, ``collate_fn``'s
    result when given -- pinned (``pin_memory``) and on ``device`` (None: the CPU)."""

    def __init__(self, engine: MultiProcessMapAndBatchData, *, pin_memory: bool = False,
                 device: torch.device | None = None, collate_fn: Callable | None = None):
        self.engine, self.pin_memory, self.device = engine, pin_memory, device
        self.collate_fn = collate_fn

    def __call__(self, batch: Batch) -> Any:
        """A batch of decoded samples: tensors of its buffer (NOTE [ zero-copy batches ])."""
        return self._deliver(batch, self._materialize)

    def raw(self, batch: Batch) -> Any:
        """A batch of encoded images: ``(list of bytes, labels)``."""
        return self._deliver(batch, lambda dtype, labels_v, b: (
            b.raw, torch.from_numpy(labels_v.copy())))

    def _deliver(self, batch: Batch, materialize: Callable) -> Any:
        spec = self.engine.spec
        labels = batch.labels
        # targets are unpacked from the buffer while it is held, collated after the images
        targets = targetregion.load_targets(labels) if spec.target_kind == "any" else None
        out = materialize(spec.sample_dtype, labels if targets is None
                          else labels[:0].view(np.int64), batch)
        return targetregion.collate_batch(out, targets, self.collate_fn, self.device,
                                          self.pin_memory)

    def collated(self, batch: tuple[Any, Any], host_labels: np.ndarray) -> Any:
        """A batch made elsewhere (the GPU decoder's ``(images, labels)``, with the
        labels' host copy) through ``collate_fn``, as :meth:`__call__` passes its own."""
        targets = host_labels.tolist() if self.collate_fn is not None else None
        return targetregion.collate_batch(batch, targets, self.collate_fn, self.device,
                                          self.pin_memory)

    def _materialize(self, sample_dtype: str, labels_v: np.ndarray, batch: Batch):
        """Batch tensors from a buffer.  NOTE [ zero-copy batches ]: on the CPU the images
        tensor is a view of the shared-memory buffer, leased until the tensor (and every
        view of it) is garbage-collected -- no copy, no extra memory.  When the caller
        holds too many batches, or pins / moves them, the batch is copied instead.  A
        held batch stays readable after the pool stops (end of a non-persistent epoch,
        close(), the loader collected, a worker's death): its views hold an export of the
        buffer (``slot_views``), so closing the pool leaves that mapping to them
        (``processgroup.unmap_later``) and it is unmapped when the batch goes."""
        labels = torch.from_numpy(labels_v.copy())
        images_v = batch.samples
        pool, normalize = self.engine.pool, self.engine.device_normalize
        on_cpu = self.device is None or self.device.type == "cpu"
        token = None
        if batch.slot is not None and not self.pin_memory and on_cpu:
            token = pool.lease(batch.slot)
        if token is not None:
            images = torch.from_numpy(images_v)
            weakref.finalize(images_v, pool.release, batch.slot, token)
            if self.device is not None and normalize is not None:
                images = normalize(images)
            return images, labels
        images = torch.empty(images_v.shape, dtype=getattr(torch, sample_dtype),
                             pin_memory=self.pin_memory)
        np.copyto(images.numpy(), images_v)
        if self.pin_memory:
            labels = labels.pin_memory()
        if self.device is not None:
            images = images.to(self.device, non_blocking=self.pin_memory)
            labels = labels.to(self.device, non_blocking=self.pin_memory)
            if normalize is not None:
                images = normalize(images)
        return images, labels
