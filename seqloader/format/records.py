"""One record value: a msgpack map ``{"image": bytes, "label": int, ...}``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import FormatError
from .targets import decode_target, encode_target

__all__ = ["Record", "pack_record", "unpack_record"]


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
