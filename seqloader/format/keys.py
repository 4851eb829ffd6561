"""Record keys and the metadata key: how values are found inside one LMDB file."""
from __future__ import annotations

import struct

from ..errors import FormatError

__all__ = ["META_KEY", "KEY_PREFIX", "KEY_SIZE", "encode_key", "decode_key", "is_record_key"]

#: The metadata key.  It sorts before every record key (``b"_" < b"r"``), so the
#: writer can keep appending records (``append=True`` needs each new key to be the
#: largest) while it rewrites the metadata in the same transactions.
META_KEY = b"__seqloader_meta__"
KEY_PREFIX = b"r"
KEY_STRUCT = struct.Struct(">Q")
KEY_SIZE = len(KEY_PREFIX) + KEY_STRUCT.size


def encode_key(index: int) -> bytes:
    """The LMDB key of record ``index``: ``b"r"`` + 8-byte big-endian index."""
    if not 0 <= index < 2**63:
        raise ValueError(f"record index {index} is out of range [0, 2**63)")
    return KEY_PREFIX + KEY_STRUCT.pack(index)


def decode_key(key: bytes) -> int:
    """Inverse of :func:`encode_key`."""
    if not is_record_key(key):
        raise FormatError(f"key {bytes(key)!r} is not a record key (expected b'r' + 8 bytes)")
    return KEY_STRUCT.unpack_from(key, 1)[0]


def is_record_key(key: bytes) -> bool:
    return len(key) == KEY_SIZE and key[:1] == KEY_PREFIX
