"""Check a database end to end: every record parses and decodes, checksums match."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import lmdb
import numpy as np

from ...progress import progress_bar
from ...read.database import close_env, open_database, open_env
from ...format.checksum import EMPTY_CHECKSUM, chain_checksum, record_digest
from ...format.meta import DIGEST_BYTES, EmptyDatabaseError, meta_digests, meta_extents
from ...format.keys import decode_key, encode_key, is_record_key
from ...format.records import unpack_record
from ...read.pages import address, map_base
from ...format.imagecheck import check_stored
from ...workers.processmap import named_errors, process_map
from ...workers.threadmap import thread_map
from ...errors import FormatError, WorkerDiedError

__all__ = ["VerifyResult", "verify_database"]


@dataclass
class VerifyResult:
    """``bad`` lists ``(global record index, reason)``; ``problems`` file-level faults."""

    num_records: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad and not self.problems


#: In a verify worker: this process's own environment per file (an environment must
#: not cross a fork, and :func:`~seqloader.read.database.open_env`'s registry would hand the
#: parent's one to a forked child).
_WORKER_ENVS: dict[str, tuple[int, lmdb.Environment]] = {}


def _record(path: str, key: bytes) -> bytes | None:
    pid = os.getpid()
    entry = _WORKER_ENVS.get(path)
    if entry is None or entry[0] != pid:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, max_dbs=0)
        entry = _WORKER_ENVS[path] = (pid, env)
    with entry[1].begin() as txn:
        return txn.get(key)


def _check(item: tuple[int, str, bytes, Any, int, str]) -> tuple[bytes, bytes, str | None, int]:
    """(key, record digest, error or None, label or -1) for one (global index, file, key,
    value or None, number of classes, checksum algorithm).  Without the value (in a
    worker process) it reads the record itself, so only keys and digests cross processes."""
    index, path, key, value, num_classes, algorithm = item
    if value is None:
        value = _record(path, key)
    if value is None:  # pragma: no cover - the parent just saw the key
        return key, b"", f"record {index} vanished while being verified", -1
    digest = record_digest(value, algorithm)
    try:
        rec = unpack_record(value, where=f"record {index}")
    except FormatError as e:
        return key, digest, str(e), -1
    if rec.target is None and not 0 <= rec.label < num_classes:  # (targets: label -1)
        return key, digest, f"label {rec.label} outside [0, {num_classes})", rec.label
    # stored pixels: their size was checked by unpack_record (NOTE [ stored pixels ])
    why = check_stored(rec.image) if rec.shape is None else None
    if why is not None:
        return key, digest, f"image ({rec.path or 'no path'}): {why}", rec.label
    return key, digest, None, rec.label


def _digest_table(meta: Any, where: str, res: VerifyResult) -> bytes | None:
    """The metadata's digest table (NOTE [ record digests ]), or None when it has none or
    it cannot be this file's (then a problem in ``res``)."""
    try:
        return meta_digests(meta, where=where)
    except FormatError as e:
        res.problems.append(str(e))
        return None


def _digest_agrees(table: bytes | None, local: int, digest: bytes) -> bool:
    """Whether record ``local``'s entry in ``table`` (None: no table) is ``digest``'s."""
    return table is None or (table[local * DIGEST_BYTES:(local + 1) * DIGEST_BYTES]
                             == digest[:DIGEST_BYTES])


def _redigested(where: str, records: list[int]) -> str:
    return (f"{where}: the metadata's digests of {len(records)} records (first: record "
            f"{records[0]}) differ from the records' own; the records (then the checksum "
            "differs too) or the metadata were damaged or modified after they were written: "
            "re-copy the file, or re-create it with `seqloader preprocess`")


