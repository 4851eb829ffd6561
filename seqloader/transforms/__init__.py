"""OpenCV/numpy versions of the torchvision transforms of the ImageNet recipe, and a
fused decode-to-sample fast path.

Conventions (every class here):

* ``t(img, rng=None)``: ``img`` is an HWC **RGB** uint8 numpy image (HW for gray) or,
  after :class:`ToTensor`, a CHW float32 numpy array.  Floating 3-D arrays are taken as
  CHW (1, 3 or 4 channels first, else a ValueError), everything else as HWC/HW; other
  array-likes (PIL images, CPU tensors) are converted with ``np.asarray``.  ``rng`` is a ``numpy.random.Generator``; random
  transforms draw from it only.  With ``rng=None`` they use this process's default
  generator (:func:`get_default_rng`), created from fresh OS entropy at import and
  reseeded by :func:`seed_default`.  Spawned workers therefore differ, but forked ones
  share the parent's state: pass explicit generators for reproducibility.
* Same names, arguments, defaults and semantics as ``torchvision.transforms`` (v1),
  including the rounding rules; randomness comes from numpy instead of torch, so
  the *distribution* matches torchvision, not the exact stream.
* Classes carry ``accepts_rng = True``; :class:`Compose` passes ``rng`` to transforms
  that have it and calls others as ``t(img)``.
* Picklable (plain attributes only; interpolation is stored as its string name),
  stateless, thread-safe and reentrant.  Nothing keeps OpenCV objects or threads.
* Resampling: see NOTE [ interpolation equivalence ] in ``seqloader/transforms/fused.py``.
  Upscales use ``cv2.INTER_LINEAR`` (bicubic: ``INTER_CUBIC``).  Antialiased downscales
  do *not* use ``cv2.INTER_AREA``: its fractional-factor path costs more than the JPEG
  decode; instead exact 2x box halvings + a variance-matched 3-tap blur + bilinear,
  ~4x faster and closer to PIL/torchvision.
* :class:`ToTensor` returns a numpy float32 array, not a torch tensor (the Loader
  stacks samples into torch batch tensors); this module needs no torch.

:func:`compile_fused` turns the standard recipes into a :class:`FusedPipeline` that
goes from JPEG bytes to the finished sample: the crop is sampled from the JPEG header
(same ``rng`` draws as the unfused transforms), the JPEG is decoded straight to RGB
at 1/2, 1/4 or 1/8 scale when the crop is at least that many times the output size
(libjpeg DCT scaling; never below the output resolution) and only down to the crop's
last row (NOTE [ row-limited decode ]), only the crop is resized,
into ``out`` itself (uint8) or a per-thread scratch buffer, and flip + ToTensor +
Normalize become one table lookup per pixel writing ``out``.  :func:`adapt` wraps
any other transform (including torchvision ones) for the generic path.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .fused import (FusedPipeline, ResizeCropGeometry, RRCGeometry, as_buffer, crop_offset,
                    decode, get_default_rng, interpolation_name, resize, resized_size,
                    rrc_params, seed_default)

__all__ = ["Compose", "RandomResizedCrop", "RandomHorizontalFlip", "Resize", "CenterCrop",
           "ToTensor", "Normalize", "DeviceNormalize", "FusedPipeline", "compile_fused",
           "adapt", "decode_rgb", "seed_default", "get_default_rng"]

Rng = np.random.Generator | None


def decode_rgb(data: bytes | memoryview | np.ndarray) -> np.ndarray:
    """Decode encoded image bytes to an HWC uint8 **RGB** array (gray -> 3 equal channels;
    EXIF orientation ignored, like PIL).  Raises ValueError if undecodable."""
    buf = as_buffer(data)
    img = decode(buf)
    if img is None:
        raise ValueError(f"cannot decode image ({buf.size} bytes)")
    return img


def _size2(size: Any, name: str = "size") -> tuple[int, int]:
    """torchvision ``_setup_size``: int or 1-/2-sequence -> (h, w), all > 0."""
    if isinstance(size, numbers.Integral):
        hw = (int(size), int(size))
    elif isinstance(size, Sequence) and not isinstance(size, str) and len(size) in (1, 2):
        hw = (int(size[0]), int(size[-1]))
    else:
        raise ValueError(f"{name}={size!r}: give an int or a sequence (h, w) of 1 or 2 ints")
    if min(hw) <= 0:
        raise ValueError(f"{name}={size!r} must be positive")
    return hw


#: dtypes OpenCV resamples (uint8 images; floating CHW arrays after ToTensor)
_PIXEL_DTYPES = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.int16, np.float32,
                                                 np.float64))


def _hwc(img: Any) -> tuple[np.ndarray, bool]:
    """(HWC/HW view, was_chw): floating 3-D arrays are CHW tensors (after ToTensor), so
    their first axis must be 1, 3 or 4 channels.  Raises TypeError/ValueError naming
    what was passed (and what to pass) instead of resampling the wrong axes."""
    if not isinstance(img, np.ndarray):
        if not hasattr(img, "__array__"):
            raise TypeError(f"expected a numpy image (HWC uint8 RGB), got {type(img).__name__}")
        img = np.asarray(img)  # PIL images, CPU tensors
    if img.dtype not in _PIXEL_DTYPES:
        raise ValueError(f"image dtype {img.dtype} is not supported: pass an HWC uint8 image "
                         "(img.astype(np.uint8)) or a float32 CHW array from ToTensor")
    if img.ndim == 3 and img.dtype.kind == "f":
        if img.shape[0] not in (1, 3, 4):
            raise ValueError(f"floating arrays are taken as CHW (after ToTensor), but shape "
                             f"{img.shape} has {img.shape[0]} channels first: pass an HWC "
                             "uint8 image, or transpose to CHW")
        return img.transpose(1, 2, 0), True
    if img.ndim not in (2, 3):
        raise ValueError(f"expected an HWC/HW image or CHW array, got shape {img.shape}")
    if img.ndim == 3 and img.shape[2] not in (1, 3, 4):
        raise ValueError(f"an integer image must be HWC with 1, 3 or 4 channels, but shape "
                         f"{img.shape} has {img.shape[2]} last"
                         + (" -- it looks like CHW (torchvision.io.read_image's layout): pass "
                            "img.permute(1, 2, 0).numpy()" if img.shape[0] in (1, 3, 4) else ""))
    return img, False


def _back(img: np.ndarray, chw: bool) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1)) if chw else img


class Compose:
    """Apply ``transforms`` in order, passing ``rng`` to those with ``accepts_rng``."""

    accepts_rng = True

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, img: Any, rng: Rng = None) -> Any:
        rng = get_default_rng() if rng is None else rng
        for t in self.transforms:
            img = t(img, rng) if getattr(t, "accepts_rng", False) else t(img)
        return img

    def __repr__(self) -> str:
        body = "".join(f"\n    {t!r}" for t in self.transforms)
        return f"{type(self).__name__}({body}\n)"


class RandomResizedCrop:
    """Crop a random area/aspect box (torchvision's sampling: 10 tries, then a central
    crop) and resize it to ``size``."""

    accepts_rng = True

    def __init__(self, size: int | Sequence[int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
                 interpolation: Any = "bilinear", antialias: bool | None = True) -> None:
        self.size = _size2(size)
        if not (isinstance(scale, Sequence) and isinstance(ratio, Sequence)) or (
                len(scale) != 2 or len(ratio) != 2):
            raise ValueError(f"scale={scale!r} and ratio={ratio!r} must be (min, max) pairs")
        if not 0 <= scale[0] <= scale[1] or scale[1] <= 0:
            raise ValueError(f"scale={scale!r}: need 0 <= min <= max, max > 0 (e.g. (0.08, 1.0))")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio={ratio!r}: need 0 < min <= max (e.g. (3/4, 4/3))")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation_name(interpolation)
        self.antialias = True if antialias is None else bool(antialias)

    @staticmethod
    def get_params(img: np.ndarray | tuple[int, int], scale: Sequence[float],
                   ratio: Sequence[float], rng: Rng = None) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop for ``img`` (an HWC image or (h, w))."""
        h, w = img if isinstance(img, tuple) else _hwc(img)[0].shape[:2]
        return rrc_params(h, w, tuple(scale), tuple(ratio),
                          get_default_rng() if rng is None else rng)

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        hwc, chw = _hwc(img)
        i, j, h, w = self.get_params(hwc.shape[:2], self.scale, self.ratio, rng)
        out = resize(hwc[i:i + h, j:j + w], self.size[0], self.size[1], self.interpolation,
                     self.antialias)
        return _back(out, chw)

    def __repr__(self) -> str:
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, "
                f"interpolation={self.interpolation!r}, antialias={self.antialias})")


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (one ``rng.random()`` draw per call)."""

    accepts_rng = True

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p={p!r} must be a probability in [0, 1]")
        self.p = float(p)

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        rng = get_default_rng() if rng is None else rng
        if rng.random() < self.p:
            hwc, chw = _hwc(img)
            return _back(np.ascontiguousarray(hwc[:, ::-1]), chw)
        return img

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Resize:
    """Resize to ``size``: (h, w), or an int/1-sequence for the shorter side (the longer
    side is ``int(size * long / short)``, then capped at ``max_size``); ``size=None``
    with ``max_size`` sets the longer side.  Same-size input is returned as is."""

    accepts_rng = True

    def __init__(self, size: int | Sequence[int] | None, interpolation: Any = "bilinear",
                 max_size: int | None = None, antialias: bool | None = True) -> None:
        if size is None:
            if max_size is None:
                raise ValueError("size=None needs max_size (the length of the longer side)")
            self._size: tuple[int, ...] | None = None
        elif isinstance(size, numbers.Integral) or (isinstance(size, Sequence) and len(size) == 1):
            self._size = (_size2(size)[0],)
        else:
            self._size = _size2(size)
            if max_size is not None:
                raise ValueError(f"max_size={max_size} only applies when size is an int "
                                 f"(shorter side); got size={size!r}")
        if max_size is not None and (max_size <= 0 or (self._size and max_size <= self._size[0])):
            raise ValueError(f"max_size={max_size} must be > 0 and larger than size={size!r}")
        self.size, self.max_size = size, max_size
        self.interpolation = interpolation_name(interpolation)
        self.antialias = True if antialias is None else bool(antialias)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The (h, w) an input of ``height x width`` is resized to."""
        return resized_size(height, width, self._size, self.max_size)

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        hwc, chw = _hwc(img)
        oh, ow = self.output_size(*hwc.shape[:2])
        return _back(resize(hwc, oh, ow, self.interpolation, self.antialias), chw)

    def __repr__(self) -> str:
        return (f"Resize(size={self.size!r}, interpolation={self.interpolation!r}, "
                f"max_size={self.max_size}, antialias={self.antialias})")


