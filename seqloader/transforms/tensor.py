"""Conversion to float tensors: :class:`ToTensor` and :class:`Normalize` on numpy CHW
arrays (CPU), :class:`DeviceNormalize` on a uint8 torch batch on its device."""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from .rng import Rng

__all__ = ["ToTensor", "Normalize", "DeviceNormalize"]


class ToTensor:
    """HWC (or HW) uint8 -> CHW float32 in [0, 1] (``x / 255`` in float32); other dtypes
    are only transposed.  Returns a **numpy** array (no torch needed)."""

    accepts_rng = True

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        img = np.asarray(img)
        if img.ndim == 2:
            img = img[:, :, None]
        if img.ndim != 3:
            raise ValueError(f"ToTensor expects an HWC or HW image, got shape {img.shape}")
        chw = img.transpose(2, 0, 1)
        if img.dtype != np.uint8:
            return np.ascontiguousarray(chw)
        out = np.empty(chw.shape, np.float32)
        np.divide(chw, np.float32(255), out=out)
        return out

    def __repr__(self) -> str:
        return "ToTensor()"


def _per_channel(v: Sequence[float] | float) -> tuple[float, ...]:
    """A per-channel tuple; a number applies to every channel (torchvision broadcasts it)."""
    return (float(v),) if isinstance(v, numbers.Real) else tuple(float(x) for x in v)


class Normalize:
    """``(x - mean) / std`` per channel of a CHW float array (float32 arithmetic)."""

    accepts_rng = True

    def __init__(self, mean: Sequence[float] | float, std: Sequence[float] | float,
                 inplace: bool = False) -> None:
        self.mean, self.std = _per_channel(mean), _per_channel(std)
        if not self.mean or not self.std:
            raise ValueError(f"mean={mean!r} and std={std!r} must be non-empty sequences")
        if any(s == 0 for s in self.std):
            raise ValueError(f"std={std!r} contains 0, which would divide by zero")
        self.inplace = bool(inplace)

    def __call__(self, tensor: np.ndarray, rng: Rng = None) -> np.ndarray:
        if not isinstance(tensor, np.ndarray) or tensor.dtype.kind != "f":
            raise TypeError(f"Normalize expects a floating CHW array (apply ToTensor first), "
                            f"got {type(tensor).__name__} {getattr(tensor, 'dtype', '')}")
        n = max(len(self.mean), len(self.std))
        if tensor.ndim < 3 or n > 1 and tensor.shape[-3] != n:
            raise ValueError(f"Normalize expects a CHW array with {n} channel(s) (its "
                             f"mean/std), got shape {tensor.shape}"
                             + (" -- an HWC image? apply ToTensor first"
                                if tensor.ndim == 3 and tensor.shape[-1] == n else ""))
        mean = np.asarray(self.mean, tensor.dtype).reshape(-1, 1, 1)
        std = np.asarray(self.std, tensor.dtype).reshape(-1, 1, 1)
        if not std.all():
            raise ValueError(f"std={self.std} is zero in {tensor.dtype} (too small to divide by); "
                             "check the Normalize arguments")
        out = tensor if self.inplace else np.empty_like(tensor)
        np.subtract(tensor, mean, out=out)
        np.divide(out, std, out=out)
        return out

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std}, inplace={self.inplace})"


class DeviceNormalize:
    """uint8 NHWC batch tensor -> float32 NCHW ``(x / 255 - mean) / std`` in
    ``torch.channels_last`` memory format, computed on the batch's device.

    Move the uint8 batch first (``batch.to(device, non_blocking=True)``: 4x fewer bytes
    over the bus than float32), then call this.  torch is imported on first use; the
    per-device constants are cached and not pickled.  Thread-safe.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or any(s == 0 for s in self.std):
            raise ValueError(f"mean={mean!r}/std={std!r}: need equal lengths and no zero std")
        self._cache: dict = {}

    def __getstate__(self) -> dict:
        return {"mean": self.mean, "std": self.std}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["mean"], state["std"])

    def __call__(self, batch: Any) -> Any:
        import torch

        if batch.dim() != 4 or batch.dtype != torch.uint8:
            raise ValueError(f"expected a uint8 NHWC batch, got {batch.dtype} {tuple(batch.shape)}")
        key = str(batch.device)
        if key not in self._cache:
            std = torch.tensor(self.std, dtype=torch.float32)
            mean = torch.tensor(self.mean, dtype=torch.float32)
            # x/255/std - mean/std as one multiply-add (float32; matches Normalize to ~1e-6)
            self._cache[key] = ((1.0 / (255.0 * std)).view(1, -1, 1, 1).to(batch.device),
                                (-mean / std).view(1, -1, 1, 1).to(batch.device))
        scale, bias = self._cache[key]
        x = batch.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.channels_last)
        return x.mul_(scale).add_(bias)

    def __repr__(self) -> str:
        return f"DeviceNormalize(mean={self.mean}, std={self.std})"