def _holds(path: Path, offset: int, value: Any) -> bool:
    """Whether ``path`` holds ``value``'s bytes at ``offset``.  A record's extent may point
    at an identical older copy: records of ~2 KB or less share the first leaf page with
    the metadata, whose last commit copies that page after the extents were taken (the
    old page is never written again in a complete file, so the copy stays valid)."""
    with open(path, "rb") as f:
        return os.pread(f.fileno(), len(value), offset) == bytes(value)


def _forked(workers: int) -> bool:
    """Check in forked processes (decoding does not scale in threads: ~1.3x for two)?
    Threads where there is no fork or only one worker."""
    return workers > 1 and hasattr(os, "fork")


def _where(item: tuple) -> tuple[int, str]:
    return item[0], item[1]


def _map(items: Iterator[tuple], workers: int) -> Iterator[tuple[bytes, bytes, str | None, int]]:
    """:func:`_check` over ``items`` in order (see :func:`_forked`); an exception in a
    check raises :class:`~seqloader.errors.RecordError` naming the record and its file
    (a damaged record is a result, not an exception)."""
    if _forked(workers):
        return process_map(_check, items, workers=workers, slot_bytes=0, where=_where)
    return thread_map(named_errors(_check, _where), items, workers=workers)


def verify_database(path: str | Path, split: str | None = None, *, workers: int | None = None,
                    progress: bool = True) -> VerifyResult:
    """Check every record of a database and recompute each shard's checksum.

    Each record must parse, have a label in range and hold an image that passes the
    writer's decode check (:func:`~seqloader.format.imagecheck.check_stored`); ``workers``
    processes (default: one per core plus one) read and check records while this one
    walks the keys in order, chains the digests and compares the record extents.
    Finite; a file that kills a worker, or a database of 0 records, is reported as a
    problem, not raised."""
    try:
        db = open_database(path, split)
    except EmptyDatabaseError as e:
        return VerifyResult(0, problems=[str(e)])
    workers = workers or (os.cpu_count() or 1) + 1
    if db.remote is not None:
        return _verify_remote(db, workers, progress)
    forked = _forked(workers)
    res = VerifyResult(db.num_records)
    bar = progress_bar(total=db.num_records, unit="img", desc="verify", progress=progress)
    for p, meta, offset in zip(db.paths, db.metas, db.offsets):
        env = open_env(p)
        try:
            ext = meta_extents(meta, p.stat().st_size, where=str(p))
        except FormatError as e:
            res.problems.append(str(e))
            ext = None
        misplaced: list[int] = []
        table, redigested = _digest_table(meta, str(p), res), []
        # the metadata's copy of the labels (quality metrics and `info` read it, not the
        # records): it must agree with the records; the checksum covers only records
        meta_labels = np.frombuffer(meta.labels, "<i4") if meta.labels else None
        relabelled: list[int] = []
        try:
            with env.begin(buffers=True) as txn:
                cur = txn.cursor()
                cur.set_range(encode_key(0))
                base = map_base(str(p)) if ext is not None else None

                def items():
                    for k, v in cur:
                        k = bytes(k)
                        if not is_record_key(k):
                            continue
                        local = decode_key(k)
                        if base is not None and not (
                                local < len(ext) and ext[local]["length"] == len(v)
                                and (ext[local]["offset"] == address(v) - base
                                     or _holds(p, int(ext[local]["offset"]), v))):
                            misplaced.append(local)
                        yield (offset + local, str(p), k, None if forked else v,
                               len(meta.classes), meta.checksum_algorithm)

                checksum, expect = EMPTY_CHECKSUM, 0
                try:
                    for key, digest, err, label in _map(items(), workers):
                        local = decode_key(key)
                        if (meta_labels is not None and label >= 0
                                and (local >= len(meta_labels) or meta_labels[local] != label)):
                            relabelled.append(local)
                        if not _digest_agrees(table, local, digest):
                            redigested.append(local)
                        if local != expect:
                            res.problems.append(f"{p}: record key {local} where {expect} was expected")
                            expect = local
                        if err:
                            res.bad.append((offset + local, err))
                        checksum = chain_checksum(checksum, key, digest, meta.checksum_algorithm)
                        expect += 1
                        bar.update(1)
                except WorkerDiedError as e:
                    res.problems.append(f"{p}: a verify worker died reading record {offset + expect} "
                                        "or the next few (the file is damaged: re-copy or "
                                        f"re-create it) [{e}]")
        finally:
            close_env(env)
        if misplaced:
            res.problems.append(
                f"{p}: the metadata's extents of {len(misplaced)} records (first: record "
                f"{misplaced[0]}) do not match where the records are; the file was modified "
                "after it was written: re-create it with `seqloader preprocess`")
        if relabelled:
            res.problems.append(
                f"{p}: the metadata's labels of {len(relabelled)} records (first: record "
                f"{relabelled[0]}) differ from the records' own; the metadata was damaged or "
                "modified after it was written: re-create the file with `seqloader preprocess`")
        if redigested:
            res.problems.append(_redigested(str(p), redigested))
        if expect != meta.num_records:
            res.problems.append(f"{p}: {expect} records found, metadata says {meta.num_records}")
        if checksum != meta.checksum:
            res.problems.append(f"{p}: checksum {checksum[:16]}… does not match the metadata's "
                                f"{meta.checksum[:16]}…; the file is damaged: re-copy or re-create it")
    bar.close()
    return res


