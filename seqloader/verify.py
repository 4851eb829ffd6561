"""Check a database end to end: every record parses and decodes, checksums match."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .database import close_env, open_database, open_env
from .format import (EMPTY_CHECKSUM, FormatError, chain_checksum, decode_key, encode_key,
                     is_record_key, meta_extents, record_digest, unpack_record)
from .pages import address, map_base
from .images import decode_bgr
from .pool import ordered_map

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


def _check(item: tuple[int, bytes, bytes, int, str]) -> tuple[bytes, bytes, str | None]:
    """(key, record digest, error or None) for one (index, key, value, num_classes,
    checksum algorithm)."""
    index, key, value, num_classes, algorithm = item
    digest = record_digest(value, algorithm)
    try:
        rec = unpack_record(value, where=f"record {index}")
    except FormatError as e:
        return key, digest, str(e)
    if not 0 <= rec.label < num_classes:
        return key, digest, f"label {rec.label} outside [0, {num_classes})"
    img = decode_bgr(rec.image)
    if img is None or img.ndim != 3 or img.shape[2] != 3:
        return key, digest, f"image ({rec.path or 'no path'}) does not decode to 3 channels"
    return key, digest, None


def verify_database(path: str | Path, split: str | None = None, *, workers: int | None = None,
                    progress: bool = True) -> VerifyResult:
    """Decode every record (in ``workers`` threads) and recompute each shard's checksum."""
    db = open_database(path, split)
    workers = workers or os.cpu_count() or 1
    res = VerifyResult(db.num_records)
    bar = tqdm(total=db.num_records, unit="img", desc="verify", disable=not progress)
    for p, meta, offset in zip(db.paths, db.metas, db.offsets):
        env = open_env(p)
        try:
            ext = meta_extents(meta, p.stat().st_size, where=str(p))
        except FormatError as e:
            res.problems.append(str(e))
            ext = None
        misplaced: list[int] = []
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
                                and ext[local]["offset"] == address(v) - base):
                            misplaced.append(local)
                        yield offset + local, k, v, len(meta.classes), meta.checksum_algorithm

                checksum, expect = EMPTY_CHECKSUM, 0
                for key, digest, err in ordered_map(_check, items(), workers=workers):
                    local = decode_key(key)
                    if local != expect:
                        res.problems.append(f"{p}: record key {local} where {expect} was expected")
                        expect = local
                    if err:
                        res.bad.append((offset + local, err))
                    checksum = chain_checksum(checksum, key, digest, meta.checksum_algorithm)
                    expect += 1
                    bar.update(1)
        finally:
            close_env(env)
        if misplaced:
            res.problems.append(
                f"{p}: the metadata's extents of {len(misplaced)} records (first: record "
                f"{misplaced[0]}) do not match where the records are; the file was modified "
                "after it was written: re-create it with `seqloader preprocess`")
        if expect != meta.num_records:
            res.problems.append(f"{p}: {expect} records found, metadata says {meta.num_records}")
        if checksum != meta.checksum:
            res.problems.append(f"{p}: checksum {checksum[:16]}… does not match the metadata's "
                                f"{meta.checksum[:16]}…; the file is damaged: re-copy or re-create it")
    bar.close()
    return res
