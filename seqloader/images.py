"""Inspect, check and (when needed) normalise one encoded image for storage.

NOTE [ what gets stored ]
By default the source file's bytes are stored untouched (no re-encode, no quality
loss).  Three cases are re-encoded, as a baseline JPEG, so that every stored image
decodes to a correct 3-channel RGB image with *any* JPEG decoder (OpenCV, PIL,
nvJPEG, ``torchvision.io.decode_jpeg``) and our reduced-scale decode fast path:
* CMYK/YCCK JPEGs (4 components; real ImageNet has 22) -> ``reencoded="cmyk"``;
* non-JPEG data, whatever the file name (PNG saved as ``.JPEG``, BMP, ...) ->
  ``reencoded="png"`` etc.;
* with ``max_size``, images whose shorter side exceeds it -> ``reencoded="resized"``.
Re-encoding ignores the EXIF orientation, as PIL (torchvision's loader) and our reader
do for every image, so a re-encoded image keeps its source's rows and columns.
Grayscale JPEGs are stored as they are: every reader decodes them to 3 channels
(OpenCV's ``IMREAD_COLOR`` replicates the channel).

With ``restart`` (``--restart-markers``) every stored JPEG gets restart markers every
few MCUs, each MCU row starting an interval, so that a reader can decode just the
segments around a crop (NOTE [ restart windows ] in ``seqloader/_fused.py``): JPEGs
stored as they are go through libjpeg-turbo's ``jpegtran -restart <m>B -optimize`` --
a *lossless* transcode (the DCT coefficients are copied, every pixel decodes the
same) that also gives each file its own optimal Huffman tables, which more than pays
for the markers' bytes (measured: ImageNet-like files 3 % smaller than the originals
instead of 1 % larger, decoding as fast or faster) -- and re-encoded ones are written
with the markers.  Every re-encode uses optimal Huffman tables too.  A JPEG whose markers already
tile it so is kept as it is; one that ``jpegtran`` reports problems with is kept
unchanged too (it still decodes, whole).  Each such JPEG also gets a restart index
(NOTE [ restart index ]).

NOTE [ restart index ]
Splicing a window out of a JPEG (NOTE [ restart windows ] in ``seqloader/_fused.py``)
needs the offset of every restart segment, and finding the RSTn markers means looking
at every byte of the entropy-coded data: ~40 us of a 1200x900 photo's ~1.8 ms pipeline,
about 40 % of the splice.  So the stored JPEG carries them: an APP15 segment just
before the SOS, ``_INDEX_TAG`` then the byte length of each segment but the last
(marker included) as little-endian uint16 -- 2 bytes per segment: ~1.6 % of a
1200x900 photo, 0.65 % of the ImageNet-like benchmark set.  Every decoder skips APPn segments it
does not know.  A reader trusts the index only where it checks out: every marker it
uses must be ``FF Dn`` with the right ``n`` at the offset the index gives, and the
count must match the frame's grid; otherwise (an index from another file, bytes edited
by another tool) it finds the markers by scanning, as for JPEGs without an index.
Files whose segments do not fit (one over 64 KiB, over ``_INDEX_MAX`` = 32,753
segments) get none.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import NamedTuple

import cv2
import numpy as np

__all__ = ["Prepared", "prepare_image", "sniff_format", "jpeg_info", "jpeg_frame", "JpegFrame",
           "jpeg_scan", "JpegScan", "restart_layout", "restart_marks", "add_restart_index",
           "decode_bgr"]

_MAGIC = [
    (b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"),
    (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"),
]


def sniff_format(data: bytes) -> str:
    """The container format from the first bytes: 'jpeg', 'png', 'webp', ... or 'unknown'."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] in (b"P5", b"P6", b"P2", b"P3"):
        return "pnm"
    return "unknown"


class JpegFrame(NamedTuple):
    """What a JPEG's SOF marker says, and where it is."""

    height: int
    width: int
    components: int
    marker: int  # 0xC0 baseline, 0xC1 extended sequential, 0xC2 progressive, ...
    offset: int  # index of the SOF marker's 0xFF byte in the data
    mcu_height: int  # rows of one MCU row (8 x the largest vertical sampling factor)
    mcu_width: int = 8  # columns of one MCU (8 x the largest horizontal sampling factor)