# (bytes read over a network may have been damaged on the way, not at the server)
_IN_TRANSIT = ("; over a network the bytes may also have been damaged in transit or by a "
               "proxy: run `seqloader verify` on the URL again, and only if the same records "
               "fail again, re-upload the file")


def _verify_remote(db: Any, workers: int, progress: bool) -> VerifyResult:
    """:func:`verify_database` of a database at URLs: every record the metadata's extents
    point at (what readers read) is fetched with ranged GETs, checked, and chained into
    the checksum in key order; the LMDB B-tree itself is not walked."""
    from ...read.reader import RangeReader
    from ...read.remote import safe_url

    res = VerifyResult(db.num_records)
    bar = progress_bar(total=db.num_records, unit="img", desc="verify", progress=progress)
    # every record is checked below and reported, not raised at the first one that
    # fails the check on arrival (NOTE [ records checked on arrival ])
    remote = dataclasses.replace(db.remote, options=dataclasses.replace(db.remote.options,
                                                                        verify=False))
    reader = RangeReader(dataclasses.replace(db, remote=remote))
    try:
        for url, meta, offset in zip(db.paths, db.metas, db.offsets):
            meta_labels = np.frombuffer(meta.labels, "<i4") if meta.labels else None
            items = ((index, url, encode_key(index - offset), bytes(v), len(meta.classes),
                      meta.checksum_algorithm)
                     for index, v in reader.read([(offset, offset + meta.num_records)]))
            checksum, relabelled = EMPTY_CHECKSUM, 0
            table, redigested = _digest_table(meta, safe_url(url), res), []
            for key, digest, err, label in _map(items, workers):
                local = decode_key(key)
                if not _digest_agrees(table, local, digest):
                    redigested.append(local)
                if err:
                    res.bad.append((offset + local, err))
                if meta_labels is not None and label >= 0 and meta_labels[local] != label:
                    relabelled += 1
                checksum = chain_checksum(checksum, key, digest, meta.checksum_algorithm)
                bar.update(1)
            if redigested:
                res.problems.append(_redigested(safe_url(url), redigested) + _IN_TRANSIT)
            if relabelled:
                res.problems.append(f"{safe_url(url)}: the metadata's labels of {relabelled} "
                                    "records differ from the records' own; re-create the file")
            if checksum != meta.checksum:
                res.problems.append(f"{safe_url(url)}: checksum {checksum[:16]}… does not match "
                                    f"the metadata's {meta.checksum[:16]}… over the bytes read"
                                    + _IN_TRANSIT)
    finally:
        reader.close()
        bar.close()
    return res
