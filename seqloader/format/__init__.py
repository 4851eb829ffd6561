"""The on-disk contract of a seqloader database.

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
  from what decodes -- NOTE [ damaged JPEGs ] in ``seqloader/write/prepare.py``).
  Readers must ignore fields they do not know.  An image with restart markers may
  carry a restart index (an APP15 segment before its SOS, NOTE [ restart index ] in
  ``seqloader/format/jpeg.py``): still a valid JPEG, which other decoders skip.
* One **metadata** value under the key :data:`META_KEY`, also a msgpack map (see
  :class:`Meta`).  It is written first with ``complete=False`` and rewritten with
  ``complete=True`` in the very last transaction, so a file whose metadata says
  ``complete`` holds every record it promises.

Nothing here (or anywhere in seqloader) uses pickle: msgpack decoding builds only
dicts, lists, strings, numbers and bytes, so opening a data file cannot run code.

Shard files of one split are named ``<stem>-SSSSS-of-NNNNN.lmdb``; see
:func:`shard_path` and :func:`find_database`.

The modules, by job: :mod:`.keys` (record and metadata keys), :mod:`.records` (record
values), :mod:`.meta` (the metadata record and its checks), :mod:`.checksum` (the
content checksum), :mod:`.files` (file and shard names, finding a database),
:mod:`.jpeg` (the JPEG structure the reader relies on: frame, scan, restart markers
and the restart index) and :mod:`.decoders` (decoding untrusted bytes quietly).  The
names below are the contract; import them from here or from their module.
"""
from __future__ import annotations

from ..errors import FormatError, IncompleteError
from .checksum import CHECKSUM_ALGORITHM, EMPTY_CHECKSUM, chain_checksum, record_digest
from .files import (bad_files_path, database_splits, db_name, find_database, is_shard_name,
                    shard_files, shard_path)
from .keys import META_KEY, decode_key, encode_key, is_record_key
from .meta import (DIGEST_BYTES, EXTENT_DTYPE, FORMAT_NAME, FORMAT_VERSION, IMAGE_FORMATS,
                   PLAIN_VERSION, EmptyDatabaseError, Meta, digest_entry, file_version,
                   meta_digests, meta_extents, pack_meta, unpack_meta)
from .records import Record, pack_record, unpack_record

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "META_KEY", "FormatError", "IncompleteError",
    "EmptyDatabaseError", "Meta", "Record", "encode_key", "decode_key", "is_record_key",
    "pack_record", "unpack_record", "pack_meta", "unpack_meta", "record_digest",
    "chain_checksum", "EMPTY_CHECKSUM", "CHECKSUM_ALGORITHM", "shard_path", "shard_files",
    "is_shard_name", "find_database", "db_name", "EXTENT_DTYPE", "meta_extents",
    "bad_files_path", "database_splits", "PLAIN_VERSION", "IMAGE_FORMATS", "file_version",
    "DIGEST_BYTES", "digest_entry", "meta_digests",
]
