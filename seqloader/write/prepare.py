"""Inspect, check and (when needed) normalise one encoded image for storage.

NOTE [ what gets stored ]
By default the source file's bytes are stored untouched (no re-encode, no quality
loss).  These cases are re-encoded, as a baseline JPEG, so that every stored image
decodes to a correct 3-channel RGB image with *any* JPEG decoder (OpenCV, PIL,
nvJPEG, ``torchvision.io.decode_jpeg``) and our reduced-scale decode fast path:
* CMYK/YCCK JPEGs (4 components; real ImageNet has 22) -> ``reencoded="cmyk"``;
* non-JPEG data, whatever the file name (PNG saved as ``.JPEG``, BMP, ...) ->
  ``reencoded="png"`` etc.;
* with ``max_size``, images whose shorter side exceeds it -> ``reencoded="resized"``;
* damaged JPEGs that decode with a warning -> ``reencoded="repaired"`` (NOTE [ damaged
  JPEGs ]: junk dropped from the header losslessly, or re-encoded).
Non-JPEG data is decoded by OpenCV or else Pillow; only what neither reads is refused.
Re-encoding ignores the EXIF orientation, as PIL (torchvision's loader) and our reader
do for every image, so a re-encoded image keeps its source's rows and columns.
Grayscale JPEGs are stored as they are: every reader decodes them to 3 channels
(OpenCV's ``IMREAD_COLOR`` replicates the channel).

With ``restart`` (``--restart-markers``) every stored JPEG gets restart markers every
few MCUs, each MCU row starting an interval, so that a reader can decode just the
segments around a crop (NOTE [ restart windows ] in ``seqloader/transforms/jpegwindow.py``): JPEGs
stored as they are go through libjpeg-turbo's ``jpegtran -restart <m>B -optimize`` --
a *lossless* transcode (the DCT coefficients are copied, every pixel decodes the
same) that also gives each file its own optimal Huffman tables, which more than pays
for the markers' bytes (measured: ImageNet-like files 3 % smaller than the originals
instead of 1 % larger, decoding as fast or faster) -- and re-encoded ones are written
with the markers.  Every re-encode uses optimal Huffman tables too.  A JPEG whose markers already
tile it so is kept as it is; one that ``jpegtran`` reports problems with is kept
unchanged too (it still decodes, whole).  Each such JPEG also gets a restart index
(NOTE [ restart index ] in ``seqloader/format/jpeg.py``).
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import cv2
import numpy as np

from ..format.decoders import check_jpeg, clean_jpeg_header, decode_any, imdecode_checked
from ..format.imagecheck import TRUNCATED, has_jpeg_end, sniff_format
from ..format.imagesize import DEFAULT_MAX_PIXELS, over_pixel_limit
from ..format.jpeg import add_restart_index, jpeg_frame, jpeg_info, restart_grid

__all__ = ["Prepared", "prepare_image", "decode_bgr",
           "restart_blocks", "add_restart_markers", "encode_jpeg", "shrink", "JPEGTRAN_HELP"]

def decode_bgr(data: bytes | memoryview | np.ndarray, flags: int = cv2.IMREAD_COLOR) -> np.ndarray | None:
    """Decode to HWC uint8 **BGR** (OpenCV order), quietly (NOTE [ decoder chatter ] in
    ``decoders.py``); None if OpenCV cannot decode it."""
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    return imdecode_checked(buf, flags)[0]


@dataclass(frozen=True)
class Prepared:
    """The outcome for one source file: bytes to store, or why it was rejected."""

    data: bytes | None
    reencoded: str | None = None
    error: str | None = None
    #: what a decoder warned about a source that was stored all the same (e.g. libjpeg's
    #: "Corrupt JPEG data: 5 extraneous bytes before marker 0xc0"); None if nothing
    warning: str | None = None


JPEGTRAN_HELP = ("--restart-markers needs libjpeg-turbo's jpegtran on PATH (Debian/Ubuntu: "
                 "apt install libjpeg-turbo-progs; conda: conda install libjpeg-turbo); "
                 "or drop --restart-markers")


def restart_blocks(mcus_per_row: int) -> int:
    """The restart interval (in MCUs) the writer uses for rows of ``mcus_per_row`` MCUs:
    a divisor of the row near 4 MCUs (64 px at 4:2:0), so that segments tile the image
    in a grid a crop can be cut from (NOTE [ restart windows ])."""
    return next(m for m in (4, 3, 5, 6, 2, 7, 8, 1) if mcus_per_row % m == 0)



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


def encode_jpeg(bgr: np.ndarray, quality: int, restart: bool = False) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_OPTIMIZE, 1]
    if restart:  # OpenCV writes 4:2:0: MCUs of 16 x 16 px
        params += [cv2.IMWRITE_JPEG_RST_INTERVAL, restart_blocks(-(-bgr.shape[1] // 16))]
    ok, buf = cv2.imencode(".jpg", bgr, params)
    if not ok:  # pragma: no cover - OpenCV always encodes a valid uint8 image
        raise RuntimeError("OpenCV failed to encode a JPEG")
    return add_restart_index(buf.tobytes()) if restart else buf.tobytes()


def shrink(bgr: np.ndarray, max_size: int) -> np.ndarray:
    h, w = bgr.shape[:2]
    scale = max_size / min(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(bgr, size, interpolation=cv2.INTER_AREA)


# NOTE [ decode check ]
# A JPEG that is stored unchanged is checked by decoding it at 1/8 scale in grey
# (simplejpeg, strict: a libjpeg warning is an exception, not a line on stderr).
# libjpeg still reads the headers and entropy-decodes every coefficient of every
# component -- which is where a damaged file fails -- and only the inverse DCT,
# upsampling and colour conversion shrink; truncation is caught by the end-of-image
# check above (libjpeg only warns about it).  Images that are re-encoded (CMYK, PNG,
# --max-size) are decoded in full, since their pixels are needed.
#
# NOTE [ damaged JPEGs ]
# A JPEG that OpenCV or Pillow decodes is never refused, however damaged: a
# mainstream loader would read it.  What is stored must decode with our reader --
# which parses the header itself (``jpeg_frame``) and decodes with simplejpeg, whose
# header reader refuses junk -- without a warning, every epoch, so:
# * junk between the header's segments (extraneous bytes before a marker, an APPn
#   segment whose length falls short, bytes before the SOF) is dropped and the
#   segments kept (``clean_jpeg_header``): lossless, every pixel decodes the same;
# * damage beyond that (in the entropy-coded data, a truncated scan that OpenCV still
#   decodes) is re-encoded from what OpenCV, or else Pillow, decodes;
# both get ``reencoded="repaired"`` and the decoder's warning goes into the write
# report with the file's path.  Only a file that no decoder reads is a bad file.


#: Warning for a JPEG whose header had junk between its segments, dropped without a decode.
_JUNK = "Corrupt JPEG data: extraneous bytes between the header's markers (removed)"

def _joined(*warnings: str | None) -> str | None:
    """Warnings as one line, each message once."""
    seen = dict.fromkeys(m for w in warnings if w for m in w.split("; ") if m)
    return "; ".join(seen) or None


def _reencoded(data: bytes, reason: str | None, *, max_size: int | None, quality: int,
               restart: bool, error: str | None = None, warning: str | None = None) -> Prepared:
    """``data`` decoded by OpenCV or else Pillow (:func:`~seqloader.format.decoders.decode_any`)
    and re-encoded as a JPEG (shrunk with ``max_size``): ``reencoded`` is ``reason``
    (None: the decoder's format name), "resized" if shrunk; ``error`` (else the
    decoders' reasons) if neither reads it."""
    bgr, text, fmt = decode_any(data, sniff_format(data))
    if bgr is None:
        return Prepared(None, error=error or text)
    warning = _joined(warning, text)
    if max_size is not None and min(bgr.shape[:2]) > max_size:
        return Prepared(encode_jpeg(shrink(bgr, max_size), quality, restart), "resized",
                        warning=warning)
    return Prepared(encode_jpeg(bgr, quality, restart), reason or fmt, warning=warning)


def prepare_image(data: bytes, *, verify: bool = True, max_size: int | None = None,
                  quality: int = 95, restart: bool = False,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Prepared:
    """Decide what to store for the encoded image ``data`` (see NOTE [ what gets stored ]).

    With ``verify`` the image is decoded (NOTE [ decode check ]) and JPEGs must end with
    an EOI marker or else be read by OpenCV or Pillow all the same; a file no decoder
    reads gives ``Prepared(None, error=reason)``, and one that decodes with a warning is
    stored (NOTE [ damaged JPEGs ]) with the warning in ``Prepared.warning``.  Without
    ``verify``, only the header is inspected (a broken file may then be stored).  With
    ``restart`` the stored JPEG has restart markers in a grid (NOTE [ what gets stored
    ]; JPEGs stored as they are need ``jpegtran``, RuntimeError without it;
    ``reencoded="restart"`` marks the lossless transcode).  An image whose header
    claims more than ``max_pixels`` pixels is refused before anything decodes it (NOTE
    [ pixel limit ] in ``seqloader/format/imagesize.py``; None: no limit), with its
    size.  Silent (NOTE [ decoder chatter ] in ``decoders.py``), pure and thread-safe;
    the decoders release the GIL, so threads parallelise this.
    """
    if not data:
        return Prepared(None, error="empty file")
    too_big = over_pixel_limit(data, max_pixels)
    if too_big is not None:
        return Prepared(None, error=too_big)
    fmt = sniff_format(data)
    opts = dict(max_size=max_size, quality=quality, restart=restart)
    if fmt != "jpeg":
        return _reencoded(data, None if fmt == "unknown" else fmt, **opts,
                          error=None if fmt != "unknown" else
                          "not an image (unrecognised file signature, and neither OpenCV nor "
                          "Pillow decodes it)")
    fixed = warning = None
    info = jpeg_info(data)
    if info is None:  # junk between the header's segments? (libjpeg skips it, warning)
        clean = clean_jpeg_header(data)
        info = None if clean is None else jpeg_info(clean)
        if info is None:  # another decoder may still read it
            return _reencoded(data, "repaired", **opts,
                              error="JPEG header is damaged (no frame marker), and neither "
                                    "OpenCV nor Pillow decodes it")
        fixed, warning = "repaired", (check_jpeg(data)[1] if verify else None) or _JUNK
        data = clean
    if info[2] == 4:
        return _reencoded(data, "cmyk", **opts, warning=warning)
    if info[2] not in (1, 3):
        return _reencoded(data, "repaired", **opts, warning=warning,
                          error=f"JPEG with {info[2]} colour components")
    if verify and not has_jpeg_end(data):  # libjpeg 'decodes' it, grey below; OpenCV 5 not
        return _reencoded(data, "repaired", **opts, error=TRUNCATED,
                          warning=_joined(warning, TRUNCATED))
    small_enough = max_size is None or min(info[:2]) <= max_size
    if restart and small_enough:  # the one jpegtran attempt for bytes stored as they are
        if restart_grid(data):  # markers there already: only an index, and checked below
            data = add_restart_index(data)
        else:
            out = add_restart_markers(data)
            if out is not data:  # jpegtran decoded all of it without a warning: checked
                return Prepared(out, fixed or "restart", warning=warning)
    if not small_enough:  # pixels needed: decoded in full, quietly, and shrunk
        return _reencoded(data, fixed, **opts, warning=warning)
    if verify:  # stored as is: only checked, at 1/8 scale (NOTE [ decode check ])
        ok, why = check_jpeg(data)
        if not ok:  # NOTE [ damaged JPEGs ]
            clean = clean_jpeg_header(data)
            if clean is not None and check_jpeg(clean)[0]:
                data, fixed, warning = clean, "repaired", why
            else:
                return _reencoded(data, "repaired", **opts, error=why, warning=why)
    if restart and fixed and not restart_grid(data):
        data = add_restart_markers(data)
    return Prepared(data, fixed, warning=warning)
