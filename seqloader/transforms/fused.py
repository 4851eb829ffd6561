"""Private helpers of :mod:`seqloader.transforms`: decoding, interpolation, geometry
and the fused decode-crop-resize-flip-normalise pipeline.

Everything here is stateless or holds only plain, picklable data (scratch buffers
live in a per-thread ``threading.local`` that is dropped when pickling), so it can
be shipped to spawn workers and called from several threads at once.

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

NOTE [ row-limited decode ]
A sequential (baseline or extended, Huffman-coded) JPEG is one scan of MCU rows, top
to bottom, and a decoder that has produced the rows it needs can stop: nothing below
them is entropy-decoded -- the part of the work DCT scaling cannot shrink (a 1/8-scale
decode still costs ~50-70 % of a full one).  libjpeg has no "stop here" switch that
OpenCV exposes, but the frame height is just two bytes of the SOF header: we decode a
copy whose header says ``rows`` (rows = the crop's last row + the resampling kernel's
reach + one decoded row, the one chroma upsampling changes at a stopped decode's
bottom, rounded up to whole MCU rows).
The decoder then reads that many MCU rows and skips the rest of the scan as
"extraneous bytes" -- a warning, which ``simplejpeg`` (libjpeg-turbo's TurboJPEG API)
keeps to itself with ``strict=False`` while OpenCV would print it to stderr for every
image, so these decodes go through simplejpeg.  Every pixel above the margin is
bit-identical to a full decode (IDCT and upsampling of a row depend on nothing below
its MCU row's neighbour; tested on 4:2:0/4:2:2/4:4:4, grey, restart intervals and
every reduced scale).  Progressive and arithmetic-coded JPEGs (several scans, or other
markers) are decoded whole.  simplejpeg also decodes into a reused per-thread buffer
instead of a fresh allocation per image.

NOTE [ restart windows ]
Rows above a crop, and the columns beside it, cannot be skipped that way: Huffman
codes have no boundaries and each block's DC value is coded as a difference from the
previous one, so a decoder must walk every bit before the crop -- unless the JPEG has
restart markers (DRI/RSTn): at each one the bit stream is byte-aligned and the DC
predictors reset, so the data between two markers decodes on its own.  When the
restart segments tile the image in a grid (an interval of whole MCU rows, or of a
divisor of the MCUs in a row, so every row starts a segment), :func:`restart_window`
grows the crop by the render's reach (NOTE [ render reach ], as below it) plus 1
decoded px (``SPLICE_EDGE``: the chroma that upsampling looks at across the edge -- the
spliced image's edge sees itself instead, which changes its outermost decoded pixel) and rounds out to
segment boundaries, and :func:`_splice` builds a JPEG of
just those segments -- in each band of rows the chosen segments are one contiguous run
of bytes -- with the frame size patched and the markers renumbered from RST0 (decoders
check the sequence).  Where the segments are comes from the file's restart index
(NOTE [ restart index ] in ``seqloader/format/jpeg.py``; checked marker by marker) or, without
one, from a scan of the entropy-coded bytes.  Pixels are bit-identical to a full decode (tested at every scale
and chroma layout; each margin mutation-checked).  ``preprocess --restart-markers``
adds such markers losslessly (``jpegtran -restart <m>B -optimize``, m ~ 4 MCUs: 64 px).
Measured (``benchmarks/transforms_bench.py --restart-markers``): a random crop's
segments hold ~50-65 % of an image's pixels; on 2000x1500 photos at 224 px the pipeline
is 2.35-2.42x the plain path on the original files (1.53-1.74x without markers); on
ImageNet-sized images +9-12 % (commit 567d449; +3.5-6 % before NOTE [ render reach ]'s
margins): libjpeg-turbo decodes any file with a restart interval a few % slower (its
fast Huffman path is off in such files) -- so the markers are opt-in.

NOTE [ render reach ]
How far beyond the crop box rendering reads sets the margins above (below the crop,
and around a restart window).  Where the box is cut out (rounded to whole pixels: up
to half a pixel outwards) and resized, OpenCV is handed the slice as a matrix of its
own and reads nothing outside it -- its border modes replicate the slice's edge;
tested: filters and every resize mode give the same result on a view as on a copy --
so 1 decoded px is enough: ``SLICE_REACH``.  Where an upscaled fractional box is
sampled in place (``Resize`` to more than the image, then ``CenterCrop``: warpAffine
over the decoded image), the kernel reads up to 4 px beyond it (Lanczos), plus
rounding: ``WARP_REACH`` = 6 -- and no restart window: warpAffine's fixed-point
sampling positions depend on where the box sits in the decoded image, so moving it (a
window cut from the top or left) changed pixels by 1 grey level here and there; rows
below the box still need not be decoded.  :meth:`FusedPipeline.warps` decides which,
from the plan, and :meth:`FusedPipeline._render` follows the same decision.  Measured
(``benchmarks/decode_floor.py``, 1200x900 photos with markers, RandomResizedCrop(224)):
the decoded region fell from 1.13x to 1.09x the crop's MCUs with the slice's reach.

NOTE [ exact evaluation crops ]
Resize + CenterCrop's crop box falls on fractional source pixels.  Rounding it to whole
(decoded) pixels and resizing only the box -- ``eval_mode="approximate"`` -- shifts and
stretches the sample by up to half a source pixel per edge (k/2 at a 1/k decode, whose
DCT scaling is itself ~2.7 grey levels from a 2x box reduction on detailed photos):
measured 2.6-2.9 grey levels mean on detailed ~500x375 photos at 256/224, single pixels
far more.  Validation figures are compared with published ones, so by default
(``"exact"``) the plan is the unfused transforms': decode at full scale, resize the whole
image, crop.  Only the rows above the crop's bottom plus :func:`top_reach` are decoded
(NOTE [ row-limited decode ]) and resized, all columns: OpenCV maps an output row to
its source position from the scale and the origin, both the same for the image's top
rows as for the whole image (same for the halvings, which pair rows from the top), so
those rows are bit-identical (:func:`resize_top`; tested at every cut residue).  Not
for bicubic/lanczos/nearest-exact (:data:`TOP_MODES`): those decode the whole image.
"""
from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import cv2
import numpy as np

