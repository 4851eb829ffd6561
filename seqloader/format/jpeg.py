"""The JPEG structure a stored image is read by: its frame (SOF), its scan (SOS), the
restart markers and the restart index -- parsing only, no decoding.

NOTE [ restart index ]
Splicing a window out of a JPEG (NOTE [ restart windows ] in ``seqloader/transforms/jpegwindow.py``)
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

from typing import NamedTuple

import numpy as np

__all__ = ["JpegFrame", "JpegScan", "jpeg_frame", "jpeg_scan", "jpeg_info", "restart_marks",
           "indexed_marks", "restart_layout", "grid_scan", "restart_grid", "add_restart_index"]


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
