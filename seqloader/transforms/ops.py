"""The geometric transforms of the ImageNet recipes (torchvision names and semantics, on
HWC uint8 RGB numpy images or CHW float arrays; conventions in :mod:`seqloader.transforms`)
and :func:`decode_rgb`."""
from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .geometry import crop_offset, resized_size, rrc_params
from .jpegwindow import as_buffer, decode
from .resample import interpolation_name, resize
from .rng import Rng, get_default_rng

__all__ = ["Compose", "RandomResizedCrop", "RandomHorizontalFlip", "Resize", "CenterCrop",
           "decode_rgb"]


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