class CenterCrop:
    """Central ``size`` crop (offsets ``round((n - c) / 2)``); zero-pads (extra pixel at
    the bottom/right) where the image is smaller, as torchvision does."""

    accepts_rng = True

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _size2(size)

    def __call__(self, img: np.ndarray, rng: Rng = None) -> np.ndarray:
        hwc, chw = _hwc(img)
        (h, w), (ch, cw) = hwc.shape[:2], self.size
        oy, ox = crop_offset(h, ch), crop_offset(w, cw)
        if ch <= h and cw <= w:  # (not the offsets: one px too small gives offset 0)
            return _back(hwc[oy:oy + ch, ox:ox + cw], chw)
        out = np.zeros((ch, cw) + hwc.shape[2:], hwc.dtype)
        y0, x0 = max(oy, 0), max(ox, 0)
        y1, x1 = min(oy + ch, h), min(ox + cw, w)
        out[y0 - oy:y1 - oy, x0 - ox:x1 - ox] = hwc[y0:y1, x0:x1]
        return _back(out, chw)

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


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


# --------------------------------------------------------------------------- fused

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
    [ row-limited decode ] in ``seqloader/transforms/fused.py``; never changes a pixel); both are
    for comparisons.
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
    README "Transforms" has the distance) and, for Resize + CenterCrop, in
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


# --------------------------------------------------------------------------- interop

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
