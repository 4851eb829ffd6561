"""Crop geometry, as torchvision computes it: RandomResizedCrop's random box, Resize's
output size, CenterCrop's offsets, and the source window a fused sample reads."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["rrc_params", "resized_size", "crop_offset", "crop_span", "Window", "RRCGeometry",
           "ResizeCropGeometry"]


def rrc_params(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
               rng: np.random.Generator) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: (top, left, h, w); numpy RNG."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)  # fallback: central crop
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resized_size(height: int, width: int, size: tuple[int, ...] | None,
                 max_size: int | None) -> tuple[int, int]:
    """torchvision's ``_compute_resized_output_size``: the (h, w) ``Resize`` produces."""
    if size is not None and len(size) == 2:
        return size[0], size[1]
    short, long = (width, height) if width <= height else (height, width)
    if size is None:  # only max_size: the longer side becomes max_size
        new_short, new_long = int(max_size * short / long), max_size
    else:
        new_short, new_long = size[0], int(size[0] * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    if new_short <= 0:
        raise ValueError(f"Resize(size={size}, max_size={max_size}) would make the {height}x"
                         f"{width} image's shorter side {new_short} px: raise max_size (or drop "
                         "such extreme aspect ratios)")
    return (new_long, new_short) if width <= height else (new_short, new_long)


def crop_offset(n: int, c: int) -> int:
    """torchvision ``center_crop`` offset of a length-``c`` window on a length-``n``
    axis; negative means the axis is zero-padded by that many pixels before it."""
    if c > n:
        return -((c - n) // 2)
    return int(round((n - c) / 2.0))


def crop_span(n: int, c: int) -> tuple[int, int, int, int]:
    """A length-``c`` centre crop of a length-``n`` axis: ``(r0, r1, o0, o1)``, the
    source pixels ``[r0, r1)`` that land on output pixels ``[o0, o1)`` (the rest of the
    output is padding)."""
    off = crop_offset(n, c)
    r0, r1 = max(off, 0), min(off + c, n)
    return r0, r1, r0 - off, r1 - off


@dataclass(frozen=True)
class Window:
    """Source box (full-resolution pixel coordinates, floats) that maps onto the
    output region ``out[oy0:oy1, ox0:ox1]``; the rest of the output is padding (0)."""

    y0: float
    x0: float
    y1: float
    x1: float
    oy0: int
    ox0: int
    oy1: int
    ox1: int


@dataclass(frozen=True)
class RRCGeometry:
    """RandomResizedCrop: a random box resized to the whole output."""

    scale: tuple[float, float]
    ratio: tuple[float, float]

    def window(self, height: int, width: int, out_hw: tuple[int, int],
               rng: np.random.Generator) -> Window:
        i, j, h, w = rrc_params(height, width, self.scale, self.ratio, rng)
        return Window(i, j, i + h, j + w, 0, 0, out_hw[0], out_hw[1])


@dataclass(frozen=True)
class ResizeCropGeometry:
    """Resize(size, max_size) followed by CenterCrop(out_hw) (padding if needed)."""

    size: tuple[int, ...] | None
    max_size: int | None

    def window(self, height: int, width: int, out_hw: tuple[int, int],
               rng: np.random.Generator) -> Window:
        nh, nw = resized_size(height, width, self.size, self.max_size)
        (ry0, ry1, oy0, oy1), (rx0, rx1, ox0, ox1) = (
            crop_span(nh, out_hw[0]), crop_span(nw, out_hw[1]))
        sy, sx = height / nh, width / nw
        return Window(ry0 * sy, rx0 * sx, ry1 * sy, rx1 * sx, oy0, ox0, oy1, ox1)