class JpegScan(NamedTuple):
    """Where a single-scan JPEG's entropy-coded data starts, its restart interval and
    its restart index (NOTE [ restart index ])."""

    offset: int  # index of the first byte after the SOS segment
    restart: int  # MCUs per restart interval (DRI); 0 = no restart markers
    sos: int = 0  # index of the SOS marker's 0xFF byte
    index: tuple[int, int] = (0, 0)  # [start, end) of the restart index segment; (0, 0): none


#: APP15 (NOTE [ restart index ]): marker, then what the segment's payload starts with.
_APP15 = 0xEF
_INDEX_TAG = b"seqloader restart index 1\x00"
#: Most segment lengths an index holds (an APPn payload is at most 65,533 bytes).
_INDEX_MAX = (65533 - len(_INDEX_TAG)) // 2


def jpeg_frame(data: bytes | memoryview) -> JpegFrame | None:
    """The frame header of a JPEG (its SOF marker), or None if none is found before the
    first scan.  Walks the marker segments only; never decodes."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        seglen = int.from_bytes(data[i + 2:i + 4], "big")
        # SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 10 > n:
                return None
            h = int.from_bytes(data[i + 5:i + 7], "big")
            w = int.from_bytes(data[i + 7:i + 9], "big")
            nc = data[i + 9]
            # component specs: id, (H << 4 | V) sampling, quantisation table
            hv = [data[j] for j in range(i + 11, min(i + 10 + 3 * nc, n), 3)]
            if nc == 1:  # a single component's scan is not interleaved: its MCU is one
                hv = [0x11]  # 8x8 block, whatever sampling factors the header gives it
            return JpegFrame(h, w, nc, marker, i, 8 * max((v & 0x0F for v in hv), default=1),
                             8 * max((v >> 4 for v in hv), default=1))
        if marker == 0xDA:  # start of scan before any SOF: malformed
            return None
        i += 2 + seglen
    return None


def jpeg_scan(data: bytes | memoryview | np.ndarray, frame: JpegFrame) -> JpegScan | None:
    """The scan of a JPEG whose frame is ``frame``: where its entropy-coded data starts and
    its restart interval -- or None unless the first scan codes every component of the
    frame (an interleaved scan: the whole image, as in every baseline JPEG cameras and
    encoders write).  Walks the marker segments from the SOF to the SOS."""
    i, n, restart, index = frame.offset, len(data), 0, (0, 0)
    tag = len(_INDEX_TAG)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        seglen = int(data[i + 2]) << 8 | int(data[i + 3])
        if marker == 0xDD and seglen == 4 and i + 6 <= n:  # DRI
            restart = int(data[i + 4]) << 8 | int(data[i + 5])
        elif marker == _APP15 and i + 2 + seglen <= n and bytes(data[i + 4:i + 4 + tag]) == _INDEX_TAG:
            index = (i, i + 2 + seglen)
        elif marker == 0xDA:  # SOS: number of components in the scan
            if i + 5 > n or data[i + 4] != frame.components:
                return None
            return JpegScan(i + 2 + seglen, restart, i, index)
        i += 2 + seglen
    return None


def restart_marks(data: np.ndarray) -> np.ndarray:
    """Offsets of the RSTn markers (``FF D0``-``FF D7``) in entropy-coded ``data`` (uint8)
    -- byte stuffing keeps any other ``FF`` there from looking like one."""
    ff = np.flatnonzero(data[:-1] == 0xFF)
    nxt = data[ff + 1]
    return ff[(nxt >= 0xD0) & (nxt <= 0xD7)]


def indexed_marks(buf: np.ndarray, scan: JpegScan) -> np.ndarray | None:
    """The RSTn marker offsets (from the start of the entropy-coded data) that the
    restart index of a JPEG (uint8 ``buf``) claims, unchecked, or None if it has no
    index (NOTE [ restart index ]; the caller checks the markers it uses)."""
    a, b = scan.index
    start = a + 4 + len(_INDEX_TAG)
    if b <= start or (b - start) % 2:  # none, or not a list of uint16 (damaged)
        return None
    lengths = np.frombuffer(buf[start:b], "<u2")
    return np.cumsum(lengths, dtype=np.int64) - 2


def add_restart_index(data: bytes) -> bytes:
    """``data`` with a restart index (NOTE [ restart index ]) before its SOS, if its
    restart markers tile it in a grid and it has no index yet; else ``data`` itself
    (also when the segments do not fit an index, or are not where the header says)."""
    frame = jpeg_frame(data)
    scan = None if frame is None else jpeg_scan(data, frame)
    lay = None if scan is None or scan.index != (0, 0) else restart_layout(frame, scan)
    if lay is None:
        return data
    bands, groups = lay[:2]
    marks = restart_marks(np.frombuffer(data, np.uint8)[scan.offset:])
    if len(marks) != bands * groups - 1 or not 0 < len(marks) <= _INDEX_MAX:
        return data
    lengths = np.diff(marks + 2, prepend=0)
    if lengths.max() > 0xFFFF:
        return data
    payload = _INDEX_TAG + lengths.astype("<u2").tobytes()
    seg = b"\xff" + bytes([_APP15]) + (len(payload) + 2).to_bytes(2, "big") + payload
    return data[:scan.sos] + seg + data[scan.sos:]


def jpeg_info(data: bytes | memoryview) -> tuple[int, int, int] | None:
    """(height, width, components) from a JPEG's SOF marker, or None if not found."""
    frame = jpeg_frame(data)
    return None if frame is None else frame[:3]


