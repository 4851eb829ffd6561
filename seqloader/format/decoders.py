"""Decode untrusted image bytes with every decoder we have, quietly.

NOTE [ decoder chatter ]
libjpeg prints its warnings ("Corrupt JPEG data: 5 extraneous bytes before marker
0xc0", "Premature end of JPEG file") straight to file descriptor 2 from C, as do
libpng, libtiff and OpenCV's own logging: Python cannot catch them, and a terminal
gets one line per damaged image during preprocess, verify or training.  So:
* JPEGs are checked and decoded with simplejpeg (libjpeg-turbo's TurboJPEG API),
  which keeps warnings to itself and, with ``strict=True``, *raises* them: the writer's
  check of every JPEG is silent and tells "decodes with a warning" apart, at no cost.
* Every other decode of untrusted data -- non-JPEG formats, damaged JPEGs, and the
  load-time fallback for bytes simplejpeg refuses -- runs under :func:`captured_stderr`:
  fd 2 points at a scratch file for the call, and what the decoder printed comes back
  as text (the writer reports it with the file's path).  The redirect is process-wide,
  so captures take a lock (they are serialised; the clean-JPEG fast path never takes
  it), and while one is active another thread's output to fd 2 lands in it too; Python
  exceptions are not affected (they are raised, and printed after the redirect ends).
  Cost: ~10 us per captured decode (a few syscalls), on the slow paths only.
PIL's warnings are Python warnings: recorded the same way, under the same lock.
"""
from __future__ import annotations

import atexit
import io
import os
import re
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import cv2
import numpy as np

try:
    import simplejpeg
except ImportError:  # a declared dependency; without it OpenCV checks JPEGs (captured)
    simplejpeg = None

__all__ = ["captured_stderr", "Captured", "imdecode_quiet", "decode_pil", "check_jpeg",
           "decode_any", "imdecode_checked", "undecodable", "clean_jpeg_header"]

_LOCK = threading.Lock()
_SCRATCH: dict[int, object] = {}  # pid -> this process's scratch file (never crosses a fork)


@dataclass
class Captured:
    """What a decoder printed to fd 2 (and PIL warned) inside :func:`captured_stderr`,
    one message per line, stripped; filled in when the block ends."""

    text: str = ""


def _scratch():
    f = _SCRATCH.get(os.getpid())
    if f is None:
        if not _SCRATCH:
            atexit.register(_close_scratch)
        f = _SCRATCH[os.getpid()] = tempfile.TemporaryFile()
    return f


def _close_scratch() -> None:
    """At exit: the scratch files are kept open for the process's life (one per process,
    reused by every capture); closed here so that none is left to the garbage collector
    (``ResourceWarning: unclosed file``).  A forked child closes its copies too."""
    while _SCRATCH:
        _SCRATCH.popitem()[1].close()


@contextmanager
def captured_stderr() -> Iterator[Captured]:
    """Run the block with fd 2 (and Python warnings) captured, under a process-wide
    lock: NOTE [ decoder chatter ].  Yields a :class:`Captured` whose ``text`` holds
    what was printed once the block ends.  Where fd 2 cannot be redirected (closed),
    the block runs as it is."""
    out = Captured()
    with _LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sys.stderr.flush()
            f = _scratch()
            f.seek(0)
            f.truncate()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            yield out
            return
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            lines = f.read(1 << 16).decode("utf-8", "replace").splitlines()
            lines += [str(w.message) for w in caught]
            out.text = "; ".join(s.strip() for s in lines if s.strip())


def imdecode_quiet(buf: np.ndarray, flags: int) -> tuple[np.ndarray | None, str]:
    """``cv2.imdecode`` under :func:`captured_stderr`: (image or None, what it printed).
    May raise cv2.error, as imdecode does."""
    with captured_stderr() as cap:
        img = cv2.imdecode(buf, flags)
    return img, cap.text


def decode_pil(data: bytes) -> tuple[np.ndarray | None, str, str]:
    """Decode with Pillow (the first frame) to HWC uint8 **BGR**, EXIF orientation
    ignored: ``(image, PIL's format name lowercased, warnings)``, or ``(None, "",
    why not)`` -- also when Pillow is not installed."""
    try:
        from PIL import Image
    except ImportError:
        return None, "", "Pillow is not installed"
    with captured_stderr() as cap:
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                fmt = (im.format or "").lower()
                rgb = np.asarray(im.convert("RGB"))
        except Exception as e:  # Pillow raises many types for bad data (OSError, SyntaxError, ...)
            rgb, fmt, err = None, "", f"{type(e).__name__}: {e}"
    if rgb is None:
        return None, "", err
    return np.ascontiguousarray(rgb[:, :, ::-1]), fmt, cap.text


