"""Resampling with OpenCV, matched to torchvision's (PIL's) antialiased filters.

NOTE [ interpolation equivalence ]
torchvision (PIL, and tensors with ``antialias=True``) downscales bilinearly with a
triangle filter whose support grows with the scale factor s.  OpenCV has no such
filter, and ``cv2.INTER_AREA`` (box averaging) was measured 3-4x slower than the
whole alternative below for the fractional factors RandomResizedCrop produces (its
fractional path is scalar code: ~1 ms for a 375x500 -> 224x224 crop, more than the
JPEG decode) and it is *further* from PIL (mean abs difference 0.62 vs 0.50 grey
levels on photo-like images).  So an antialiased downscale here is:
1. exact 2x box reductions (``INTER_LINEAR`` at exactly 2x, SIMD) of each axis while
   it is >= 2x the target (a reduced-scale JPEG decode plays this role in the fused
   path); an odd length's last row/column becomes a halved pixel of its own and step 3
   maps the output onto the source's true extent (e.g. 499.5 halved px for 999 px) --
   dropping it stretched odd sizes by up to 1 px per halving: 2-6x further from PIL;
2. a 3-tap blur [a, 1-2a, a], a = (s^2 - 1) / 12 for the remaining factor s < 2, which
   makes the total blur variance equal the triangle filter's s^2 / 6;
3. the mode's OpenCV filter: ``INTER_LINEAR`` (bilinear), ``INTER_CUBIC`` (bicubic,
   a=-0.75 vs PIL's -0.5), ``INTER_LANCZOS4`` (lanczos); half-pixel centres as torchvision.
Upscaling uses step 3 only.  ``antialias=False`` uses step 3 only, also when
shrinking (like torchvision's tensor path).  ``box`` is ``INTER_AREA``; ``nearest``
is ``INTER_NEAREST`` and ``nearest-exact`` ``INTER_NEAREST_EXACT``.
``pil-bilinear`` is PIL's own bilinear resample, bit-exact (``pilresize.py``, NOTE [ exact
PIL bilinear ]): always antialiased, as PIL is (``antialias`` is ignored), and ~4-5x the
cost of the approximation above (benchmarks/RESULTS.md).
"""
from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from .pilresize import pil_resize, pil_resize_top

__all__ = ["MODES", "PIL_BILINEAR", "SMOOTH_MODES", "TOP_MODES", "WARP_FLAGS", "interpolation_name",
           "resize", "resize_top", "top_reach", "ensure_in"]

MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "lanczos", "pil-bilinear")
#: PIL's exact bilinear resample (NOTE [ exact PIL bilinear ] in ``pilresize.py``)
PIL_BILINEAR = "pil-bilinear"
_UP = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "box": cv2.INTER_AREA,
       "lanczos": cv2.INTER_LANCZOS4}
_NEAREST = {"nearest": cv2.INTER_NEAREST, "nearest-exact": cv2.INTER_NEAREST_EXACT}
#: The modes a box can be sampled in place with (warpAffine), and their OpenCV flags.
WARP_FLAGS = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC,
              "lanczos": cv2.INTER_LANCZOS4}
#: Modes for which a reduced-scale (DCT-scaled, i.e. smoothed) decode is faithful.
SMOOTH_MODES = frozenset(_UP)

#: PIL's resampling constants (``Image.BILINEAR`` == 2, ...), which torchvision also takes
_PIL_MODES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box"}


def interpolation_name(mode: Any) -> str:
    """Normalise ``mode`` (a string, an object with a string ``.value`` such as
    torchvision's ``InterpolationMode``, or a PIL resampling constant) to one of
    :data:`MODES`."""
    value = getattr(mode, "value", mode)
    if isinstance(value, int) and not isinstance(value, bool) and value in _PIL_MODES:
        return _PIL_MODES[value]
    if isinstance(value, str) and value.lower() in MODES:
        return value.lower()
    raise ValueError(f"interpolation={mode!r} is not supported; use one of {', '.join(MODES)} "
                     "(or the matching torchvision InterpolationMode or PIL constant)")


