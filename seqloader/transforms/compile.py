"""From a recipe to what a worker runs: :func:`compile_fused` recognises the standard
recipes (seqloader's or torchvision's classes) and builds a :class:`FusedPipeline`;
:func:`adapt` wraps any other transform for the generic path."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .fused import FusedPipeline
from .geometry import ResizeCropGeometry, RRCGeometry
from .ops import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize
from .rng import Rng
from .tensor import Normalize, ToTensor

__all__ = ["compile_fused", "adapt"]


def _is_torchvision(t: Any) -> bool:
    return type(t).__module__.startswith("torchvision")


def compile_fused(transform: Any, *, output: str = "float",
                  reduced_decode: bool = True, partial_decode: bool = True,
                  eval_mode: str = "exact") -> FusedPipeline | None:
    """A :class:`FusedPipeline` for the standard recipes, else None (use the generic path).

    Recognised (seqloader classes, or the same torchvision v1 classes, converted; the
    randomness then comes from the ``rng`` passed to the pipeline, not from torch)::

        Compose([RandomResizedCrop(s), RandomHorizontalFlip(p)?, ToTensor()?, Normalize()?])
        Compose([Resize(r), CenterCrop(s),  RandomHorizontalFlip(p)?, ToTensor()?, Normalize()?])

    (Normalize only after ToTensor).  ``output="float"`` writes what the transform
    returns: ``(3, H, W) float32`` with ToTensor, else ``(H, W, 3) uint8``.
    ``output="uint8"`` always writes the ``(H, W, 3) uint8`` image before ToTensor /
    Normalize; finish on the device with :meth:`FusedPipeline.device_normalize`.
    ``reduced_decode=False`` disables reduced-scale JPEG decoding and
    ``partial_decode=False`` decoding only the rows above the crop's bottom (NOTE
    [ row-limited decode ] in ``seqloader/transforms/jpegwindow.py``; never changes a
    pixel); both are for comparisons.
    ``eval_mode`` (Resize + CenterCrop only): ``"exact"`` gives the unfused transforms'
    pixels (bit-identical: the top rows of the whole image are resized, then cropped);
    ``"approximate"`` resizes only the crop box rounded to whole decoded pixels, from a
    reduced-scale decode where the box allows -- faster, but a few grey levels off on
    detailed photos (NOTE [ exact evaluation crops ] in ``seqloader/transforms/fused.py``).
    A :class:`FusedPipeline` passed as ``transform`` is returned as it is (rebuilt for
    another ``output``), so the Loader takes e.g. ``compile_fused(recipe,
    eval_mode="approximate")`` as its transform.
    The pipeline consumes ``rng`` exactly as ``transform(img, rng)`` would, and gives
    the same pixels when no reduced decode applies (RandomResizedCrop: otherwise
    docs/transforms.md, "Training crops", has the distance) and, for Resize + CenterCrop, in
    ``eval_mode="exact"``.
    """
    if output not in ("float", "uint8"):
        raise ValueError(f"output={output!r}: use 'float' or 'uint8'")
    if isinstance(transform, FusedPipeline):
        return transform if transform.output == output else transform.with_output(output)
    if _is_torchvision(transform):
        transform = _from_torchvision(transform)
    if not isinstance(transform, Compose):
        return None
    ts, n = transform.transforms, len(transform.transforms)
    i = 1
    first = ts[0] if ts else None
    if isinstance(first, RandomResizedCrop):
        geometry, out_hw = RRCGeometry(first.scale, first.ratio), first.size
    elif isinstance(first, Resize) and n > 1 and isinstance(ts[1], CenterCrop):
        geometry, out_hw, i = ResizeCropGeometry(first._size, first.max_size), ts[1].size, 2
    else:
        return None
    flip_p, to_tensor = None, False
    mean = std = None
    if i < n and isinstance(ts[i], RandomHorizontalFlip):
        flip_p, i = ts[i].p, i + 1
    if i < n and isinstance(ts[i], ToTensor):
        to_tensor, i = True, i + 1
        if i < n and isinstance(ts[i], Normalize):
            mean, std, i = ts[i].mean, ts[i].std, i + 1
            if len(mean) not in (1, 3) or len(std) not in (1, 3):
                return None
    if i != n:
        return None
    return FusedPipeline(geometry, out_hw, mode=first.interpolation, antialias=first.antialias,
                         flip_p=flip_p, to_tensor=to_tensor, mean=mean, std=std, output=output,
                         reduced_decode=reduced_decode, partial_decode=partial_decode,
                         eval_mode=eval_mode)


_TV_NAMES = ("Compose", "RandomResizedCrop", "RandomHorizontalFlip", "Resize", "CenterCrop",
             "ToTensor", "Normalize")


def _from_torchvision(t: Any) -> Any:
    """The seqloader equivalent of a torchvision (v1) recipe, or None if any part is
    not one of the recognised classes."""
    name = type(t).__name__
    if name not in _TV_NAMES or ".v2" in type(t).__module__:
        return None
    if name == "Compose":
        parts = [_from_torchvision(x) for x in t.transforms]
        return None if any(p is None for p in parts) else Compose(parts)
    try:
        if name == "RandomResizedCrop":
            return RandomResizedCrop(t.size, t.scale, t.ratio, t.interpolation, t.antialias)
        if name == "RandomHorizontalFlip":
            return RandomHorizontalFlip(t.p)
        if name == "Resize":
            return Resize(t.size, t.interpolation, t.max_size, t.antialias)
        if name == "CenterCrop":
            return CenterCrop(t.size)
        if name == "Normalize":
            return Normalize(t.mean, t.std, t.inplace)
        return ToTensor()
    except (AttributeError, ValueError, TypeError):
        return None


class _TorchvisionAdapter:
    """Run a torchvision transform on ``PIL.Image.fromarray(img)``; torch's global RNG is
    seeded from ``rng`` first (when given) so results are reproducible."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        from PIL import Image

        if rng is not None:
            try:
                import torch
            except ImportError:  # pragma: no cover - torchvision implies torch
                pass
            else:
                torch.manual_seed(int(rng.integers(0, 2**63 - 1)))
        return _to_numpy(self.transform(Image.fromarray(img)))

    def __repr__(self) -> str:
        return f"adapt({self.transform!r})"


class _CallableAdapter:
    """Call ``transform(img)`` and convert the result to numpy."""

    def __init__(self, transform: Callable) -> None:
        self.transform = transform

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        return _to_numpy(self.transform(img))

    def __repr__(self) -> str:
        return f"adapt({self.transform!r})"


def _to_numpy(x: Any) -> np.ndarray:
    if type(x).__module__.startswith("torch") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    if type(x).__module__.startswith("PIL"):
        return np.array(x)
    return np.asarray(x)


def adapt(transform: Callable) -> Callable[[np.ndarray, Rng], np.ndarray]:
    """A picklable ``(img_rgb_uint8, rng) -> np.ndarray`` for the generic path:
    seqloader transforms (``accepts_rng``) as they are; torchvision transforms get a
    PIL image (torch/PIL results become numpy); other callables get ``t(img)``."""
    if getattr(transform, "accepts_rng", False):
        return transform
    if _is_torchvision(transform):
        return _TorchvisionAdapter(transform)
    if not callable(transform):
        raise ValueError(f"transform={transform!r} is not callable")
    return _CallableAdapter(transform)