def check_jpeg(data: bytes) -> tuple[bool, str]:
    """Decode a JPEG at 1/8 scale in grey (NOTE [ decode check ] in
    ``seqloader/write/prepare.py``): ``(True, "")`` if it decodes without a warning,
    ``(False, the warning or error)`` otherwise.  Silent (NOTE [ decoder chatter ])."""
    if simplejpeg is not None:
        try:
            simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=1, min_width=1,
                                   strict=True)
            return True, ""
        except ValueError as e:
            return False, str(e).strip() or "libjpeg error"
    try:
        img, text = imdecode_quiet(np.frombuffer(data, np.uint8),
                                   cv2.IMREAD_REDUCED_GRAYSCALE_8 | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error as e:
        return False, str(e).strip().splitlines()[-1]
    if img is None or img.size == 0:
        return False, text or "OpenCV cannot decode this JPEG data"
    return not text, text


#: OpenCV's size limits (cv2.error from ``validateInputImageSize``) and the environment
#: variables that raise them, read when OpenCV loads.
_LIMIT_RE = re.compile(r"CV_IO_MAX_IMAGE_(PIXELS|WIDTH|HEIGHT)")


def imdecode_checked(buf: np.ndarray, flags: int, fmt: str = "image"
                     ) -> tuple[np.ndarray | None, str]:
    """``cv2.imdecode`` on untrusted data, quietly: ``(image, what the decoder printed)``
    or ``(None, why not)``.  imdecode returns None for most damage but *raises*
    cv2.error for some (a header claiming more pixels than OpenCV's limit, 2**30 by
    default): never let that escape."""
    if buf.size == 0:
        return None, "empty image"
    try:
        img, text = imdecode_quiet(buf, flags)
    except cv2.error as e:
        limit = _LIMIT_RE.search(str(e))
        if limit:
            return None, (f"image is too large for OpenCV's decoder (its header claims more "
                          f"than OpenCV's {limit[0]} limit); if it is genuine, raise the limit "
                          f"with the OPEN{limit[0]} environment variable (e.g. "
                          f"OPEN{limit[0]}={1 << 32}) and preprocess again")
        err = (getattr(e, "err", "") or str(e)).strip().splitlines()[-1:] or ["cv2.error"]
        return None, f"{undecodable(fmt)} ({err[0]})"
    if img is None or img.size == 0:
        return None, undecodable(fmt) + (f" ({text})" if text else "")
    return img, text


def undecodable(fmt: str) -> str:
    return f"OpenCV cannot decode this {fmt.upper()} data"


def decode_any(data: bytes, fmt: str) -> tuple[np.ndarray | None, str, str]:
    """Decode to HWC uint8 **BGR**, EXIF orientation ignored, with OpenCV or else Pillow,
    quietly: ``(image, what the decoder warned, its format)`` -- the format is ``fmt``
    unless only Pillow reads it (then Pillow's name for it) -- or ``(None, why not, "")``."""
    bgr, why = imdecode_checked(np.frombuffer(data, np.uint8),
                                cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION, fmt)
    if bgr is not None:
        return bgr, why, fmt
    if "too large" in why:
        return None, why, ""
    img, name, text = decode_pil(data)
    if img is None:
        return None, f"{why}; Pillow cannot either ({text})", ""
    return img, text, name or fmt


def _next_marker(data: bytes, i: int) -> int:
    """Index of the 0xFF (the last of any fill bytes) before the next marker at or after
    ``i`` -- an 0xFF followed by neither 0x00 nor 0xFF -- or -1 (libjpeg's next_marker)."""
    n = len(data)
    j = data.find(b"\xff", i)
    while j >= 0:
        k = j + 1
        while k < n and data[k] == 0xFF:
            k += 1
        if k >= n:
            return -1
        if data[k] != 0x00:
            return k - 1
        j = data.find(b"\xff", k + 1)
    return -1


def clean_jpeg_header(data: bytes) -> bytes | None:
    """``data`` with its header rebuilt from its marker segments, without the bytes
    between them that are not a marker (libjpeg skips them too, warning "extraneous
    bytes before marker"): SOI, the segments up to and including the SOS, then the rest
    untouched -- lossless, every pixel decodes the same.  None if the header has nothing
    to skip or cannot be walked to its SOS (a segment running past the end)."""
    n = len(data)
    if n < 4 or data[:2] != b"\xff\xd8":
        return None
    parts, i, skipped = [b"\xff\xd8"], 2, False
    while i + 4 <= n:
        m = _next_marker(data, i)
        if m < 0:
            return None
        skipped = skipped or bool(data[i:m].strip(b"\xff"))  # (0xFF fill bytes are legal)
        i, marker = m, data[m + 1]
        if marker == 0xD9:  # EOI before any scan
            return None
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # no length (a stray SOI/RSTn: dropped)
            skipped = True
            i += 2
            continue
        end = i + 2 + int.from_bytes(data[i + 2:i + 4], "big")
        if end > n or end < i + 4:
            return None
        if marker == 0xDA:
            parts.append(data[i:])
            return b"".join(parts) if skipped else None
        parts.append(data[i:end])
        i = end
    return None
