"""Is this image whole and decodable: the container format from the first bytes
(:func:`sniff_format`), a JPEG's end marker (:func:`has_jpeg_end`) and the check a stored
image passes (:func:`check_stored`) -- shared by the writer and the read-side ``verify``."""
from __future__ import annotations

import cv2
import numpy as np

from .decoders import check_jpeg, imdecode_checked
from .jpeg import jpeg_frame, jpeg_scan

__all__ = ["sniff_format", "has_jpeg_end", "check_stored", "CHECK_FLAGS", "FULL_FLAGS",
           "TRUNCATED"]

#: File signatures of the containers OpenCV or Pillow decode (the name is what
#: ``reencoded`` says for a non-JPEG; a file whose signature is unknown is still
#: offered to both decoders).
_MAGIC = [
    (b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"),
    (b"GIF89a", "gif"), (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"),
    (b"II+\x00", "bigtiff"), (b"MM\x00+", "bigtiff"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jp2"), (b"\xff\x4f\xff\x51", "j2k"),
    (b"#?RADIANCE", "hdr"), (b"#?RGBE", "hdr"), (b"\x59\xa6\x6a\x95", "sunraster"),
    (b"v/1\x01", "exr"), (b"PF\n", "pfm"), (b"Pf\n", "pfm"), (b"P7", "pam"),
]
#: ISO base media (``....ftyp<brand>``) brands of still images: AVIF and HEIF.
_FTYP = {b"avif": "avif", b"avis": "avif", b"heic": "heif", b"heix": "heif", b"mif1": "heif",
         b"msf1": "heif"}


def sniff_format(data: bytes) -> str:
    """The container format from the first bytes: 'jpeg', 'png', 'webp', 'bigtiff',
    'jp2', ... or 'unknown'."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp" and bytes(data[8:12]) in _FTYP:
        return _FTYP[bytes(data[8:12])]
    if data[:2] in (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6"):
        return "pnm"
    return "unknown"


def has_jpeg_end(data: bytes) -> bool:
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


#: The check decode of a JPEG: grey, at 1/8 scale (decodes every scan, cheaply).
CHECK_FLAGS = cv2.IMREAD_REDUCED_GRAYSCALE_8 | cv2.IMREAD_IGNORE_ORIENTATION
#: A full decode, for re-encoding: EXIF orientation ignored, as for the images stored as they
#: are and by PIL (torchvision's loader), so a re-encoded image keeps its SOF's rows x columns.
FULL_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION

#: Why a JPEG without its end-of-image marker is refused.
TRUNCATED = "truncated JPEG (no end-of-image marker)"


def check_stored(data: bytes) -> str | None:
    """Why the stored image ``data`` would not decode, or None if it does: a JPEG must
    end with EOI and decode at 1/8 scale -- with a warning is fine, a writer with
    ``verify=False`` may store such files -- anything else must decode in full.
    Silent (NOTE [ decoder chatter ] in ``decoders.py``).  Pure and fork-safe."""
    if not data:
        return "empty image"
    fmt = sniff_format(data)
    if fmt == "jpeg":
        if not has_jpeg_end(data):
            return TRUNCATED
        ok, why = check_jpeg(data)
        if ok:
            return None
        img, text = imdecode_checked(np.frombuffer(data, np.uint8), CHECK_FLAGS, fmt)
        return None if img is not None else text
    img, why = imdecode_checked(np.frombuffer(data, np.uint8), FULL_FLAGS, fmt)
    return None if img is not None else why
