"""The on-disk contract of a seqloader database, in one place.

A seqloader database is one LMDB file (``subdir=False``) per shard.  Inside it:

* **Records** live under 9-byte keys: ``b"r"`` followed by the record's index
  within the file (``0 .. num_records-1``) as an 8-byte big-endian integer.  These
  sort bytewise in numeric order, so an LMDB cursor walks records in write order,
  and writing with ``append=True`` lays them out on disk in that order.
* Each record value is a **msgpack map** ``{"image": bytes, "label": int, ...}``.
  Optional fields: ``"path"`` (the source file relative to its split folder) and
  ``"reencoded"`` (why the stored bytes are not the source file's: ``"cmyk"``,
  ``"png"``, ``"bigtiff"``, ``"tga"``..., ``"resized"``, ``"restart"`` for the
  lossless restart-marker transcode, or ``"repaired"`` for a damaged JPEG that a
  decoder reads with a warning: its header's junk dropped, losslessly, or re-encoded
  from what decodes -- NOTE [ damaged JPEGs ] in ``seqloader/format/jpeg.py``).  Readers must ignore fields they do not know.  An image with restart
  markers may carry a restart index (an APP15 segment before its SOS, NOTE [ restart
  index ] in ``seqloader/format/jpeg.py``): still a valid JPEG, which other decoders skip.
* One **metadata** value under the key :data:`META_KEY`, also a msgpack map (see
  :class:`Meta`).  It is written first with ``complete=False`` and rewritten with
  ``complete=True`` in the very last transaction, so a file whose metadata says
  ``complete`` holds every record it promises.

Nothing here (or anywhere in seqloader) uses pickle: msgpack decoding builds only
dicts, lists, strings, numbers and bytes, so opening a data file cannot run code.

Shard files of one split are named ``<stem>-SSSSS-of-NNNNN.lmdb``; see
:func:`shard_path` and :func:`find_database`.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import msgpack
import numpy as np
from ..errors import FormatError, IncompleteError

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "META_KEY", "FormatError", "IncompleteError", "EmptyDatabaseError",
    "Meta", "Record", "encode_key", "decode_key", "is_record_key", "pack_record",
    "unpack_record", "image_span", "label_at", "IMAGE_HEAD", "LABEL_TAIL",
    "pack_meta", "unpack_meta", "record_digest", "chain_checksum", "EMPTY_CHECKSUM",
    "CHECKSUM_ALGORITHM",
    "shard_path", "shard_files", "is_shard_name", "find_database", "db_name", "EXTENT_DTYPE", "meta_extents",
    "bad_files_path", "database_splits",
]

FORMAT_NAME = "seqloader"
#: Bumped whenever a reader of the previous version could misread a new file.
#: Version 2 (seqloader 0.2): the checksum is SHA-256 (``Meta.checksum_algorithm``);
#: version 1 files (BLAKE2b) are still read and verified.
FORMAT_VERSION = 2
#: The hash of new files' checksums (NOTE [ checksum ]), and those this version reads.
CHECKSUM_ALGORITHM = "sha256"
_HASHES = {"sha256": hashlib.sha256,
           "blake2b-256": lambda data=b"": hashlib.blake2b(data, digest_size=32)}
#: The metadata key.  It sorts before every record key (``b"_" < b"r"``), so the
#: writer can keep appending records (``append=True`` needs each new key to be the
#: largest) while it rewrites the metadata in the same transactions.
META_KEY = b"__seqloader_meta__"
KEY_PREFIX = b"r"
KEY_STRUCT = struct.Struct(">Q")
KEY_SIZE = len(KEY_PREFIX) + KEY_STRUCT.size
#: The checksum of a file with no records: 32 zero bytes, hex-encoded.
EMPTY_CHECKSUM = "00" * 32


class EmptyDatabaseError(FormatError):
    """A complete database with no records (older writers left one when every source
    image of a split was undecodable); nothing can be read from it."""


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
        image, label = d["image"], d["label"]
    except Exception as e:  # msgpack raises several unrelated exception types
        raise FormatError(f"{where}: not a valid seqloader record ({type(e).__name__}: {e}); "
                          "run `seqloader verify` on the file, or re-create it") from None
    if not isinstance(image, bytes) or not isinstance(label, int):
        raise FormatError(f"{where}: record has image of type {type(image).__name__} and "
                          f"label of type {type(label).__name__}; expected bytes and int")
    return Record(image=image, label=label, path=d.get("path"), reencoded=d.get("reencoded"),
                  extra={k: v for k, v in d.items() if k not in _RECORD_FIELDS})


@dataclass
class Meta:
    """The metadata record of one database file (one shard of a split).

    ``num_records`` counts the records in *this* file (a shard's global offset is the
    sum of the earlier shards' counts, so shards can be written independently).
    ``checksum`` is :func:`chain_checksum` over this file's records, in key order, with
    the hash ``checksum_algorithm`` (``"sha256"``; ``"blake2b-256"`` in version 1 files).
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
    # writer progress (meaningful while complete is False)
    next_source: int = 0
    bad_files: list[list[str]] = field(default_factory=list)
    #: ``[path, warning]`` of sources stored although a decoder warned (NOTE [ damaged
    #: JPEGs ] in ``seqloader/format/jpeg.py``); absent in files of older writers
    warned_files: list[list[str]] = field(default_factory=list)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

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
    if d.setdefault("checksum_algorithm", CHECKSUM_ALGORITHM) not in _HASHES:
        raise FormatError(f"{where}: checksum algorithm {d.get('checksum_algorithm')!r} is not "
                          f"one this seqloader knows ({', '.join(sorted(_HASHES))}); the file "
                          "is damaged or from a newer seqloader: upgrade, or re-create it")
    meta = Meta(**{k: v for k, v in d.items() if k in _META_FIELDS})
    if require_complete and not meta.complete:
        raise IncompleteError(
            f"{where}: the database is incomplete ({meta.num_records} records written, writer "
            "did not finish). Re-run the same preprocessing command to resume it")
    return meta


# NOTE [ checksum ]
# A file's checksum is a chain over its records in key order: starting from
# EMPTY_CHECKSUM, ``c = H(c || key || H(value))`` for each record, H = SHA-256 (since
# format version 2; BLAKE2b-256 in version 1).  Its whole state is the previous
# digest, so a writer stores it with each commit and resumes it after a crash, while
# the per-record digests -- the expensive part, a pass over every byte -- are
# computed in parallel by the decode workers.  SHA-256 because it runs at ~1.8 GB/s
# on x86 with the SHA extensions (OpenSSL) against BLAKE2b's ~0.74 GB/s in
# hashlib here: on a 1 GB split that is ~0.8 s of CPU less per write and per verify
# (5 % of a warm preprocessing run on 2 cores), and any sha256 tool can check a record.


def record_digest(value: bytes | memoryview, algorithm: str = CHECKSUM_ALGORITHM) -> bytes:
    """The digest of one record value with ``algorithm`` (a :attr:`Meta.checksum_algorithm`).
    Thread-safe; releases the GIL on large values."""
    return _HASHES[algorithm](value).digest()


def chain_checksum(prev_hex: str, key: bytes, digest: bytes,
                   algorithm: str = CHECKSUM_ALGORITHM) -> str:
    """One step of the content checksum: ``H(prev || key || record_digest)`` (NOTE [ checksum ]).

    The checksum of a file is this chain folded over its records in key order,
    starting from :data:`EMPTY_CHECKSUM`.
    """
    return _HASHES[algorithm](bytes.fromhex(prev_hex) + key + digest).hexdigest()


# ------------------------------------------------------------------ file naming

def db_name(split: str) -> str:
    """The file stem the original loader used: ``ILSVRC-<split>``."""
    return f"ILSVRC-{split}"


def bad_files_path(path: str | Path) -> Path:
    """The bad-files report of database file ``path``: ``<file>.bad-files.tsv`` beside it
    (one line per skipped source: path, tab, reason)."""
    path = Path(path)
    return path.with_name(path.name + ".bad-files.tsv")


def shard_path(out: str | Path, shard: int, num_shards: int) -> Path:
    """Path of shard ``shard`` of ``num_shards`` for the output ``out`` (``X.lmdb``).

    A single-shard database is just ``out``; shards are ``X-00001-of-00004.lmdb``.
    """
    out = Path(out)
    if num_shards == 1:
        return out
    return out.with_name(f"{_stem(out)}-{shard:05d}-of-{num_shards:05d}.lmdb")


def shard_files(out: str | Path) -> list[Path]:
    """The shard files of the output ``out`` (``X.lmdb``) that exist: every
    ``X-NNNNN-of-NNNNN.lmdb`` beside it (any shard count), sorted."""
    out = Path(out)
    return sorted(q for q in out.parent.glob(f"{glob.escape(_stem(out))}-?????-of-?????.lmdb")
                  if is_shard_name(q.name, out))  # (a split name may hold [, *, ?)


def _stem(out: Path) -> str:
    return out.name[:-5] if out.name.endswith(".lmdb") else out.name


_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.lmdb$")


def is_shard_name(name: str, out: str | Path) -> bool:
    """Whether the file name ``name`` is one of output ``out``'s (``X.lmdb``) shard files
    (``X-NNNNN-of-NNNNN.lmdb``, any shard count)."""
    m = _SHARD_RE.match(name)
    return m is not None and m["stem"] == _stem(Path(out))


def database_splits(folder: str | Path) -> list[str]:
    """The splits with a database in ``folder`` (``ILSVRC-<split>.lmdb`` or its shards):
    ``train`` and ``val`` first, then the others sorted; unfinished writes not counted."""
    found = set()
    prefix = db_name("")
    for q in Path(folder).glob(f"{prefix}?*.lmdb"):
        m = _SHARD_RE.match(q.name)
        stem = m["stem"] if m else q.name[:-len(".lmdb")]
        if len(stem) > len(prefix) and q.is_file():
            found.add(stem[len(prefix):])
    return ([s for s in ("train", "val") if s in found]
            + sorted(s for s in found if s not in ("train", "val")))


def _not_found(p: Path, split: str | None) -> str:
    """Why there is no database for ``split`` (None: for any split) in folder ``p``."""
    from ..write.scan import image_tree_hint  # (scan knows image files; format knows databases)

    hint = image_tree_hint(p)
    if hint is not None:
        return hint
    found = sorted(x.name for x in p.glob("*.lmdb"))
    pattern = ("ILSVRC-<split>.lmdb" if split is None
               else f"{db_name(split)}.lmdb or {db_name(split)}-NNNNN-of-NNNNN.lmdb")
    return (f"no database {'' if split is None else f'for split {split!r} '}in {p}: looked for "
            f"{pattern}; found {found or 'no .lmdb files'}. Create it from the image folder "
            f"with `seqloader preprocess <imagenet dir> {p}` (or preprocess_sequential.py)")


def find_database(path: str | Path, split: str | None = None) -> list[Path]:
    """Resolve ``path`` (and optionally a split name) to the ordered list of shard files.

    Accepts a database file (``ILSVRC-train.lmdb``), one of its shards, or a folder
    holding ``ILSVRC-<split>.lmdb`` or its shards (then ``split`` is required).  Raises
    :class:`FileNotFoundError` listing what was looked for (or saying that the folder is
    an image tree to preprocess), or :class:`FormatError` if shards are missing.
    """
    p = Path(path)
    if p.is_dir() and split is not None:
        stem = db_name(split)
        single = p / f"{stem}.lmdb"
        shards = shard_files(single)
        if single.is_file():
            return [single]
        if not shards:
            unfinished = sorted(x.name for x in p.glob(f"{glob.escape(stem)}*.lmdb.partial"))
            if unfinished:
                raise FileNotFoundError(
                    f"split {split!r} in {p} is still being written or was interrupted: "
                    f"{unfinished[0]}{' ...' if len(unfinished) > 1 else ''}; re-run the same "
                    "preprocess_sequential.py command to finish it")
            raise FileNotFoundError(_not_found(p, split))
        return _check_shard_set(shards)
    if p.is_dir():
        splits = database_splits(p)
        unfinished = sorted(x.name for x in p.glob(f"{db_name('')}?*.lmdb.partial"))
        if not splits and unfinished:
            raise FileNotFoundError(
                f"{p} holds no complete database, only unfinished writes: {unfinished[0]}"
                f"{' ...' if len(unfinished) > 1 else ''}; re-run the same "
                "preprocess_sequential.py command to finish them")
        if not splits:
            raise FileNotFoundError(_not_found(p, None))
        raise FileNotFoundError(f"{p} is a folder holding the split(s) {', '.join(splits)}; "
                                "name the split too (e.g. 'train'), or pass the .lmdb file itself")
    if not p.exists():
        raise FileNotFoundError(f"database {p} does not exist. Create it with "
                                "`python preprocess_sequential.py <imagenet dir> <lmdb dir>`")
    m = _SHARD_RE.match(p.name)
    if m:
        return _check_shard_set(sorted(p.parent.glob(f"{glob.escape(m['stem'])}-?????-of-{m['n']}.lmdb")))
    return [p]


def _check_shard_set(shards: Sequence[Path]) -> list[Path]:
    ns = {int(_SHARD_RE.match(s.name)["n"]) for s in shards}
    if len(ns) != 1:
        raise FormatError(f"shard files from different shard counts side by side: "
                          f"{[s.name for s in shards]}; remove the stale ones")
    n = ns.pop()
    have = {int(_SHARD_RE.match(s.name)["i"]) for s in shards}
    missing = sorted(set(range(n)) - have)
    if missing:
        raise FormatError(f"{shards[0].parent}: shard(s) {missing} of {n} are missing "
                          f"(found {sorted(have)}); copy or (re)write them before reading")
    return list(shards)