from ..format.decoders import imdecode_quiet
from ..format.jpeg import (JpegFrame, JpegScan, indexed_marks, jpeg_frame, jpeg_scan,
                           restart_layout, restart_marks)

try:
    import simplejpeg
except ImportError:  # a declared dependency; without it OpenCV decodes every image whole
    simplejpeg = None

#: How :class:`FusedPipeline` renders Resize + CenterCrop (NOTE [ exact evaluation crops ])
EVAL_MODES = ("exact", "approximate")
MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "lanczos")
_UP = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "box": cv2.INTER_AREA,
       "lanczos": cv2.INTER_LANCZOS4}
_NEAREST = {"nearest": cv2.INTER_NEAREST, "nearest-exact": cv2.INTER_NEAREST_EXACT}
_WARP = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4}
#: Modes for which a reduced-scale (DCT-scaled, i.e. smoothed) decode is faithful.
SMOOTH_MODES = frozenset(_UP)

_IGNORE_ORIENTATION = getattr(cv2, "IMREAD_IGNORE_ORIENTATION", 128)
_REDUCED_GRAY = {1: 0, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
                 8: cv2.IMREAD_REDUCED_GRAYSCALE_8}
_REDUCED_BGR = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
                4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


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


@functools.lru_cache(maxsize=None)
def _direct_rgb() -> bool:
    """True if this OpenCV decodes (also at reduced scale) straight to RGB.

    ``IMREAD_COLOR_RGB`` (OpenCV >= 4.10) combined with ``IMREAD_REDUCED_GRAYSCALE_k``
    gives a reduced RGB decode (``IMREAD_REDUCED_COLOR_k`` already contains the BGR
    bit, and BGR|RGB is rejected).  Probed once on a tiny JPEG.
    """
    if not hasattr(cv2, "IMREAD_COLOR_RGB"):
        return False
    probe = np.zeros((16, 16, 3), np.uint8)
    probe[..., 2] = 255  # red in BGR
    ok, buf = cv2.imencode(".jpg", probe)
    try:
        img = cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB | _REDUCED_GRAY[2])
    except cv2.error:
        return False
    return bool(ok and img is not None and img.shape == (8, 8, 3) and img[..., 0].min() > 200)


def decode(buf: np.ndarray, k: int = 1) -> np.ndarray | None:
    """Decode encoded bytes (uint8 array) to HWC uint8 RGB at scale 1/``k``, quietly:
    a JPEG simplejpeg reads without a warning goes through it (the pixels OpenCV gives),
    anything else through OpenCV with its chatter captured (NOTE [ decoder chatter ] in
    ``decoders.py``: damaged or non-JPEG data only).

    EXIF orientation is ignored (as PIL, hence torchvision's default loader, does),
    so the decoded size always matches the SOF header.  None if undecodable.
    """
    if buf.size == 0:
        return None
    if k == 1 and simplejpeg is not None and buf[:3].tobytes() == b"\xff\xd8\xff":
        try:
            img = simplejpeg.decode_jpeg(buf, colorspace="RGB", strict=True)
            if img.ndim == 3 and img.shape[2] == 3:
                return img
        except ValueError:  # damaged, CMYK, ...: OpenCV below
            pass
    try:
        if _direct_rgb():
            return imdecode_quiet(buf, cv2.IMREAD_COLOR_RGB | _REDUCED_GRAY[k]
                                  | _IGNORE_ORIENTATION)[0]
        img = imdecode_quiet(buf, _REDUCED_BGR[k] | _IGNORE_ORIENTATION)[0]
    except cv2.error:  # e.g. a header over OpenCV's size limits
        return None
    return None if img is None else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


# ----------------------------------------------------------------------------- decoding

#: SOF markers of single-scan, Huffman-coded JPEGs (baseline, extended sequential):
#: the ones a decoder may stop early on (NOTE [ row-limited decode ]).
_SEQUENTIAL = (0xC0, 0xC1)
#: Largest decoded image kept as a per-thread scratch buffer (bigger ones are allocated).
_SCRATCH_MAX = 64 << 20


