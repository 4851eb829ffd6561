"""Targets other than class indices on their way from a decoder to the caller, and
their collation into a batch.

NOTE [ target region ]
With ``target_kind == "any"`` (NOTE [ targets ] in ``seqloader/format/targets.py``) the
labels region at the front of a batch buffer (NOTE [ batch buffer layout ] in
``batch.py``) is not ``int64 x B`` but :attr:`BatchSpec.labels_nbytes` bytes: the
decoder writes the batch's targets there -- after ``target_transform``, msgpack-packed
as records store them, behind an 8-byte length -- and the caller unpacks them while it
holds the buffer.  The pool's messages and the buffers' handover do not change: only
the region's size and meaning.  Its size is ``max(1 MiB, B x max(16 KiB, 16 x the
first record's packed target))``; shared memory is allocated only where it is
touched, so the reserve costs address space, not memory.  The decoder writes the
region after it has read every record of the batch, so records that lie in it
(NOTE [ batch buffer layout ]) are never overwritten unread.  A batch whose targets
outgrow it fails, naming the sizes.

Collation is ``torch.utils.data.default_collate`` over the targets, as a DataLoader
does; or, with ``collate_fn``, ``collate_fn([(image, target), ...])`` where each
image is one sample of the batch (a view: the images are batched already) -- so a
DataLoader's detection-style ``collate_fn=lambda b: tuple(zip(*b))`` works unchanged.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import msgpack
import numpy as np

from ..format.targets import decode_target, encode_target

__all__ = ["labels_nbytes", "target_region", "region_view", "transformed", "store_targets",
           "load_targets", "collate_batch"]

_LEN = 8  # the region's length prefix (little-endian uint64)


def labels_nbytes(batch_size: int, probe: Any = None, *, any_targets: bool = False) -> int:
    """Bytes of a buffer's labels region: ``8 x batch_size`` for class labels; for any
    targets, room for ``batch_size`` targets like ``probe`` (the first record's target,
    transformed) with a generous reserve (NOTE [ target region ])."""
    if not any_targets:
        return 8 * batch_size
    size = len(msgpack.packb(encode_target(probe), use_bin_type=True))
    return max(1 << 20, batch_size * max(16 << 10, 16 * size)) + _LEN


def target_region(kind: str, nbytes: int) -> np.ndarray:
    """A labels region in ordinary memory (batches decoded in the caller's process)."""
    return np.empty(nbytes // 8, np.int64) if kind == "class" else np.empty(nbytes, np.uint8)


def region_view(kind: str, region: np.ndarray, n: int) -> np.ndarray:
    """What a decoder of an ``n``-record batch is given: ``n`` labels, or the whole region."""
    return region[:n] if kind == "class" else region


def transformed(rec: dict, target_transform: Callable | None, where: str) -> Any:
    """The target of a record (as msgpack unpacked it) after ``target_transform``."""
    target = decode_target(rec["target"], where) if "target" in rec else rec["label"]
    return target_transform(target) if target_transform is not None else target


def store_targets(region: np.ndarray, targets: Sequence[Any]) -> None:
    """Pack ``targets`` into ``region`` (NOTE [ target region ]).  TypeError for a target
    (from ``target_transform``) that cannot be packed, ValueError if they do not fit."""
    encoded = [encode_target(t, f"target {i} of the batch (after target_transform)")
               for i, t in enumerate(targets)]
    blob = msgpack.packb(encoded, use_bin_type=True)
    if _LEN + len(blob) > region.nbytes:
        raise ValueError(f"the batch's {len(targets)} targets pack to {len(blob):,} bytes, more "
                         f"than the {region.nbytes - _LEN:,} a batch buffer holds for them (16 x "
                         "the first record's target per sample); use a smaller batch_size, or a "
                         "target_transform that gives targets of a more even size")
    region[:_LEN].view("<u8")[0] = len(blob)
    region[_LEN:_LEN + len(blob)] = np.frombuffer(blob, np.uint8)


def load_targets(region: np.ndarray) -> list[Any]:
    """The targets :func:`store_targets` packed into ``region`` (a copy: the buffer may
    be reused once this returns)."""
    n = int(region[:_LEN].view("<u8")[0])
    return [decode_target(t, "batch target")
            for t in msgpack.unpackb(region[_LEN:_LEN + n].tobytes(), raw=False)]


def _move(obj: Any, device: Any, pin: bool) -> Any:
    """Tensors in ``obj`` (nested lists, tuples, dicts) pinned and/or moved to ``device``."""
    import torch

    if isinstance(obj, torch.Tensor):
        if pin and obj.device.type == "cpu":
            obj = obj.pin_memory()
        return obj.to(device, non_blocking=pin) if device is not None else obj
    if isinstance(obj, dict):
        return {k: _move(v, device, pin) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device, pin) for v in obj)
    return obj


def collate_batch(batch: tuple[Any, Any], targets: list[Any] | None,
                  collate_fn: Callable | None, device: Any = None, pin: bool = False) -> Any:
    """The batch the Loader yields, from ``(images, labels)`` as the Loader materialized
    it and the batch's ``targets`` (None for class labels, which are ``labels``; pass
    them from the host when ``labels`` is on a device -- its ``tolist()`` would wait for
    the device): ``(images, default_collate(targets))``, or ``collate_fn`` over the
    samples (NOTE [ target region ]); tensors it makes are pinned / moved like the images."""
    if targets is None and collate_fn is None:
        return batch
    from torch.utils.data import default_collate

    images, labels = batch
    if targets is None:
        targets = labels.tolist()
    if collate_fn is not None:
        return _move(collate_fn(list(zip(images, targets))), device, pin)
    try:
        collated = default_collate(targets)
    except (RuntimeError, TypeError) as e:  # (ragged arrays, None, ...): as DataLoader fails
        raise type(e)(f"default_collate cannot batch these targets ({e}); pass the Loader a "
                      "collate_fn, e.g. collate_fn=lambda batch: tuple(zip(*batch)) for "
                      "detection-style targets of varying size") from e
    return images, _move(collated, device, pin)


def spec_fields(db: Any, batch_size: int, target_transform: Callable | None) -> dict[str, Any]:
    """The :class:`~seqloader.dataflow.batch.BatchSpec` fields for ``db``'s targets:
    its kind and, for "any" targets, the region size from its first record's target
    after ``target_transform`` (NOTE [ target region ])."""
    kind = db.metas[0].target_kind
    if kind == "class":
        return {"target_kind": kind, "target_nbytes": 0}
    rec = db.first_record()
    probe = target_transform(rec.target) if target_transform is not None else rec.target
    return {"target_kind": kind,
            "target_nbytes": labels_nbytes(batch_size, probe, any_targets=True)}
