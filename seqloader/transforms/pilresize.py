"""PIL's bilinear resample (``Image.resize(size, Image.BILINEAR)``), bit-exact, in numpy.

NOTE [ exact PIL bilinear ]
torchvision resizes PIL images with Pillow's ``ImagingResample`` (src/libImaging/Resample.c):
separable passes, each output sample ``x`` a normalised triangle filter over the input::

    scale = in / out;  fs = max(scale, 1);  support = 1.0 * fs;  center = (x + 0.5) * scale
    taps i in [int(center - support + 0.5), int(center + support + 0.5)) clipped to [0, in)
    w_i = max(0, 1 - |(i - center + 0.5) / fs|) / sum(w)
    k_i = int(w_i * 2**22 +- 0.5)            (PRECISION_BITS = 32 - 8 - 2, rounded half away)
    out = clip8((2**21 + sum(k_i * p_i)) >> 22)

The horizontal pass runs first (Pillow <= 12 always; see :func:`pil_resize`) and its result
is stored as uint8 before the vertical pass.  Upscaling is the same formula with fs = 1
(two taps, one each side).  This module reproduces that with the same float64 coefficient
arithmetic and exact int32 accumulation, so the output equals Pillow's bit for bit.  Each
pass is a few gathers + integer multiply-adds over whole rows; coefficients are cached per
(in, out) length.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

__all__ = ["pil_coeffs", "pil_resize", "pil_resize_top", "pil_reach"]

_BITS = 22  # Pillow's PRECISION_BITS for 8-bit images
_HALF = 1 << (_BITS - 1)


@lru_cache(maxsize=256)
def pil_coeffs(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's bilinear coefficients for resampling ``in_size`` samples to ``out_size``:
    ``(idx, k)``, both ``(out_size, taps)``: input indices (int64) and fixed-point
    weights (int32, each row summing to ~2**22).  Taps Pillow does not use have weight 0
    (and a valid index), and taps whose weight is 0 in every row are dropped.  Cached;
    the arrays are read-only."""
    if in_size < 1 or out_size < 1:
        raise ValueError(f"pil_coeffs: sizes must be >= 1, got {in_size} -> {out_size}")
    scale = in_size / out_size
    fs = max(scale, 1.0)
    support = 1.0 * fs
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    # C's (int) truncates toward zero; both bounds are then clipped as Pillow does
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    arg = (taps[None, :] + xmin[:, None] - center[:, None] + 0.5) * (1.0 / fs)
    w = np.abs(arg)
    w = np.where(w < 1.0, 1.0 - w, 0.0)
    w[taps[None, :] >= xmax[:, None]] = 0.0
    ww = np.zeros(out_size)
    for t in range(ksize):  # Pillow sums left to right: keep its rounding
        ww += w[:, t]
    w = np.divide(w, ww[:, None], out=w, where=ww[:, None] != 0.0)
    k = np.trunc(np.where(w < 0, w * (1 << _BITS) - 0.5, w * (1 << _BITS) + 0.5)).astype(np.int32)
    used = np.flatnonzero(k.any(axis=0))
    k = k[:, :used[-1] + 1] if used.size else k[:, :1]
    idx = np.minimum(xmin[:, None] + np.arange(k.shape[1])[None, :], in_size - 1)
    idx.setflags(write=False)
    k.setflags(write=False)
    return idx, k


def _mix(a: np.ndarray, idx: np.ndarray, k: np.ndarray, axis: int) -> np.ndarray:
    """One pass over 2-D uint8 ``a``: along ``axis`` 0, output row ``j`` is
    ``sum_t k[j, t] * a[idx[j, t]]``; along axis 1 the same per column (``idx``/``k``
    already expanded per channel).  Rounded and clipped to uint8 as Pillow does."""
    n = idx.shape[0]
    shape = (n, a.shape[1]) if axis == 0 else (a.shape[0], n)
    acc = np.full(shape, _HALF, np.int32)
    term = np.empty(shape, np.int32)
    for t in range(idx.shape[1]):
        kt = k[:, t, None] if axis == 0 else k[None, :, t]
        np.multiply(np.take(a, idx[:, t], axis=axis), kt, out=term, dtype=np.int32)
        acc += term
    np.right_shift(acc, _BITS, out=acc)
    np.clip(acc, 0, 255, out=acc)
    return acc.astype(np.uint8)