def _has_jpeg_end(data: bytes) -> bool:
    """True if the JPEG ends with an EOI marker (allowing trailing padding).

    libjpeg decodes a truncated file to a grey-filled image with only a warning, so
    a successful ``imdecode`` does not prove the file is whole.
    """
    tail = data[-4096:].rstrip(b"\x00\r\n \t")
    if tail.endswith(b"\xff\xd9"):
        return True
    # data after the EOI (camera trailers, a second picture): an EOI after the first
    # scan starts -- entropy-coded data cannot hold one; an EXIF thumbnail's EOI sits
    # before the scan and does not count
    frame = jpeg_frame(data)
    scan = None if frame is None else jpeg_scan(data, frame)
    return scan is not None and bytes(data).find(b"\xff\xd9", scan.offset) >= 0


def decode_bgr(data: bytes | memoryview | np.ndarray, flags: int = cv2.IMREAD_COLOR) -> np.ndarray | None:
    """Decode to HWC uint8 **BGR** (OpenCV order); None if OpenCV cannot decode it."""
    return _decode(data, flags)[0]


#: OpenCV's size limits (cv2.error from ``validateInputImageSize``) and the environment
#: variables that raise them, read when OpenCV loads.
_LIMIT_RE = re.compile(r"CV_IO_MAX_IMAGE_(PIXELS|WIDTH|HEIGHT)")


def _decode(data: bytes | memoryview | np.ndarray, flags: int,
            fmt: str = "image") -> tuple[np.ndarray | None, str | None]:
    """(image, None) or (None, why not): ``cv2.imdecode`` on untrusted data, which returns
    None for most damage but *raises* cv2.error for some (a header claiming more pixels
    than OpenCV's limit, 2**30 by default): never let that escape."""
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    if buf.size == 0:
        return None, "empty image"
    try:
        img = cv2.imdecode(buf, flags)
    except cv2.error as e:
        limit = _LIMIT_RE.search(str(e))
        if limit:
            return None, (f"image is too large for OpenCV's decoder (its header claims more "
                          f"than OpenCV's {limit[0]} limit); if it is genuine, raise the limit "
                          f"with the OPEN{limit[0]} environment variable (e.g. "
                          f"OPEN{limit[0]}={1 << 32}) and preprocess again")
        err = (getattr(e, "err", "") or str(e)).strip().splitlines()[-1:] or ["cv2.error"]
        return None, f"{_undecodable(fmt)} ({err[0]})"
    if img is None or img.size == 0:
        return None, _undecodable(fmt)
    return img, None


@dataclass(frozen=True)
class Prepared:
    """The outcome for one source file: bytes to store, or why it was rejected."""

    data: bytes | None
    reencoded: str | None = None
    error: str | None = None


JPEGTRAN_HELP = ("--restart-markers needs libjpeg-turbo's jpegtran on PATH (Debian/Ubuntu: "
                 "apt install libjpeg-turbo-progs; conda: conda install libjpeg-turbo); "
                 "or drop --restart-markers")