def _via_simplejpeg(frame: JpegFrame) -> bool:
    """Whether simplejpeg decodes this JPEG (to RGB: grey or YCbCr; CMYK goes to OpenCV)."""
    return simplejpeg is not None and frame.components in (1, 3)


#: Decoded px beyond a crop box that rendering may read (NOTE [ render reach ]): where
#: an upscaled fractional box is sampled in place (warpAffine) -- rounding plus the
#: widest kernel, Lanczos's 4 px -- and where the box is cut out and resized.
WARP_REACH, SLICE_REACH = 6, 1
#: Decoded px next to a spliced edge (top, left, right of a restart window) that differ
#: from a full decode: chroma upsampling there sees the edge instead of its neighbour
#: (measured: 1 px at 4:2:0 and 4:2:2 at full, 1/2 and 1/4 scale; none at 1/8 or
#: 4:4:4; mutation-checked by test_restart_window_matches_full_decode).
SPLICE_EDGE = 1


def decoded_rows(frame: JpegFrame, k: int, y1: float, reach: int = WARP_REACH) -> int:
    """How many source rows of ``frame`` to decode (at scale 1/``k``) so that every
    decoded row a crop ending at source row ``y1`` reads -- ``reach`` decoded px below
    it (NOTE [ render reach ]) -- equals a full decode's.  The full height for JPEGs
    that cannot be stopped early.  NOTE [ row-limited decode ]"""
    if frame.marker not in _SEQUENTIAL or not _via_simplejpeg(frame):
        return frame.height
    mcu = frame.mcu_height
    # + 1 decoded px: the last decoded row of a stopped decode differs from a full
    # decode's (4:2:0 at full scale: upsampling has no chroma row below to look at --
    # measured: that one row; none at reduced scales, 4:2:2, 4:4:4 or grey; was 4 px)
    need = math.ceil(y1) + (reach + 1) * k
    return min(frame.height, -(-need // mcu) * mcu)


class Region(NamedTuple):
    """Source pixels of a decode: rows ``[top, bottom)``, columns ``[left, right)``."""

    top: int
    bottom: int
    left: int
    right: int


def restart_window(buf: np.ndarray, frame: JpegFrame, k: int, region: Region,
                   reach: int = WARP_REACH) -> tuple[Region, JpegScan | None]:
    """Grow ``region`` (the source pixels a sample needs, bottom margin included) to the
    restart segments that hold it with the margins a decode that starts there needs
    (rendering reads ``reach`` decoded px beyond the crop: NOTE [ render reach ]);
    returns ``(region, scan)``, or ``(whole rows from the top, None)`` when the JPEG
    has no usable restart markers or skipping would not pay.  NOTE [ restart windows ]"""
    whole = Region(0, region.bottom, 0, frame.width)
    if frame.marker not in _SEQUENTIAL or not _via_simplejpeg(frame):
        return whole, None
    # the render's reach plus the decoded px a spliced edge changes: its chroma
    # upsampling sees the edge itself instead of the neighbour
    margin = (reach + SPLICE_EDGE) * k
    top = region.top - margin
    left = region.left - margin
    right = region.right + margin
    if top < frame.mcu_height and left < frame.mcu_width and right > frame.width - frame.mcu_width:
        return whole, None
    scan = jpeg_scan(buf, frame)
    lay = None if scan is None else restart_layout(frame, scan)
    if lay is None:
        return whole, None
    _, groups, band_px, group_px = lay
    top = max(top, 0) // band_px * band_px
    if groups == 1:
        left, right = 0, frame.width
    else:
        left = max(left, 0) // group_px * group_px
        right = min(-(-right // group_px) * group_px, frame.width)
    if (top, left, right) == (0, 0, frame.width):
        return whole, None
    return Region(top, region.bottom, left, right), scan


def _at_markers(data: np.ndarray, at: np.ndarray, seg: np.ndarray) -> bool:
    """Whether ``data[at]`` (ascending offsets) hold the markers that end segments
    ``seg``: ``FF Dn`` with ``n = seg % 8``."""
    if len(at) == 0:
        return True
    if at[0] < 0 or at[-1] + 1 >= len(data):
        return False
    got = data[at + 1] ^ (seg & 7)  # 0xD0 where the number is right (0xD0 has no low bits)
    return int(got.min()) == int(got.max()) == 0xD0 and int(data[at].min()) == 0xFF


def _splice(buf: np.ndarray, frame: JpegFrame, scan: JpegScan, reg: Region
            ) -> np.ndarray | None:
    """A JPEG of the source pixels ``reg`` (on segment boundaries, see
    :func:`restart_window`): the headers with the frame size patched (and without the
    restart index), the restart segments that code them -- each band's run of segments
    is contiguous in the file -- with their markers renumbered from RST0 (decoders check
    the sequence), and an EOI.  None if the markers are not where the header says."""
    bands, groups, band_px, group_px = restart_layout(frame, scan)
    b0, b1 = reg.top // band_px, -(-reg.bottom // band_px)
    g0, g1 = reg.left // group_px, -(-reg.right // group_px)
    count, ng = bands * groups - 1, g1 - g0  # markers in the scan, segments per band
    data = buf[scan.offset:]
    end = len(data)
    # grid[i]: the marker before band i's first segment, then the one after each of its
    # segments; -1 and count stand for the scan's start and end (no marker there)
    grid = np.arange(b0 * groups + g0 - 1, b1 * groups + g0 - 1, groups)[:, None] + np.arange(ng + 1)
    real = slice(int(grid[0, 0] < 0), grid.size - int(grid[-1, -1] >= count))

    def offsets(marks: np.ndarray) -> np.ndarray:  # marker offsets (+2: after it)
        return np.concatenate(([-2], marks, [end - 2]))[grid + 1]

    # where the markers are: as the restart index says, where every marker used is
    # there (NOTE [ restart index ]), else found by scanning the entropy-coded bytes
    marks = indexed_marks(buf, scan)
    pos = None
    if marks is not None and len(marks) == count:
        pos = offsets(marks)
        if not _at_markers(data, pos.ravel()[real], grid.ravel()[real]):
            pos = None
    if pos is None:
        marks = restart_marks(data)
        if len(marks) != count:
            return None
        pos = offsets(marks)
    lo, hi = pos[:, 0] + 2, pos[:, -1] + 2
    if grid[-1, -1] < count:  # the final piece's marker is not needed
        hi[-1] -= 2
    a, b = scan.index
    mv = memoryview(buf)
    head = [mv[:a], mv[b:scan.offset]] if b > a else [mv[:scan.offset]]
    o = scan.offset
    out = bytearray().join(head + [mv[o + x:o + y] for x, y in zip(lo.tolist(), hi.tolist())]
                           + [b"\xff\xd9"])
    arr = np.frombuffer(out, np.uint8)
    f = frame.offset + 5  # (the index sits after the frame header: offsets before it hold)
    arr[f:f + 4] = (*divmod(reg.bottom - reg.top, 256), *divmod(reg.right - reg.left, 256))
    # renumber the copied markers (each band's, after its segments; not the final one):
    # piece i starts at len(headers) + the lengths of the pieces before it
    lens = hi - lo
    start = (scan.offset - (b - a)) + np.cumsum(lens) - lens - lo
    at = (pos[:, 1:] + start[:, None]).ravel()[:-1] + 1  # the byte after each 0xFF
    arr[at] = 0xD0 + (np.arange(len(at)) & 7)
    return arr


def with_height(buf: np.ndarray, frame: JpegFrame, rows: int) -> bytes:
    """The JPEG ``buf`` with its frame header saying ``rows`` rows: a decoder stops after
    them and skips the rest of the scan.  NOTE [ row-limited decode ]"""
    o = frame.offset + 5
    return b"".join((buf[:o], rows.to_bytes(2, "big"), buf[o + 2:]))


def decode_jpeg(buf: np.ndarray, frame: JpegFrame, k: int, region: Region,
                local: threading.local, scan: JpegScan | None = None
                ) -> tuple[np.ndarray | None, Region]:
    """Decode the source pixels ``region`` of a JPEG at scale 1/``k`` to RGB: rows
    ``[0, region.bottom)`` of every column, or -- with the ``scan`` from
    :func:`restart_window` -- exactly ``region``.

    Returns ``(image, region decoded)``: the image may live in a per-thread scratch
    buffer of ``local`` (valid until this thread's next call) and holds the region's
    pixels at 1/``k`` (sizes rounded up); the whole image when the decode fell back to
    OpenCV.  ``(None, ...)`` if the bytes cannot be decoded.
    """
    if _via_simplejpeg(frame):
        data: Any = None
        if scan is not None:
            data = _splice(buf, frame, scan, region)
        if data is None:
            region = Region(0, region.bottom, 0, frame.width)
        partial = region != (0, frame.height, 0, frame.width)
        if partial and data is None:  # same bytes, smaller frame height: the decoder stops
            data = with_height(buf, frame, region.bottom)
        elif data is None:
            data = buf
        h = -(-(region.bottom - region.top) // k)
        w = -(-(region.right - region.left) // k)
        nbytes = h * w * 3
        scratch = getattr(local, "decoded", None)
        if nbytes > _SCRATCH_MAX:
            scratch = None
        elif scratch is None or scratch.size < nbytes:  # grow-only, in 4 MiB steps
            scratch = local.decoded = np.empty(-(-nbytes // (4 << 20)) * (4 << 20), np.uint8)
        try:
            # strict=False for a partial decode: the skipped tail is a (silent) warning
            img = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=h, min_width=w,
                                         strict=not partial, buffer=scratch)
        except ValueError:  # corrupt but maybe decodable with warnings: OpenCV below
            img = None
        if img is not None and img.shape == (h, w, 3):  # else a scale it lacks: OpenCV
            return img, region
    return decode(buf, k), Region(0, frame.height, 0, frame.width)


def as_buffer(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """A zero-copy uint8 view of encoded bytes."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, np.uint8)


def resize(src: np.ndarray, out_h: int, out_w: int, mode: str, antialias: bool,
           dst: np.ndarray | None = None) -> np.ndarray:
    """Resize HWC (or HW) ``src`` to ``(out_h, out_w)``; see NOTE [ interpolation
    equivalence ].  Writes into ``dst`` when given (and returns it)."""
    sh, sw = src.shape[:2]
    if (sh, sw) == (out_h, out_w):
        return src if dst is None else _check(src, dst)
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
                return res if dst is None else _check(res, dst)
    if dst is None:
        return cv2.resize(src, (out_w, out_h), interpolation=flag)
    return _check(cv2.resize(src, (out_w, out_h), dst=dst, interpolation=flag), dst)


def resize_top(src: np.ndarray, extent: tuple[int, int], out_h: int, out_w: int, mode: str,
               antialias: bool) -> np.ndarray:
    """The top rows of ``resize(whole, out_h, out_w, ...)`` for an image ``whole`` of
    ``extent`` (h, w) whose rows ``[0, len(src))`` (all columns) are ``src``: every
    output row whose inputs -- :func:`top_reach` source rows below it -- are in ``src``
    has exactly the whole resize's pixels (OpenCV maps output to source positions from
    the scale and the origin, both the same here).  NOTE [ exact evaluation crops ]"""
    eh, ew = extent
    if src.shape[0] == eh:
        return resize(src, out_h, out_w, mode, antialias)
    if mode not in TOP_MODES:
        raise ValueError(f"resize_top: {mode!r} needs the whole image (TOP_MODES)")
    if src.shape[1] != ew or src.shape[0] > eh:
        raise ValueError(f"resize_top: {src.shape[:2]} is not the top of a {extent} image")
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
    return cv2.resize(src, None, fx=out_w / ex, fy=out_h / ey, interpolation=flag)[:, :out_w]


#: Modes whose OpenCV resize of an image's top rows is the top of the whole image's: not
#: INTER_NEAREST_EXACT (its mapping comes from the sizes, not the scale) nor INTER_CUBIC /
#: INTER_LANCZOS4 (rows differ by 1 grey level depending on the output's height: measured
#: far from the cut, single-threaded too)
TOP_MODES = frozenset(("bilinear", "box", "nearest"))


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


# ----------------------------------------------------------------------------- randomness

_default_rng: np.random.Generator = np.random.default_rng()


def seed_default(seed: int | np.random.SeedSequence | None) -> None:
    """Reseed this process's default generator (``None``: fresh OS entropy)."""
    global _default_rng
    _default_rng = np.random.default_rng(seed)


def get_default_rng() -> np.random.Generator:
    """The generator random transforms use when called with ``rng=None``."""
    return _default_rng


# ----------------------------------------------------------------------------- geometry

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
            _axis(nh, out_hw[0]), _axis(nw, out_hw[1]))
        sy, sx = height / nh, width / nw
        return Window(ry0 * sy, rx0 * sx, ry1 * sy, rx1 * sx, oy0, ox0, oy1, ox1)


def _axis(n: int, c: int) -> tuple[int, int, int, int]:
    off = crop_offset(n, c)
    r0, r1 = max(off, 0), min(off + c, n)
    return r0, r1, r0 - off, r1 - off


# ----------------------------------------------------------------------------- pipeline

@dataclass(frozen=True)
class FusedPlan:
    """What :class:`FusedPipeline` does for one image (see :meth:`FusedPipeline.plan`)."""

    height: int
    width: int
    window: Window
    flip: bool
    k: int  # decode scale denominator (1 = full resolution)
    #: Resize + CenterCrop that upscales one axis and downscales the other: the whole
    #: image is resized to this (h, w) and the crop cut from it, as the unfused
    #: transforms do (a box cut on whole source pixels would shift the upscaled axis)
    resized: tuple[int, int] | None = None


class PreparedSample(NamedTuple):
    """One sample between :meth:`FusedPipeline.prepare` and :meth:`FusedPipeline.finish`."""

    buf: np.ndarray  # the encoded bytes
    frame: JpegFrame | None  # None: not a JPEG, decoded already (``image``)
    plan: FusedPlan
    region: Region  # the source pixels to decode (or decoded)
    scan: JpegScan | None  # the scan to splice the region from; None: rows from the top
    image: np.ndarray | None


class FusedPipeline:
    """Decode encoded JPEG bytes and write one finished sample into ``out``.

    Built by :func:`seqloader.transforms.compile_fused`; ``out_shape``/``out_dtype``
    describe what ``__call__`` writes: ``(3, H, W) float32`` (ToTensor+Normalize
    applied) or ``(H, W, 3) uint8`` (channels-last, normalise on the device).

    Picklable (scratch buffers are per thread and not pickled), thread-safe and
    reentrant across threads; one instance may serve a whole worker process.  A call
    is :meth:`prepare` (header, random draw, decode window: cheap, consumes the
    generator) then :meth:`finish` (decode and render); workers prepare a run of
    samples before finishing them (NOTE [ draw, then decode ] in ``producer.py``).
    """

    def __init__(self, geometry: RRCGeometry | ResizeCropGeometry, out_hw: tuple[int, int], *,
                 mode: str, antialias: bool, flip_p: float | None, to_tensor: bool,
                 mean: tuple[float, ...] | None, std: tuple[float, ...] | None,
                 output: str = "float", reduced_decode: bool = True,
                 partial_decode: bool = True, eval_mode: str = "exact") -> None:
        if eval_mode not in EVAL_MODES:
            raise ValueError(f"eval_mode={eval_mode!r}: use one of {', '.join(EVAL_MODES)}")
        self.geometry, self.out_hw = geometry, (int(out_hw[0]), int(out_hw[1]))
        self.mode, self.antialias, self.flip_p = mode, antialias, flip_p
        self.to_tensor, self.mean, self.std = to_tensor, mean, std
        if output not in ("float", "uint8"):
            raise ValueError(f"output={output!r}: use 'float' or 'uint8'")
        self.output = output
        to_float = self.to_float = to_tensor and output == "float"
        self.reduced_decode = bool(reduced_decode)
        self.partial_decode = bool(partial_decode)
        self.eval_mode = eval_mode
        h, w = self.out_hw
        self.out_shape = (3, h, w) if to_float else (h, w, 3)
        self.out_dtype = np.dtype(np.float32 if to_float else np.uint8)
        self._lut = _make_lut(mean, std) if to_float else None
        self._local = threading.local()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_local"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __repr__(self) -> str:
        return (f"FusedPipeline({self.geometry!r}, out_shape={self.out_shape}, "
                f"out_dtype={self.out_dtype}, flip_p={self.flip_p}, mode={self.mode!r}, "
                f"reduced_decode={self.reduced_decode}, partial_decode={self.partial_decode}, "
                f"eval_mode={self.eval_mode!r})")

    def with_output(self, output: str) -> FusedPipeline:
        """The same pipeline writing ``output`` ('float' or 'uint8', as
        :func:`~seqloader.transforms.compile_fused` takes it)."""
        return FusedPipeline(self.geometry, self.out_hw, mode=self.mode, antialias=self.antialias,
                             flip_p=self.flip_p, to_tensor=self.to_tensor, mean=self.mean,
                             std=self.std, output=output, reduced_decode=self.reduced_decode,
                             partial_decode=self.partial_decode, eval_mode=self.eval_mode)

    def device_normalize(self) -> Any:
        """For uint8 output of a recipe with ToTensor: the
        :class:`~seqloader.transforms.DeviceNormalize` that finishes it on the device
        (Normalize's mean/std, or 0/1 for a bare ToTensor); None otherwise."""
        if self.to_float or not self.to_tensor:
            return None
        from . import DeviceNormalize

        mean = np.broadcast_to(self.mean if self.mean is not None else 0.0, (3,))
        std = np.broadcast_to(self.std if self.std is not None else 1.0, (3,))
        return DeviceNormalize(mean.tolist(), std.tolist())

    @property
    def can_reduce(self) -> bool:
        """Whether reduced-scale decoding may be used at all (smooth antialiased modes)."""
        return self.reduced_decode and self.antialias and self.mode in SMOOTH_MODES

    def plan(self, height: int, width: int, rng: np.random.Generator,
             jpeg: bool = True) -> FusedPlan:
        """Sample the crop box and flip for a ``height x width`` source (consuming ``rng``
        exactly as the unfused transforms do) and pick the decode scale."""
        geo = self.geometry
        win = geo.window(height, width, self.out_hw, rng)
        flip = bool(rng.random() < self.flip_p) if self.flip_p is not None else False
        if isinstance(geo, ResizeCropGeometry):
            nh, nw = resized_size(height, width, geo.size, geo.max_size)
            if (self.eval_mode == "exact" or (nh > height and nw < width)
                    or (nh < height and nw > width)):
                return FusedPlan(height, width, win, flip, 1, (nh, nw))
        k = 1
        if jpeg and self.can_reduce:
            bw, bh = win.x1 - win.x0, win.y1 - win.y0
            ow, oh = win.ox1 - win.ox0, win.oy1 - win.oy0
            for cand in (8, 4, 2):
                if bw >= cand * ow and bh >= cand * oh:
                    k = cand
                    break
        return FusedPlan(height, width, win, flip, k)

    def _resizes_top(self, p: FusedPlan) -> bool:
        """Whether :func:`resize_top` can render ``p`` from rows above the crop's bottom
        (:data:`TOP_MODES`, but not 'box' with one axis growing: it shrinks an axis first)."""
        nh, nw = p.resized
        return self.mode in TOP_MODES and not (
            self.mode == "box" and (nh < p.height) != (nw < p.width)
            and nh != p.height and nw != p.width)

    def warps(self, p: FusedPlan) -> bool:
        """Whether rendering ``p`` samples its box in place (an upscale of a box that does
        not fall on whole decoded pixels: warpAffine, which reads :data:`WARP_REACH`
        decoded px around it) rather than cutting it out and resizing it
        (:data:`SLICE_REACH`; RandomResizedCrop's boxes are whole pixels, so they are
        always cut out).  Decoded regions start on MCU boundaries, multiples of ``k``.
        NOTE [ render reach ]"""
        w = p.window
        return (self.mode in _WARP and (w.oy1 - w.oy0) * p.k >= w.y1 - w.y0
                and (w.ox1 - w.ox0) * p.k >= w.x1 - w.x0
                and not all(float(v / p.k).is_integer() for v in (w.y0, w.x0, w.y1, w.x1)))

    def decode_window(self, buf: np.ndarray, frame: JpegFrame, p: FusedPlan
                      ) -> tuple[Region, JpegScan | None]:
        """The source pixels to decode for ``p`` -- the crop, the rows the decoder may
        stop below and, with restart markers, the segments around it -- and the scan to
        splice them from (None: rows from the top).  NOTEs [ row-limited decode ],
        [ restart windows ], [ render reach ]."""
        w = p.window
        if self.warps(p):
            # rows from the top: warpAffine's fixed-point sampling positions depend on
            # where the box sits in the decoded image, so a window (which moves it) would
            # change pixels by +-1 grey level here and there (tested)
            return Region(0, decoded_rows(frame, p.k, w.y1, WARP_REACH), 0, frame.width), None
        region = Region(math.floor(w.y0), decoded_rows(frame, p.k, w.y1, SLICE_REACH),
                        math.floor(w.x0), math.ceil(w.x1))
        return restart_window(buf, frame, p.k, region, SLICE_REACH)

    def __call__(self, data: bytes | memoryview | np.ndarray, out: np.ndarray,
                 rng: np.random.Generator | None = None) -> None:
        """Decode ``data`` and write the sample into ``out`` (shape ``out_shape``,
        dtype ``out_dtype``).  ``rng`` None uses the module default generator.
        Raises ValueError if ``out`` does not match or the bytes cannot be decoded.
        Same as ``finish(prepare(data, rng), out)``."""
        self._check_out(out)
        self.finish(self.prepare(data, rng), out)

    def prepare(self, data: bytes | memoryview | np.ndarray,
                rng: np.random.Generator | None = None) -> PreparedSample:
        """The first half of a sample: read the JPEG header, draw the sample's crop and
        flip (consuming ``rng`` exactly as ``__call__`` does) and choose what to
        decode.  Cheap -- no decoding, except for non-JPEG data (decoded here, whole:
        its size is needed to draw the crop).  ``data`` must stay unchanged until
        :meth:`finish`.  NOTE [ draw, then decode ] in ``seqloader/dataflow/batch.py``."""
        if rng is None:
            rng = get_default_rng()
        buf = as_buffer(data)
        frame = jpeg_frame(memoryview(buf)) if buf.size else None
        if frame is None or frame.height == 0:  # not a JPEG (or no usable SOF): decode first
            img = decode(buf)
            if img is None:
                raise ValueError(f"cannot decode image ({buf.size} bytes)")
            p = self.plan(img.shape[0], img.shape[1], rng, jpeg=False)
            return PreparedSample(buf, None, p, Region(0, img.shape[0], 0, img.shape[1]), None, img)
        p = self.plan(frame.height, frame.width, rng)
        region, scan = Region(0, frame.height, 0, frame.width), None
        if self.partial_decode and p.resized is None:
            region, scan = self.decode_window(buf, frame, p)
        elif self.partial_decode and self._resizes_top(p):  # rows from the top, all columns
            reach = top_reach(frame.height, p.resized[0])
            region = Region(0, decoded_rows(frame, 1, p.window.y1, reach), 0, frame.width)
        return PreparedSample(buf, frame, p, region, scan, None)

    def finish(self, prep: PreparedSample, out: np.ndarray) -> None:
        """The second half: decode what :meth:`prepare` chose and write the sample into
        ``out``.  Raises ValueError if ``out`` does not match or the bytes cannot be
        decoded."""
        self._check_out(out)
        img, region = prep.image, prep.region
        if img is None:
            img, region = decode_jpeg(prep.buf, prep.frame, prep.plan.k, region, self._local,
                                      prep.scan)
            if img is None:
                f = prep.frame
                raise ValueError(f"cannot decode JPEG ({prep.buf.size} bytes, "
                                 f"header {f.height}x{f.width}x{f.components})")
        self._render(img, prep.plan, region, out)

    def _check_out(self, out: np.ndarray) -> None:
        if out.shape != self.out_shape or out.dtype != self.out_dtype:
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; this pipeline "
                             f"writes {self.out_shape} {self.out_dtype}")
        if not out.flags.c_contiguous:
            raise ValueError(f"out (shape {out.shape}) is not C-contiguous (a strided view?); "
                             "pass a contiguous array, e.g. a row of a batch array")

    def _render(self, img: np.ndarray, p: FusedPlan, reg: Region, out: np.ndarray) -> None:
        """Crop, resize, flip and convert ``img``: the source pixels ``reg`` of the image
        decoded at scale 1/``p.k`` (NOTEs [ row-limited decode ], [ restart windows ])."""
        win, oh, ow = p.window, self.out_hw[0], self.out_hw[1]
        dh, dw = img.shape[:2]
        # decoded-pixel coordinates: exact 1/k for a reduced decode; proportional if the
        # decoder disagrees with the header (never seen, but cheap to survive)
        sh, sw = reg.bottom - reg.top, reg.right - reg.left
        if (dh, dw) == (-(-sh // p.k), -(-sw // p.k)):
            fy = fx = 1.0 / p.k
        else:
            fy, fx = dh / sh, dw / sw
        box = ((win.y0 - reg.top) * fy, (win.x0 - reg.left) * fx,
               (win.y1 - reg.top) * fy, (win.x1 - reg.left) * fx)
        local = self._local
        padded = (win.oy0, win.ox0, win.oy1, win.ox1) != (0, 0, oh, ow)
        direct = not (self.to_float or p.flip or padded)
        canvas = out if direct else _scratch(local, "canvas", (oh, ow, 3))
        if padded:
            canvas.fill(0)
        dst = canvas[win.oy0:win.oy1, win.ox0:win.ox1] if padded else canvas
        rh, rw = dst.shape[:2]
        if p.resized is not None:  # the whole image resized (its top rows), then cropped
            nh, nw = p.resized
            (ry0, ry1, _, _), (rx0, rx1, _, _) = _axis(nh, oh), _axis(nw, ow)
            if (reg.top, reg.left, reg.right, dw) == (0, 0, p.width, p.width) and dh <= p.height:
                top = resize_top(img, (p.height, p.width), nh, nw, self.mode, self.antialias)
            else:  # (never seen: a decoder that disagrees with the header)
                top = resize(img, nh, nw, self.mode, self.antialias)
            np.copyto(dst, top[ry0:ry1, rx0:rx1])
        elif self.warps(p) and not all(float(v).is_integer() for v in box):
            # upscaling a fractional box (Resize + CenterCrop): sample it exactly, with
            # the same pixel-centre mapping (and border clamp) as resizing the whole image
            sy, sx = (box[2] - box[0]) / rh, (box[3] - box[1]) / rw
            m = np.array([[sx, 0, box[1] + 0.5 * sx - 0.5], [0, sy, box[0] + 0.5 * sy - 0.5]])
            _check(cv2.warpAffine(img, m, (rw, rh), dst=dst, borderMode=cv2.BORDER_REPLICATE,
                                  flags=_WARP[self.mode] | cv2.WARP_INVERSE_MAP), dst)
        else:
            # a reduced decode's box is fractional in decoded px: rounded to whole ones
            # (each edge moves <= k/2 source px; an exact fractional resample measured
            # +120-260 us per image: README "Transforms")
            y0, y1 = _span(box[0], box[2], dh)
            x0, x1 = _span(box[1], box[3], dw)
            resize(img[y0:y1, x0:x1], rh, rw, self.mode, self.antialias, dst=dst)
        if not self.to_float:
            if p.flip:
                _check(cv2.flip(canvas, 1, dst=out), out)
            elif not direct:
                np.copyto(out, canvas)
            return
        if p.flip:
            flipped = _scratch(local, "flipped", (oh, ow, 3))
            canvas = _check(cv2.flip(canvas, 1, dst=flipped), flipped)
        # into this thread's planes: a fresh list of 3 arrays per image was ~14 of the
        # ~17 us split took (measured, 224x224)
        planes = cv2.split(canvas, [_scratch(local, f"plane{c}", (oh, ow)) for c in range(3)])
        for c in range(3):  # uint8 -> float32 (x/255 - mean)/std, one table lookup per pixel
            dst = out[c]
            _check(cv2.LUT(planes[c], self._lut[c], dst=dst), dst)


def _span(a: float, b: float, n: int) -> tuple[int, int]:
    """Round a float interval to whole pixels inside [0, n), at least one pixel long."""
    lo = min(max(int(math.floor(a + 0.5)), 0), n - 1)
    hi = min(max(int(math.floor(b + 0.5)), lo + 1), n)
    return lo, hi


def _scratch(local: threading.local, name: str, shape: tuple[int, ...]) -> np.ndarray:
    arr = getattr(local, name, None)
    if arr is None or arr.shape != shape:
        arr = np.empty(shape, np.uint8)
        setattr(local, name, arr)
    return arr


def _check(res: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``dst``, holding ``res``: copied there unless it is ``dst`` already (OpenCV may
    reallocate instead of writing in place; some results are computed elsewhere)."""
    if res is not dst:
        np.copyto(dst, res.reshape(dst.shape))
    return dst


def _make_lut(mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> list[np.ndarray]:
    """Per-channel 256-entry float32 tables, computed exactly as ToTensor + Normalize do
    (float32 ``x / 255``, then ``(x - mean) / std`` in float32), so results are bit-equal."""
    x = np.arange(256, dtype=np.float32) / np.float32(255)
    mean3 = np.broadcast_to(np.asarray(mean if mean is not None else 0.0, np.float32), (3,))
    std3 = np.broadcast_to(np.asarray(std if std is not None else 1.0, np.float32), (3,))
    tables = []
    for c in range(3):
        t = x if mean is None else (x - mean3[c]) / std3[c]
        tables.append(np.ascontiguousarray(t, np.float32).reshape(1, 256))
    return tables
