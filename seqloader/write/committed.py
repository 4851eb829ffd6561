"""What an interrupted run of a shard's writer already committed to its ``.partial``
file: those records' extents and digest-table entries, recovered when a re-run resumes
the shard (NOTE [ resumed digests ]).

NOTE [ resumed digests ]
The digest table (NOTE [ record digests ] in ``seqloader/format/meta.py``) is written on
completion, from the digest of each record that the checksum chain computes anyway.  A
run that resumes a shard did not compute those of the records an earlier run committed,
so it reads them back once, in key order, and hashes them again -- and chains them, which
must give the committed checksum: a partial file damaged by the crash is refused, not
completed.  The alternative, the table so far in every commit's metadata, would rewrite
it at each commit (quadratic: a one-shard ImageNet, 1.28 M records, has a 10 MB table
and a commit per 64 MB, ~11 GB more written), paid by every run, crash or not; the
read-back costs nothing without a crash, and after one a sequential read of what was
committed (hashed at ~1.8 GB/s), far less than preparing those records cost.  The
result is byte-identical to an uninterrupted run's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..format.checksum import EMPTY_CHECKSUM, chain_checksum, record_digest
from ..format.keys import encode_key
from ..format.meta import digest_entry
from ..read.database import Database, close_env, open_env, read_meta
from ..read.reader import RangeReader

__all__ = ["Committed", "committed_records"]


class Committed:
    """The records already in a partial file: ``extents`` (a list of one
    :data:`~seqloader.format.meta.EXTENT_DTYPE` array, or empty) and ``digests`` (their
    :attr:`~seqloader.format.meta.Meta.digests` entries, in record order)."""

    def __init__(self, extents: list[np.ndarray] | None = None, digests: bytes = b""):
        self.extents = extents if extents is not None else []
        self.digests = bytearray(digests)


def committed_records(partial: Path, fingerprint: str, *, progress: bool) -> Committed:
    """The :class:`Committed` records of ``partial`` if an interrupted run of the command
    whose plan has ``fingerprint`` wrote them (else none: the writer starts the file, or
    refuses another command's).  One sequential pass over them.  Raises
    :class:`~seqloader.errors.FormatError` if they do not match the committed checksum."""
    if not partial.exists() or partial.stat().st_size == 0:  # (just created)
        return Committed()
    env = open_env(partial, readahead=False)
    try:
        meta = read_meta(env, partial, require_complete=False)
    except FormatError:
        return Committed()
    finally:
        close_env(env)
    if meta.fingerprint != fingerprint or not meta.num_records:
        return Committed()
    if progress:  # (before the progress bar)
        print(f"{partial.name}: resuming after {meta.num_records:,} records "
              f"({meta.image_bytes / 2**30:.2f} GiB); reading them back",
              file=sys.stderr, flush=True)
    reader = RangeReader(Database((partial,), (meta,)))
    try:
        extents = reader.extents([(0, meta.num_records)])
        digests, checksum = bytearray(), EMPTY_CHECKSUM
        for i, value in reader.read([(0, meta.num_records)]):
            digest = record_digest(value, meta.checksum_algorithm)
            checksum = chain_checksum(checksum, encode_key(i), digest, meta.checksum_algorithm)
            digests += digest_entry(digest)
    finally:
        reader.close()
    if checksum != meta.checksum:
        raise FormatError(f"{partial}: the records an interrupted run committed do not match "
                          "its checksum (the file was damaged); pass --overwrite to discard it "
                          "and write the shard again")
    return Committed([extents], digests)