@lru_cache(maxsize=128)
def _channel_coeffs(in_size: int, out_size: int, ch: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pil_coeffs` for columns of an interleaved ``(h, w * ch)`` image: index
    ``idx * ch + c`` and the weight repeated per channel, rows ``x * ch + c``."""
    idx, k = pil_coeffs(in_size, out_size)
    cidx = (idx[:, None, :] * ch + np.arange(ch)[None, :, None]).reshape(-1, idx.shape[1])
    ck = np.repeat(k, ch, axis=0)
    cidx.setflags(write=False)
    ck.setflags(write=False)
    return cidx, ck


def pil_resize(src: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """``src`` (HWC or HW uint8) resized to ``(out_h, out_w)`` exactly as Pillow's
    ``Image.resize((out_w, out_h), Image.BILINEAR)`` of the same pixels (NOTE [ exact PIL
    bilinear ]): horizontal pass, uint8 rounding, vertical pass.  Pillow 13 runs the
    vertical pass first when the height shrinks much more than the width (a speed
    choice); there the two orders differ by <= 1 grey level on some pixels."""
    if src.dtype != np.uint8:
        raise ValueError(f"pil_resize: needs a uint8 image, got {src.dtype} (convert first)")
    if out_h < 1 or out_w < 1:
        raise ValueError(f"pil_resize: output size must be >= 1, got {(out_h, out_w)}")
    h, w = src.shape[:2]
    ch = src.shape[2] if src.ndim == 3 else 1
    a = np.ascontiguousarray(src).reshape(h, w * ch)
    if out_w != w:
        a = _mix(a, *_channel_coeffs(w, out_w, ch), axis=1)
    if out_h != h:
        a = _mix(a, *pil_coeffs(h, out_h), axis=0)
    elif out_w == w:
        a = a.copy()
    return a.reshape((out_h, out_w) + src.shape[2:])


def pil_reach(height: int, out_h: int) -> int:
    """Source rows below an output row's centre that its vertical taps may read
    (the filter's support, rounded up, + 1)."""
    return int(math.ceil(max(height / out_h, 1.0))) + 2


def pil_resize_top(src: np.ndarray, height: int, out_h: int, out_w: int) -> np.ndarray:
    """The top rows of ``pil_resize(whole, out_h, out_w)`` for an image ``whole`` of
    ``height`` rows whose first ``len(src)`` rows (all columns) are ``src``: every output
    row whose taps all lie in ``src``, bit-identical to the whole image's (the
    coefficients come from the whole image's height)."""
    if src.shape[0] == height:
        return pil_resize(src, out_h, out_w)
    if src.shape[0] > height:
        raise ValueError(f"pil_resize_top: {src.shape[0]} rows is more than height={height}")
    idx, k = pil_coeffs(height, out_h)
    last = np.where(k != 0, idx, 0).max(axis=1)  # the lowest row each output row reads
    rows = int(np.searchsorted(np.maximum.accumulate(last), src.shape[0]))
    w = src.shape[1]
    ch = src.shape[2] if src.ndim == 3 else 1
    a = np.ascontiguousarray(src).reshape(src.shape[0], w * ch)
    if out_w != w:
        a = _mix(a, *_channel_coeffs(w, out_w, ch), axis=1)
    if out_h != height:
        # taps past the rows given have weight 0 (else the row is not rendered): any index
        a = _mix(a, np.minimum(idx[:rows], src.shape[0] - 1), k[:rows], axis=0)
    else:
        a = a[:rows].copy()
    return a.reshape((rows, out_w) + src.shape[2:])