def restart_blocks(mcus_per_row: int) -> int:
    """The restart interval (in MCUs) the writer uses for rows of ``mcus_per_row`` MCUs:
    a divisor of the row near 4 MCUs (64 px at 4:2:0), so that segments tile the image
    in a grid a crop can be cut from (NOTE [ restart windows ])."""
    return next(m for m in (4, 3, 5, 6, 2, 7, 8, 1) if mcus_per_row % m == 0)


def restart_layout(frame: JpegFrame, scan: JpegScan) -> tuple[int, int, int, int] | None:
    """``(bands, groups, band_px, group_px)`` of a scan's restart segments when they tile
    the image in a grid -- segment ``b * groups + g`` codes band ``b`` (``band_px`` rows)
    and column group ``g`` (``group_px`` columns) -- or None when they do not: restart
    intervals of whole MCU rows (one group), or of a divisor of the MCUs in a row
    (NOTE [ restart windows ])."""
    per_row = -(-frame.width // frame.mcu_width)
    r = scan.restart
    if r <= 0:
        return None
    if r % per_row == 0:  # every n MCU rows
        n = r // per_row
        return -(-frame.height // (n * frame.mcu_height)), 1, n * frame.mcu_height, frame.width
    if per_row % r == 0:  # every r MCUs, each row starting a segment
        return (-(-frame.height // frame.mcu_height), per_row // r, frame.mcu_height,
                r * frame.mcu_width)
    return None


def grid_scan(data: bytes | memoryview | np.ndarray) -> JpegScan | None:
    """A JPEG's scan if its restart markers tile it in a grid (:func:`restart_layout`),
    else None."""
    frame = jpeg_frame(data)
    scan = None if frame is None else jpeg_scan(data, frame)
    return scan if scan is not None and restart_layout(frame, scan) is not None else None


def restart_grid(data: bytes | memoryview | np.ndarray) -> bool:
    """Whether a JPEG's restart markers tile it in a grid (:func:`restart_layout`)."""
    return grid_scan(data) is not None


def add_restart_markers(data: bytes) -> bytes:
    """``data`` losslessly transcoded with restart markers every few MCUs, each MCU row
    starting a new interval, and optimal Huffman tables (``jpegtran -restart <m>B
    -optimize -copy all``, ``m`` from :func:`restart_blocks`: coefficients and metadata
    are copied, pixels do not change; progressive files become sequential), with a
    restart index (NOTE [ restart index ]).  A JPEG whose markers already tile it only
    gets the index (``data`` itself if it has one); ``data`` itself if jpegtran fails or
    warns (damaged data is kept as it was).  Raises RuntimeError if jpegtran is not
    installed."""
    frame = jpeg_frame(data)
    if frame is None:
        return data
    if restart_grid(data):
        return add_restart_index(data)
    exe = shutil.which("jpegtran")
    if exe is None:
        raise RuntimeError(JPEGTRAN_HELP)
    m = restart_blocks(-(-frame.width // frame.mcu_width))
    try:
        r = subprocess.run([exe, "-restart", f"{m}B", "-optimize", "-copy", "all"], input=data,
                           capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:  # pragma: no cover - a pathological file
        return data
    if r.returncode != 0 or r.stderr or not restart_grid(r.stdout):
        return data
    return add_restart_index(r.stdout)


def _encode_jpeg(bgr: np.ndarray, quality: int, restart: bool = False) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_OPTIMIZE, 1]
    if restart:  # OpenCV writes 4:2:0: MCUs of 16 x 16 px
        params += [cv2.IMWRITE_JPEG_RST_INTERVAL, restart_blocks(-(-bgr.shape[1] // 16))]
    ok, buf = cv2.imencode(".jpg", bgr, params)
    if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
        raise RuntimeError("OpenCV failed to encode a JPEG")
    return add_restart_index(buf.tobytes()) if restart else buf.tobytes()


def _shrink(bgr: np.ndarray, max_size: int) -> np.ndarray:
    h, w = bgr.shape[:2]
    scale = max_size / min(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)


# NOTE [ decode check ]
# A JPEG that is stored unchanged is checked by decoding it at 1/8 scale in
# grayscale (IMREAD_REDUCED_GRAYSCALE_8).  libjpeg still reads the headers and
# entropy-decodes every coefficient of every component -- which is where a damaged
# file fails -- and only the inverse DCT, upsampling and colour conversion shrink;
# truncation is caught by the end-of-image check above (libjpeg only warns about it).
# Images that are re-encoded (CMYK, PNG, --max-size) are decoded in full, since their
# pixels are needed.


_CHECK_FLAGS = cv2.IMREAD_REDUCED_GRAYSCALE_8 | cv2.IMREAD_IGNORE_ORIENTATION
#: A full decode, for re-encoding: EXIF orientation ignored, as for the images stored as they
#: are and by PIL (torchvision's loader), so a re-encoded image keeps its SOF's rows x columns.
_FULL_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


_TRUNCATED = "truncated JPEG (no end-of-image marker)"


def _undecodable(fmt: str) -> str:
    return f"OpenCV cannot decode this {fmt.upper()} data"


def _decode_check(data: bytes, fmt: str) -> str | None:
    """The decode half of the check (NOTE [ decode check ]): a JPEG at 1/8 scale,
    anything else in full; why it fails, or None."""
    return _decode(data, _CHECK_FLAGS if fmt == "jpeg" else _FULL_FLAGS, fmt)[1]


def check_stored(data: bytes) -> str | None:
    """Why the stored image ``data`` would not decode, or None if it does: the same
    checks as the writer's (NOTE [ decode check ]: a JPEG must end with EOI and decode
    at 1/8 scale; anything else is decoded in full).  Pure and fork-safe."""
    if not data:
        return "empty image"
    fmt = sniff_format(data)
    if fmt == "jpeg" and not _has_jpeg_end(data):
        return _TRUNCATED
    return _decode_check(data, fmt)


def prepare_image(data: bytes, *, verify: bool = True, max_size: int | None = None,
                  quality: int = 95, restart: bool = False) -> Prepared:
    """Decide what to store for the encoded image ``data`` (see NOTE [ what gets stored ]).

    With ``verify`` the image is decoded (NOTE [ decode check ]) and JPEGs must end with
    an EOI marker;
    a failure gives ``Prepared(None, error=reason)``.  Without it, only the header is
    inspected (a broken file may then be stored).  With ``restart`` the stored JPEG has
    restart markers in a grid (NOTE [ what gets stored ]; JPEGs stored as they
    are need ``jpegtran``, RuntimeError without it; ``reencoded="restart"`` marks the
    lossless transcode).  Pure and thread-safe; OpenCV releases the GIL while
    decoding, so threads parallelise this.
    """
    if not data:
        return Prepared(None, error="empty file")
    fmt = sniff_format(data)
    info = jpeg_info(data) if fmt == "jpeg" else None
    if fmt == "jpeg" and info is None:
        return Prepared(None, error="JPEG header is damaged (no frame marker)")
    if fmt == "unknown":
        return Prepared(None, error="not an image (unrecognised file signature)")
    reason = None
    if fmt != "jpeg":
        reason = fmt
    elif info[2] == 4:
        reason = "cmyk"
    elif info[2] not in (1, 3):
        return Prepared(None, error=f"JPEG with {info[2]} colour components")
    if fmt == "jpeg" and verify and not _has_jpeg_end(data):
        return Prepared(None, error=_TRUNCATED)
    small_enough = info is not None and max_size is not None and min(info[:2]) <= max_size
    as_is = reason is None and (max_size is None or small_enough)
    if restart and as_is:  # the one jpegtran attempt for bytes stored as they are
        if restart_grid(data):  # markers there already: only an index, and checked below
            data = add_restart_index(data)
        else:
            out = add_restart_markers(data)
            if out is not data:  # jpegtran decoded all of it without a warning: checked
                return Prepared(out, "restart")
    need_pixels = reason is not None or verify or (max_size is not None and not small_enough)
    if not need_pixels:
        return Prepared(data)
    if as_is:  # stored as is: only checked, at 1/8 scale (NOTE [ decode check ])
        why = _decode_check(data, fmt)
        return Prepared(data) if why is None else Prepared(None, error=why)
    bgr, why = _decode(data, _FULL_FLAGS, fmt)
    if bgr is None:
        return Prepared(None, error=why)
    if max_size is not None and min(bgr.shape[:2]) > max_size:
        return Prepared(_encode_jpeg(_shrink(bgr, max_size), quality, restart), "resized")
    if reason is not None:
        return Prepared(_encode_jpeg(bgr, quality, restart), reason)
    # the header said larger than max_size, the pixels do not: kept as they are
    out = add_restart_markers(data) if restart else data
    return Prepared(out, None if out is data else "restart")
