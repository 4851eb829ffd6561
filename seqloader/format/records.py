"""One record value: a msgpack map ``{"image": bytes, "label": int, ...}``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import FormatError
from .targets import decode_target, encode_target

__all__ = ["Record", "pack_record", "unpack_record", "image_span", "label_at", "IMAGE_HEAD",
           "LABEL_TAIL"]


@dataclass
class Record:
    """One sample: the encoded image bytes and its integer label -- or, in version-3
    files, its ``target`` (any value; ``label`` is then -1) and/or its image as pixels
    (``shape`` ``(h, w, 3)``; ``image`` the uint8 RGB bytes)."""

    image: bytes
    label: int
    path: str | None = None
    reencoded: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the target of a ``target_kind == "any"`` record (NOTE [ targets ]); None otherwise
    target: Any = None
    #: ``(h, w, 3)`` of a stored-pixels record (NOTE [ stored pixels ]); None for encoded bytes
    shape: tuple[int, ...] | None = None


def pack_record(rec: Record) -> bytes:
    """Serialize ``rec`` to its msgpack value.  Deterministic for equal records.  A
    record with a ``target`` stores it instead of ``label``."""
    d: dict[str, Any] = {"image": rec.image}
    if rec.target is None:
        d["label"] = int(rec.label)
    else:
        d["target"] = encode_target(rec.target)
    if rec.shape is not None:
        d["shape"] = [int(x) for x in rec.shape]
    if rec.path is not None:
        d["path"] = rec.path
    if rec.reencoded is not None:
        d["reencoded"] = rec.reencoded
    for k, v in rec.extra.items():
        if k in d:
            raise ValueError(f"extra field {k!r} collides with a standard record field")
        d[k] = v
    return msgpack.packb(d, use_bin_type=True)


_RECORD_FIELDS = ("image", "label", "path", "reencoded", "target", "shape")


# NOTE [ record layout ]
# :func:`pack_record` writes a msgpack map whose first entries are "image" (bin) and
# "label" (int), in that order.  A reader that wants only those two can then find them
# without unpacking the record (which copies the image out): the image's bytes start
# within the first IMAGE_HEAD bytes, and the label follows them within LABEL_TAIL bytes.
# Values of any other layout (another writer) go through ``msgpack.unpackb``.
#: Bytes of a record that hold the map, the "image" key and the bin header.
IMAGE_HEAD = 12
#: Bytes after the image that hold the "label" key and its integer.
LABEL_TAIL = 15
_BIN = {0xc4: 1, 0xc5: 2, 0xc6: 4}
_INT = {0xcc: (1, False), 0xcd: (2, False), 0xce: (4, False), 0xcf: (8, False),
        0xd0: (1, True), 0xd1: (2, True), 0xd2: (4, True), 0xd3: (8, True)}


def image_span(head: bytes | memoryview, length: int) -> tuple[int, int] | None:
    """Where a record's image lies, ``(start, stop)`` within the record, from its first
    :data:`IMAGE_HEAD` bytes and its ``length`` (NOTE [ record layout ]); None when the
    record does not start as :func:`pack_record` writes (then unpack it)."""
    if len(head) < 9 or not 0x82 <= head[0] <= 0x8f or head[1:7] != b"\xa5image":
        return None
    size = _BIN.get(head[7])
    if size is None or len(head) < 8 + size:
        return None
    start = 8 + size
    stop = start + int.from_bytes(head[8:start], "big")
    return (start, stop) if stop + 7 <= length else None


def label_at(tail: bytes | memoryview) -> int | None:
    """The label from the bytes right after a record's image (at most
    :data:`LABEL_TAIL`); None for another layout."""
    if len(tail) < 7 or tail[:6] != b"\xa5label":
        return None
    t = tail[6]
    if t < 0x80:
        return t
    if t >= 0xe0:
        return t - 0x100
    size, signed = _INT.get(t, (0, False))
    if not size or len(tail) < 7 + size:
        return None
    return int.from_bytes(tail[7:7 + size], "big", signed=signed)



def unpack_record(value: bytes | memoryview, *, where: str = "record") -> Record:
    """Parse a record value; raises :class:`FormatError` naming ``where`` if malformed."""
    try:
        d = msgpack.unpackb(value, raw=False)
        image, label = d["image"], (d["label"] if "target" not in d else d.get("label", -1))
    except Exception as e:  # msgpack raises several unrelated exception types
        raise FormatError(f"{where}: not a valid seqloader record ({type(e).__name__}: {e}); "
                          "run `seqloader verify` on the file, or re-create it") from None
    if not isinstance(image, bytes) or not isinstance(label, int):
        raise FormatError(f"{where}: record has image of type {type(image).__name__} and "
                          f"label of type {type(label).__name__}; expected bytes and int")
    shape = d.get("shape")
    if shape is not None:
        shape = tuple(shape)
        if (len(shape) != 3 or shape[2] != 3 or not all(isinstance(x, int) and x > 0 for x in shape)
                or len(image) != shape[0] * shape[1] * 3):
            raise FormatError(f"{where}: stored pixels of shape {list(shape)} in {len(image)} "
                              "bytes; expected [h, w, 3] and h*w*3 bytes: the file is damaged, "
                              "re-create it")
    return Record(image=image, label=label, path=d.get("path"), reencoded=d.get("reencoded"),
                  extra={k: v for k, v in d.items() if k not in _RECORD_FIELDS},
                  target=decode_target(d["target"], where) if "target" in d else None,
                  shape=shape)
