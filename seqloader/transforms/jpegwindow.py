"""Decoding a JPEG quietly, whole or only the part a sample needs: reduced scale,
rows down to the crop (NOTE [ row-limited decode ]) and, with restart markers, the
segments around it (NOTE [ restart windows ]).

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
grows the crop by the render's reach (NOTE [ render reach ] in ``fused.py``) plus 1
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
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Any, NamedTuple

import cv2
import numpy as np

from ..format.decoders import imdecode_quiet
from ..format.jpeg import (JpegFrame, JpegScan, indexed_marks, jpeg_scan, restart_layout,
                           restart_marks)

try:
    import simplejpeg
except ImportError:  # a declared dependency; without it OpenCV decodes every image whole
    simplejpeg = None

__all__ = ["as_buffer", "decode", "decode_jpeg", "decoded_rows", "restart_window", "with_height",
           "Region", "WARP_REACH", "SLICE_REACH", "SPLICE_EDGE"]

_IGNORE_ORIENTATION = getattr(cv2, "IMREAD_IGNORE_ORIENTATION", 128)
_REDUCED_GRAY = {1: 0, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
                 8: cv2.IMREAD_REDUCED_GRAYSCALE_8}
_REDUCED_BGR = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
                4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


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


#: SOF markers of single-scan, Huffman-coded JPEGs (baseline, extended sequential):
#: the ones a decoder may stop early on (NOTE [ row-limited decode ]).
_SEQUENTIAL = (0xC0, 0xC1)
#: Largest decoded image kept as a per-thread scratch buffer (bigger ones are allocated).
_SCRATCH_MAX = 64 << 20


def _via_simplejpeg(frame: JpegFrame) -> bool:
    """Whether simplejpeg decodes this JPEG (to RGB: grey or YCbCr; CMYK goes to OpenCV)."""
    return simplejpeg is not None and frame.components in (1, 3)


#: Decoded px beyond a crop box that rendering may read (NOTE [ render reach ] in
#: fused.py): where an upscaled fractional box is sampled in place (warpAffine) -- rounding plus the
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
