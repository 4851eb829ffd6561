"""One record value: a msgpack map ``{"image": bytes, "label": int, ...}``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import FormatError

__all__ = ["Record", "pack_record", "unpack_record"]


@dataclass
class Record:
    """One sample: the encoded image bytes and its integer label."""

    image: bytes
    label: int
    path: str | None = None
    reencoded: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def pack_record(rec: Record) -> bytes:
    """Serialize ``rec`` to its msgpack value.  Deterministic for equal records."""
    d: dict[str, Any] = {"image": rec.image, "label": int(rec.label)}
    if rec.path is not None:
        d["path"] = rec.path
    if rec.reencoded is not None:
        d["reencoded"] = rec.reencoded
    for k, v in rec.extra.items():
        if k in d:
            raise ValueError(f"extra field {k!r} collides with a standard record field")
        d[k] = v
    return msgpack.packb(d, use_bin_type=True)


_RECORD_FIELDS = ("image", "label", "path", "reencoded")


def unpack_record(value: bytes | memoryview, *, where: str = "record") -> Record:
    """Parse a record value; raises :class:`FormatError` naming ``where`` if malformed."""
    try:
        d = msgpack.unpackb(value, raw=False)
        image, label = d["image"], d["label"]
    except Exception as e:  # msgpack raises several unrelated exception types
        raise FormatError(f"{where}: not a valid seqloader record ({type(e).__name__}: {e}); "
                          "run `seqloader verify` on the file, or re-create it") from None
    if not isinstance(image, bytes) or not isinstance(label, int):
        raise FormatError(f"{where}: record has image of type {type(image).__name__} and "
                          f"label of type {type(label).__name__}; expected bytes and int")
    return Record(image=image, label=label, path=d.get("path"), reencoded=d.get("reencoded"),
                  extra={k: v for k, v in d.items() if k not in _RECORD_FIELDS})