def ensure_in(res: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``dst``, holding ``res``: copied there unless it is ``dst`` already (OpenCV may
    reallocate instead of writing in place; some results are computed elsewhere)."""
    if res is not dst:
        np.copyto(dst, res.reshape(dst.shape))
    return dst


def resize(src: np.ndarray, out_h: int, out_w: int, mode: str, antialias: bool,
           dst: np.ndarray | None = None) -> np.ndarray:
    """Resize HWC (or HW) ``src`` to ``(out_h, out_w)``; see NOTE [ interpolation
    equivalence ].  Writes into ``dst`` when given (and returns it)."""
    sh, sw = src.shape[:2]
    if (sh, sw) == (out_h, out_w):
        return src if dst is None else ensure_in(src, dst)
    if mode == PIL_BILINEAR:
        res = pil_resize(src, out_h, out_w)
        return res if dst is None else ensure_in(res, dst)
    if src.ndim == 3 and src.shape[2] == 1:  # OpenCV drops a single channel axis
        res = resize(src[..., 0], out_h, out_w, mode, antialias,
                     None if dst is None else dst[..., 0])
        return res[..., None] if dst is None else dst
    if mode in _NEAREST:
        flag = _NEAREST[mode]
    elif mode == "box":
        flag = cv2.INTER_AREA
        if (out_h < sh) != (out_w < sw) and out_h != sh and out_w != sw:
            # one axis shrinks, the other grows: OpenCV averages areas only when neither
            # grows (else it interpolates: aliased), so shrink the one axis first
            src = cv2.resize(src, (out_w, sh) if out_w < sw else (sw, out_h), interpolation=flag)
    else:
        flag = _UP[mode]
        if antialias and (out_h < sh or out_w < sw):
            src, ey, ex = _halve(src, out_h, out_w)
            src = _prefilter(src, out_h, out_w, ey, ex)
            if (ey, ex) != src.shape[:2]:  # an odd length was halved: see _halve
                # map the output onto the source's extent, not onto the last pixel
                # added for it (OpenCV's size from fx/fy is out_h or one more)
                res = cv2.resize(src, None, fx=out_w / ex, fy=out_h / ey, interpolation=flag)
                res = res[:out_h, :out_w]
                return res if dst is None else ensure_in(res, dst)
    if dst is None:
        return cv2.resize(src, (out_w, out_h), interpolation=flag)
    return ensure_in(cv2.resize(src, (out_w, out_h), dst=dst, interpolation=flag), dst)


def resize_top(src: np.ndarray, extent: tuple[int, int], out_h: int, out_w: int, mode: str,
               antialias: bool) -> np.ndarray:
    """The top rows of ``resize(whole, out_h, out_w, ...)`` for an image ``whole`` of
    ``extent`` (h, w) whose rows ``[0, len(src))`` (all columns) are ``src``: every
    output row whose inputs -- :func:`top_reach` source rows below it -- are in ``src``
    has exactly the whole resize's pixels (OpenCV maps output to source positions from
    the scale and the origin, both the same here).  NOTE [ exact evaluation crops ] in
    ``fused.py``"""
    eh, ew = extent
    if src.shape[0] == eh:
        return resize(src, out_h, out_w, mode, antialias)
    if mode not in TOP_MODES:
        raise ValueError(f"resize_top: {mode!r} needs the whole image (TOP_MODES)")
    if src.shape[1] != ew or src.shape[0] > eh:
        raise ValueError(f"resize_top: {src.shape[:2]} is not the top of a {extent} image")
    if mode == PIL_BILINEAR:  # only the rows it can render exactly (<= top_reach's)
        return pil_resize_top(src, eh, out_h, out_w)
    if mode == "box" and (out_h < eh) != (out_w < ew) and out_h != eh and out_w != ew:
        raise ValueError("resize_top: 'box' with one axis growing needs the whole image")
    if src.ndim == 3 and src.shape[2] == 1:
        return resize_top(src[..., 0], extent, out_h, out_w, mode, antialias)[..., None]
    ey, ex = float(eh), float(ew)
    if mode == "nearest":
        flag = cv2.INTER_NEAREST
    elif mode == "box":
        flag = cv2.INTER_AREA
    else:
        flag = cv2.INTER_LINEAR
        if antialias and (out_h < eh or out_w < ew):
            src, ey, ex = _halve(src, out_h, out_w, ey, ex)
            src = _prefilter(src, out_h, out_w, ey, ex)
    fx, fy = out_w / ex, out_h / ey
    res = cv2.resize(src, None, fx=fx, fy=fy, interpolation=flag)
    if res.shape[:2] == src.shape[:2] and (fx, fy) != (1.0, 1.0):
        # OpenCV copies the source, whatever fx and fy, when the size it computes from
        # them is the source's (e.g. the top 296 of 683 rows halved, at 341/341.5: up to
        # 59 grey levels off).  Padded to the whole image's extent + 1 with its last
        # row (or column), which only rows (columns) past the valid ones read, the sizes
        # differ -- as they do for the whole image
        axis = 0 if fy != 1.0 else 1
        n = math.ceil(ey if axis == 0 else ex) + 1 - src.shape[axis]
        edge = src[-1:] if axis == 0 else src[:, -1:]
        res = cv2.resize(np.concatenate([src, np.repeat(edge, max(1, n), axis=axis)], axis=axis),
                         None, fx=fx, fy=fy, interpolation=flag)
    return res[:, :out_w]


#: Modes whose OpenCV resize of an image's top rows is the top of the whole image's: not
#: INTER_NEAREST_EXACT (its mapping comes from the sizes, not the scale) nor INTER_CUBIC /
#: INTER_LANCZOS4 (rows differ by 1 grey level depending on the output's height: measured
#: far from the cut, single-threaded too)
TOP_MODES = frozenset(("bilinear", "box", "nearest", PIL_BILINEAR))


def top_reach(height: int, out_h: int) -> int:
    """Source rows below an output row's position that :func:`resize_top` may read:
    the widest kernel (Lanczos, 4 px) + the prefilter's 1 + rounding and an odd last
    row, in halved px (<= the scale factor source px each)."""
    return 6 * max(1, math.ceil(height / out_h)) + 2


def _halve(src: np.ndarray, out_h: int, out_w: int, ey: float | None = None,
           ex: float | None = None) -> tuple[np.ndarray, float, float]:
    """Exact 2x box reductions of each axis while the source is >= 2x the target there.
    INTER_LINEAR at exactly 2x averages pixel pairs; an odd length's last row/column
    becomes a pixel of its own (averaged with itself), so nothing is dropped, and the
    source's extent in halved pixels (e.g. 499.5 for 999 px) is returned with the
    result: ``(halved, extent_h, extent_w)``, which the final resample maps the
    output onto.  ``ey``/``ex``: the source's extent when ``src`` is only its top
    (:func:`resize_top`)."""
    ey = float(src.shape[0]) if ey is None else ey
    ex = float(src.shape[1]) if ex is None else ex
    while True:
        h, w = src.shape[:2]
        hy, hx = ey >= 2 * out_h, ex >= 2 * out_w
        if not (hy or hx):
            return src, ey, ex
        h2, w2 = (h - h % 2 if hy else h), (w - w % 2 if hx else w)
        nh, nw = (h2 // 2 if hy else h), (w2 // 2 if hx else w)
        out = cv2.resize(src[:h2, :w2], (nw, nh), interpolation=cv2.INTER_LINEAR)
        if hy and h % 2:  # the odd last row, halved along x where x is halved
            row = src[h - 1:h, :w2]
            out = np.concatenate([out, cv2.resize(row, (nw, 1), interpolation=cv2.INTER_LINEAR)
                                  if hx else row], axis=0)
        if hx and w % 2:  # the odd last column (with the corner), halved along y likewise
            col = src[:, w - 1:w]
            col = np.concatenate([cv2.resize(col[:h2], (1, nh), interpolation=cv2.INTER_LINEAR),
                                  col[h2:]], axis=0) if hy else col
            out = np.concatenate([out, col.reshape(out.shape[0], 1, *out.shape[2:])], axis=1)
        src = out
        ey, ex = (ey / 2 if hy else ey), (ex / 2 if hx else ex)


def _prefilter(src: np.ndarray, out_h: int, out_w: int, ey: float | None = None,
               ex: float | None = None) -> np.ndarray:
    """3-tap [a, 1-2a, a] blur per shrinking axis (remaining factor s < 2), with
    a = (s^2 - 1) / 12, so that blur + bilinear sampling has the variance (s^2 / 6) of
    the triangle filter PIL/torchvision use for an antialiased bilinear downscale.
    ``ey``/``ex``: the source's extent when it differs from the array's (:func:`_halve`)."""
    sy = (src.shape[0] if ey is None else ey) / out_h
    sx = (src.shape[1] if ex is None else ex) / out_w
    if sy <= 1.05 and sx <= 1.05:  # nearly 1:1, bilinear alone is fine
        return src
    ay, ax = (max(s * s - 1.0, 0.0) / 12.0 for s in (sy, sx))
    return cv2.sepFilter2D(src, -1, np.array([ax, 1 - 2 * ax, ax], np.float32),
                           np.array([ay, 1 - 2 * ay, ay], np.float32),
                           borderType=cv2.BORDER_REPLICATE)
