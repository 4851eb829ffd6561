"""The metadata record of a database file: what it holds, whether it is complete, how
it was written; read and checked here."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from ..errors import EmptyDatabaseError, FormatError, IncompleteError
from .checksum import CHECKSUM_ALGORITHM, HASHES
from .keys import META_KEY
from .targets import TARGET_KINDS

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Meta", "EmptyDatabaseError", "EXTENT_DTYPE",
           "meta_extents", "DIGEST_BYTES", "digest_entry", "meta_digests", "pack_meta",
           "unpack_meta", "PLAIN_VERSION", "IMAGE_FORMATS", "file_version"]

FORMAT_NAME = "seqloader"
#: Bumped whenever a reader of the previous version could misread a new file.
#: Version 2 (seqloader 0.2): the checksum is SHA-256 (``Meta.checksum_algorithm``);
#: version 1 files (BLAKE2b) are still read and verified.
#: Version 3: records with any target or stored pixels (``seqloader/format/records.py``);
#: a file using neither is written as :data:`PLAIN_VERSION`, which older seqloaders read.
FORMAT_VERSION = 3
#: The version of files with class labels and JPEG images (readable by seqloader 0.2).
PLAIN_VERSION = 2
#: Values of ``Meta.image_format``: encoded images (JPEG), or decoded pixels.
IMAGE_FORMATS = ("jpeg", "pixels")



@dataclass
class Meta:
    """The metadata record of one database file (one shard of a split).

    ``num_records`` counts the records in *this* file (a shard's global offset is the
    sum of the earlier shards' counts, so shards can be written independently).
    ``checksum`` is :func:`~seqloader.format.checksum.chain_checksum` over this file's
    records, in key order, with the hash ``checksum_algorithm`` (``"sha256"``;
    ``"blake2b-256"`` in version 1 files).
    ``bad_files`` lists ``[path, reason]`` of skipped sources; ``labels`` holds every
    record's label (int32 little-endian) so label statistics need no data pass.  ``fingerprint``
    identifies the writer's plan (sources, order, options): a resumed write must
    match it, and shards of one split share it.
    """

    split: str
    classes: list[str]
    num_records: int
    complete: bool
    checksum: str
    fingerprint: str
    checksum_algorithm: str = CHECKSUM_ALGORITHM
    shard: int = 0
    num_shards: int = 1
    image_bytes: int = 0
    shuffled: bool = False
    seed: int | None = None
    created: str = ""
    writer: dict[str, Any] = field(default_factory=dict)
    labels: bytes = b""  # int32 little-endian, one per record; written on completion
    #: Where each record's value lies in the file: :data:`EXTENT_DTYPE` (file offset
    #: uint64 + length uint32, little-endian), one per record; written on completion.
    #: Optional: without it (older files) readers find records through the B-tree.
    extents: bytes = b""
    #: Each record value's digest (its step of the checksum chain, ``record_digest``),
    #: the first :data:`DIGEST_BYTES` bytes, one per record in order; written on
    #: completion (NOTE [ record digests ]).  Optional: older files have none.
    digests: bytes = b""
    # writer progress (meaningful while complete is False)
    next_source: int = 0
    bad_files: list[list[str]] = field(default_factory=list)
    #: ``[path, warning]`` of sources stored although a decoder warned (NOTE [ damaged
    #: JPEGs ] in ``seqloader/write/prepare.py``); absent in files of older writers
    warned_files: list[list[str]] = field(default_factory=list)
    #: what records hold as targets: "class" (``label``) or "any" (``target``; NOTE [ targets ])
    target_kind: str = "class"
    #: what records hold as images: "jpeg" (encoded bytes) or "pixels" (NOTE [ stored pixels ])
    image_format: str = "jpeg"
    format: str = FORMAT_NAME
    #: :func:`file_version` of the two fields above (set by the writer)
    version: int = PLAIN_VERSION

    @property
    def num_classes(self) -> int:
        return len(self.classes)


_META_FIELDS = {f.name for f in dataclasses.fields(Meta)}

#: One entry of :attr:`Meta.extents`: a record value's byte offset in the file and its length.
EXTENT_DTYPE = np.dtype([("offset", "<u8"), ("length", "<u4")])


def meta_extents(meta: Meta, size: int, *, where: str) -> np.ndarray | None:
    """:attr:`Meta.extents` as an array, checked against the file's ``size``; None when
    the file has none.  Raises :class:`FormatError` if they cannot describe this file."""
    if not meta.extents:
        return None
    ext = np.frombuffer(meta.extents, EXTENT_DTYPE)
    if len(meta.extents) != meta.num_records * EXTENT_DTYPE.itemsize or (
            len(ext) and int((ext["offset"] + ext["length"]).max()) > size):
        raise FormatError(f"{where}: the metadata's record extents do not fit this file "
                          f"({size} bytes, {meta.num_records} records); it is truncated or "
                          "damaged: re-copy it, or check it with `seqloader verify`")
    return ext


# NOTE [ record digests ]
# The checksum is one chain over all of a file's records, so a reader that fetches some
# records (over the network, in any order) cannot check them against it.  ``digests``
# holds, for each record in order, the first 8 bytes of the digest the chain already
# computes for it (``record_digest(value)``: SHA-256 in files that have the table), so
# each record can be checked on its own (``seqloader/read/remotecheck.py``), for
# 8 bytes per record (10 MB for ImageNet's 1.28 M) and no extra pass at write time.
# 64 bits guard against damage and mix-ups, not against an adversary who can write
# the file (who could rewrite the metadata too).  No version bump: every seqloader
# since the first drops metadata fields it does not know (``unpack_meta``), so older
# readers read these files as before, and files without the table are checked as
# before.  ``seqloader verify`` checks the table against the records.

#: Bytes of each record's digest kept in :attr:`Meta.digests`.
DIGEST_BYTES = 8


def digest_entry(digest: bytes) -> bytes:
    """The :attr:`Meta.digests` entry of a record whose ``record_digest`` is ``digest``."""
    return digest[:DIGEST_BYTES]


def meta_digests(meta: Meta, *, where: str) -> bytes | None:
    """:attr:`Meta.digests`, checked against the record count; None when the file has none
    (NOTE [ record digests ]).  Raises :class:`FormatError` if it cannot be this file's."""
    if not meta.digests:
        return None if meta.num_records else b""
    if len(meta.digests) != meta.num_records * DIGEST_BYTES:
        raise FormatError(f"{where}: the metadata's record digests ({len(meta.digests)} bytes) "
                          f"do not fit its {meta.num_records} records; the metadata is damaged: "
                          "re-copy the file, or check it with `seqloader verify`")
    return bytes(meta.digests)


def file_version(target_kind: str = "class", image_format: str = "jpeg") -> int:
    """The format version a file with these features is written as: :data:`PLAIN_VERSION`
    unless it uses version 3's (any targets, stored pixels), so that older seqloaders
    read every file they can read correctly and refuse the others."""
    if target_kind not in TARGET_KINDS:
        raise ValueError(f"target_kind={target_kind!r}: use one of {', '.join(TARGET_KINDS)}")
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format={image_format!r}: use one of {', '.join(IMAGE_FORMATS)}")
    return PLAIN_VERSION if (target_kind, image_format) == ("class", "jpeg") else FORMAT_VERSION


def pack_meta(meta: Meta) -> bytes:
    return msgpack.packb(dataclasses.asdict(meta), use_bin_type=True)


def unpack_meta(value: bytes | memoryview | None, *, where: str, require_complete: bool = True) -> Meta:
    """Parse and check a metadata value read from ``where`` (a path, for messages).

    Raises :class:`FormatError` for a missing/foreign/newer-version metadata record and
    :class:`IncompleteError` for an unfinished file when ``require_complete``.
    """
    if value is None:
        raise FormatError(f"{where}: no seqloader metadata record ({META_KEY!r}); this LMDB "
                          "was not written by seqloader. Convert the image folder with "
                          "`seqloader preprocess` (or preprocess_sequential.py)")
    try:
        d = msgpack.unpackb(value, raw=False)
    except Exception as e:
        raise FormatError(f"{where}: metadata record is not valid msgpack ({e}); the file is "
                          "damaged: re-create it with `seqloader preprocess`") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
        raise FormatError(f"{where}: metadata does not describe a seqloader database")
    version = d.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise FormatError(f"{where}: format version {version!r} is not supported by this "
                          f"seqloader (reads version {FORMAT_VERSION}); upgrade seqloader "
                          "(`pip install -U seqloader`) or re-create the file with this version")
    if version == 1:  # NOTE [ checksum ]: version 1 had one algorithm and no field for it
        d["checksum_algorithm"] = "blake2b-256"
    if d.setdefault("checksum_algorithm", CHECKSUM_ALGORITHM) not in HASHES:
        raise FormatError(f"{where}: checksum algorithm {d.get('checksum_algorithm')!r} is not "
                          f"one this seqloader knows ({', '.join(sorted(HASHES))}); the file "
                          "is damaged or from a newer seqloader: upgrade, or re-create it")
    meta = Meta(**{k: v for k, v in d.items() if k in _META_FIELDS})
    if meta.target_kind not in TARGET_KINDS or meta.image_format not in IMAGE_FORMATS:
        raise FormatError(f"{where}: records with target kind {meta.target_kind!r} and image "
                          f"format {meta.image_format!r}, which this seqloader does not know; "
                          "the file is from a newer seqloader: upgrade (`pip install -U seqloader`)")
    if require_complete and not meta.complete:
        raise IncompleteError(
            f"{where}: the database is incomplete ({meta.num_records} records written, writer "
            "did not finish). Re-run the same preprocessing command to resume it")
    return meta
