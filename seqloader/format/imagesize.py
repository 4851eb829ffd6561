"""An image's size from its header, and the pixel limit checked before any decode.

NOTE [ pixel limit ]
A file of a few hundred bytes can claim 20000 x 20000 pixels (a JPEG whose SOF says so)
and a PNG of under a megabyte 30000 x 30000: a decoder allocates the pixels first (1.2
and 2.7 GB) and fills them for seconds -- per worker.  OpenCV's own limit is 2**30
pixels, far above any photo a model trains on; Pillow refuses more than twice its
``Image.MAX_IMAGE_PIXELS`` (89,478,485), and so do we: :data:`DEFAULT_MAX_PIXELS` =
178,956,970 pixels (e.g. 13,377 x 13,377), above every image of ImageNet (the largest
is under 40 megapixels) and of the common photo datasets.  The size is read from the
header -- JPEG's SOF, PNG's IHDR, and the headers of every other format OpenCV reads
(GIF, BMP, WebP, TIFF, PNM/PAM/PFM, Radiance HDR, Sun raster, JPEG 2000, OpenEXR,
AVIF/HEIF's ``ispe``) -- in a few microseconds, without allocating anything; a format
whose header is not parsed here is asked of Pillow, which reads headers lazily.  An
image over the limit is a bad file of the write (its size in the reason) and, at load
time, a :class:`~seqloader.errors.RecordError` naming the record (databases written
without a limit, or with a higher one than the Loader's).
"""
from __future__ import annotations

import io
import re
import struct

from .jpeg import jpeg_frame

__all__ = ["DEFAULT_MAX_PIXELS", "image_size", "over_pixel_limit", "check_max_pixels"]

#: Pillow's decompression-bomb error threshold: 2 x ``PIL.Image.MAX_IMAGE_PIXELS``.
DEFAULT_MAX_PIXELS = 2 * (1024 * 1024 * 1024 // 4 // 3)

_HEAD = 1 << 16  # how much of a file a header parse looks at (EXR, HEIF: boxes may precede)


def check_max_pixels(max_pixels: int | None, name: str = "max_pixels") -> int | None:
    """``max_pixels`` checked: a positive int, or None (no limit); ValueError naming it."""
    if max_pixels is None:
        return None
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"{name} must be a positive number of pixels (or None: no limit), "
                         f"got {max_pixels!r}")
    return max_pixels


def over_pixel_limit(data: bytes | memoryview | bytearray, max_pixels: int | None, *,
                     fix: str = "to store it, raise the limit (--max-pixels N, or "
                                "max_pixels=N; 0 / None: no limit)") -> str | None:
    """Why ``data`` is refused under the pixel limit (NOTE [ pixel limit ]): its width,
    height and pixels, then ``fix``; None if it is within the limit, no limit is set,
    or its size cannot be read from its header (a decoder then judges it)."""
    if max_pixels is None:
        return None
    size = image_size(data)
    if size is None or size[0] * size[1] <= max_pixels:
        return None
    w, h = size
    return (f"image of {w}x{h} = {w * h:,} pixels is over the pixel limit of {max_pixels:,} "
            f"(a decompression bomb, or a huge image); {fix}")


def image_size(data: bytes | memoryview | bytearray) -> tuple[int, int] | None:
    """``(width, height)`` from an encoded image's header, or None if no parser here or
    in Pillow reads it.  Never decodes pixels."""
    if bytes(data[:2]) == b"\xff\xd8":  # (the common case: no copy of the head)
        f = jpeg_frame(data)
        if f is not None:
            return f.width, f.height
    head = bytes(data[:_HEAD])
    for parse in _PARSERS:
        try:
            size = parse(head, data)
        except (struct.error, IndexError, ValueError):
            size = None
        if size is not None:
            return size
    return _pil_size(head if len(data) <= _HEAD else bytes(data))


def _jpeg(head: bytes, data) -> tuple[int, int] | None:
    if not head.startswith(b"\xff\xd8"):
        return None
    f = jpeg_frame(data)
    return None if f is None else (f.width, f.height)


