"""Decompression bombs, for tests and benchmarks of the pixel limit (NOTE [ pixel limit ]
in ``seqloader/format/imagesize.py``): small, valid files whose headers claim huge images.

* :func:`jpeg_bomb`: an 8x8 JPEG whose SOF says ``width x height`` (~630 bytes; a decoder
  allocates and fills the whole image from the few coefficients there are);
* :func:`png_bomb`: a genuine grey PNG of zeros (30000 x 30000: ~875 KB), built in a
  fraction of a second: one deflate block of zero rows, ended by a full flush, repeats.
"""
from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np

from ..format.jpeg import jpeg_frame

__all__ = ["jpeg_bomb", "png_bomb"]


def jpeg_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A baseline JPEG of 8x8 pixels whose frame header claims ``width x height``."""
    ok, buf = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    assert ok
    data = bytearray(buf.tobytes())
    at = jpeg_frame(bytes(data)).offset
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def png_bomb(width: int = 30000, height: int = 30000, rows: int = 200) -> bytes:
    """An 8-bit grey PNG of ``width x height`` zeros (``height`` a multiple of ``rows``)."""
    if height % rows:
        raise ValueError(f"height {height} must be a multiple of rows={rows}")
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = bytes((width + 1) * rows)  # (each row: filter byte 0, then its pixels)
    co.compress(zeros)
    co.flush(zlib.Z_FULL_FLUSH)  # after a full flush, equal input compresses equally
    block = co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH)
    total = (width + 1) * height
    adler = ((total % 65521) << 16) | 1  # Adler-32 of ``total`` zero bytes
    idat = b"\x78\xda" + block * (height // rows) + b"\x03\x00" + struct.pack(">I", adler)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
            + _chunk(b"IEND", b""))