def _png(head: bytes, data) -> tuple[int, int] | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
        return struct.unpack(">II", head[16:24])
    return None


def _gif_bmp_sun(head: bytes, data) -> tuple[int, int] | None:
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return struct.unpack("<HH", head[6:10])
    if head[:2] == b"BM":
        if struct.unpack("<I", head[14:18])[0] == 12:  # OS/2 BITMAPCOREHEADER
            return struct.unpack("<HH", head[18:22])
        w, h = struct.unpack("<ii", head[18:26])
        return abs(w), abs(h)
    if head[:4] == b"\x59\xa6\x6a\x95":
        return struct.unpack(">II", head[4:12])
    return None


def _webp(head: bytes, data) -> tuple[int, int] | None:
    if head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    chunk = head[12:16]
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        b = int.from_bytes(head[21:25], "little")
        return (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def _tiff(head: bytes, data) -> tuple[int, int] | None:
    order = {b"II*\x00": "<", b"MM\x00*": ">"}.get(head[:4])
    if order is None:
        return None
    buf = bytes(data) if len(data) > len(head) else head
    ifd = struct.unpack(order + "I", buf[4:8])[0]
    (n,) = struct.unpack(order + "H", buf[ifd:ifd + 2])
    found = {}
    for i in range(n):
        e = ifd + 2 + 12 * i
        tag, typ = struct.unpack(order + "HH", buf[e:e + 4])
        if tag in (256, 257):
            fmt = order + ("H" if typ == 3 else "I")
            found[tag] = struct.unpack(fmt, buf[e + 8:e + 8 + struct.calcsize(fmt)])[0]
    return (found[256], found[257]) if len(found) == 2 else None


_PNM = re.compile(rb"^P[1-6Ff]\s+(?:#[^\n]*\n\s*)*(\d+)\s+(?:#[^\n]*\n\s*)*(\d+)")


def _netpbm_hdr(head: bytes, data) -> tuple[int, int] | None:
    m = _PNM.match(head)
    if m:
        return int(m[1]), int(m[2])
    if head[:3] == b"P7\n":
        w = re.search(rb"\nWIDTH\s+(\d+)", head)
        h = re.search(rb"\nHEIGHT\s+(\d+)", head)
        return (int(w[1]), int(h[1])) if w and h else None
    if head[:2] == b"#?":
        m = re.search(rb"\n\s*([-+])Y\s+(\d+)\s+([-+])X\s+(\d+)", head)
        return (int(m[4]), int(m[2])) if m else None
    return None


def _jpeg2000(head: bytes, data) -> tuple[int, int] | None:
    if head[:4] == b"\xff\x4f\xff\x51":  # codestream: SIZ right after SOC
        x, y, x0, y0 = struct.unpack(">IIII", head[8:24])
        return x - x0, y - y0
    if head[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n":
        i = head.find(b"ihdr")
        if i > 0:
            h, w = struct.unpack(">II", head[i + 4:i + 12])
            return w, h
    return None


def _exr_heif(head: bytes, data) -> tuple[int, int] | None:
    if head[:4] == b"v/1\x01":
        i = head.find(b"dataWindow\x00box2i\x00")
        if i > 0:
            x0, y0, x1, y1 = struct.unpack("<iiii", head[i + 21:i + 37])
            return x1 - x0 + 1, y1 - y0 + 1
        return None
    if head[4:8] == b"ftyp":
        i = head.find(b"ispe")
        if i > 0:
            return struct.unpack(">II", head[i + 8:i + 16])
    return None


_PARSERS = (_jpeg, _png, _gif_bmp_sun, _webp, _tiff, _netpbm_hdr, _jpeg2000, _exr_heif)


def _pil_size(data: bytes) -> tuple[int, int] | None:
    """The size Pillow reads from a header it knows (lazily: no pixels), or None."""
    try:
        import warnings

        from PIL import Image
    except ImportError:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with Image.open(io.BytesIO(data)) as im:
                return im.size
        except Exception:  # Pillow raises many types for data it cannot read
            return None
