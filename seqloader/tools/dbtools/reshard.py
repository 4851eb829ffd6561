"""``reshard`` and ``merge``: copy databases, as stored, into another shard layout or
into one split (NOTE [ copies ] in :mod:`.copier`); optionally reshuffled (:mod:`.reshuffle`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ...errors import OutputExistsError
from ...format.files import db_name
from ...read.database import Database, open_database, path_splits
from ...write.overlap import refuse_overlap
from .copier import CopyPlan, write_copy
from .reshuffle import ShuffledValues
from .stream import RecordStream, Selection, plan_fingerprint

__all__ = ["CopyReport", "copy_parts", "reshard", "merge", "DEFAULT_MEMORY_BUDGET"]

DEFAULT_MEMORY_BUDGET = 4 << 30


@dataclass
class CopyReport:
    """What a tool wrote for one split: its shard files (this call's), the split's
    records (``num_records``) and those in this call's files (``written``)."""

    split: str
    paths: list[Path] = field(default_factory=list)
    num_records: int = 0
    classes: list[str] = field(default_factory=list)
    written: int = 0
    target_kind: str = "class"


def _check_kinds(parts: Sequence[Selection]) -> None:
    first = parts[0].db
    for p in parts[1:]:
        a, b = first.metas[0], p.db.metas[0]
        if (a.target_kind, a.image_format) != (b.target_kind, b.image_format):
            raise ValueError(f"{p.db.paths[0]} holds {b.image_format} images with {b.target_kind} "
                             f"targets, {first.paths[0]} {a.image_format} images with "
                             f"{a.target_kind} targets: only databases of one kind merge")


def copy_parts(parts: Sequence[Selection], out: str | Path, split: str, classes: list[str], *,
               op: str, shards: int = 1, shard_ids: Sequence[int] | None = None,
               shuffle: bool = False, seed: int = 0,
               memory_budget: int = DEFAULT_MEMORY_BUDGET, scratch: str | Path | None = None,
               overwrite: bool = False, progress: bool = True, provenance: dict | None = None,
               keeps_order: bool = False) -> CopyReport:
    """Copy ``parts`` (in order, or reshuffled with ``seed``) to split ``split`` of folder
    ``out`` in ``shards`` files (only ``shard_ids`` of them, if given).  ``keeps_order``:
    the records keep one source's order, so the output keeps its shuffled flag and seed."""
    _check_kinds(parts)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output {out} is a file; name a folder (it is created if missing)")
    refuse_overlap([q for p in parts for q in p.db.paths], out)
    if shards < 1:
        raise ValueError(f"--shards {shards}: give a number of files >= 1")
    bad_ids = [k for k in shard_ids or () if not 0 <= k < shards]
    if bad_ids:
        raise ValueError(f"--shard-ids {bad_ids} are not in 0..{shards - 1} (--shards {shards})")
    stream = RecordStream(parts)
    n = len(stream)
    if n == 0:
        raise ValueError(f"split {split!r}: no records chosen; nothing to write")
    first = parts[0].db.metas[0]
    template = dataclasses.replace(first, classes=list(classes))
    dbs = list({id(p.db): p.db for p in parts}.values())
    template.bad_files = _once(b for db in dbs for m in db.metas for b in m.bad_files)
    template.warned_files = _once(b for db in dbs for m in db.metas for b in m.warned_files)
    labels = stream.labels()
    fp = plan_fingerprint(op, parts, split, classes, shards, shuffle, seed if shuffle else None)
    orders = [db.metas[0].shuffled for db in dbs]
    plan = CopyPlan(split, n, labels, template, fp, shards, shard_ids,
                    # NOTE [ order of a copy ]
                    shuffled=shuffle or all(orders),
                    seed=seed if shuffle else (first.seed if keeps_order else None),
                    provenance={"command": op, **(provenance or {}),
                                **({} if shuffle or keeps_order else {"source_orders": [
                                    ("shuffled" if o else "sorted") for o in orders]})})
    values = stream
    shuffler = None
    try:
        if shuffle:
            nbytes = sum(int(p.db.image_bytes * len(p.indices) / max(1, p.db.num_records))
                         for p in parts)
            tag = "" if shard_ids is None else "-" + "-".join(map(str, shard_ids))
            shuffler = ShuffledValues(stream, n, nbytes, seed=seed, identity=fp,
                                      memory_budget=memory_budget,
                                      scratch=Path(scratch or out) / f".{db_name(split)}{tag}.shuffle",
                                      progress=progress)
            if labels is not None:
                plan.labels = labels[shuffler.order]
            values = shuffler
        paths = write_copy(plan, values, out, overwrite=overwrite, progress=progress)
    finally:
        if shuffler is not None:
            shuffler.close()
        stream.close()
    ids = range(shards) if shard_ids is None else shard_ids
    written = sum(round((k + 1) * n / shards) - round(k * n / shards) for k in set(ids))
    return CopyReport(split, paths, n, list(classes), written, first.target_kind)


# NOTE [ order of a copy ]
# The metadata's ``shuffled`` and ``seed`` say how a copy's records are ordered: a
# reshuffle (merge --shuffle): shuffled, its seed; one source's records in its order
# (reshard, subset, a merge of one database): the source's flag and seed (a selection
# of a shuffled order is in random order too); several sources in turn: shuffled when
# every source is (the order is random, but no one seed makes it: seed None), else not,
# with each source's order in ``writer["tool"]["source_orders"]`` for ``info``.


def _once(entries) -> list:
    """The sources' bad (or warned) file entries, each once: copies of one database
    (a subset and its complement, merged) carry the same entries, which are one file."""
    seen, out = set(), []
    for e in entries:
        key = tuple(e)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def reshard(path: str | Path, out: str | Path, *, split: str | None = None, shards: int = 1,
            shard_ids: Sequence[int] | None = None, overwrite: bool = False,
            progress: bool = True) -> list[CopyReport]:
    """Copy the database at ``path`` (every split of a folder, or ``split``) to ``out``
    in ``shards`` files each, records in their order (``shard_ids``: write only these
    shards, e.g. one process per range)."""
    reports = []
    for s in path_splits(path, split):
        db = open_database(path, s)
        part = Selection(db, np.arange(db.num_records))
        reports.append(copy_parts([part], out, db.split, db.classes, op="reshard", shards=shards,
                                  shard_ids=shard_ids, overwrite=overwrite, progress=progress,
                                  provenance={"from": [str(p) for p in db.paths]},
                                  keeps_order=True))
    return reports


def _merged_classes(dbs: Sequence[Database]) -> tuple[list[str], list[np.ndarray | None]]:
    """The union of the databases' class lists (the first's order, then new names in the
    order met) and each database's label map into it (None where it is the identity)."""
    classes: list[str] = []
    index: dict[str, int] = {}
    maps = []
    for db in dbs:
        for c in db.classes:
            if c not in index:
                index[c] = len(classes)
                classes.append(c)
        m = np.array([index[c] for c in db.classes], np.int64)
        maps.append(None if np.array_equal(m, np.arange(len(m))) else m)
    return classes, maps


def merge(sources: Sequence[str | Path], out: str | Path, *, into: str | None = None,
          shards: int = 1, shuffle: bool = False, seed: int = 0,
          memory_budget: int = DEFAULT_MEMORY_BUDGET, scratch: str | Path | None = None,
          overwrite: bool = False, progress: bool = True) -> list[CopyReport]:
    """Merge databases (files, or folders: every split in them) into ``out``: all into
    the split ``into``, or -- without it -- by split name (the train databases into
    train, the val ones into val, ...).  Class lists are united by name (labels
    renumbered where a source's differ); records keep their order (sources in the order
    given) unless ``shuffle``, a seeded reshuffle with sequential I/O (:mod:`.reshuffle`)."""
    if not sources:
        raise ValueError("merge needs at least one source database")
    groups: dict[str, list[Database]] = {}
    for src in sources:
        for s in path_splits(src, None):
            db = open_database(src, s)
            groups.setdefault(into or db.split, []).append(db)
    reports = []
    for split, dbs in groups.items():
        seen = [p.resolve() for db in dbs for p in db.paths]
        if len(set(seen)) != len(seen):
            raise ValueError(f"split {split!r}: a database is given twice ({dbs[0].paths[0]}...); "
                             "give each once")
        if any(db.metas[0].target_kind != "class" for db in dbs):
            classes, maps = list(dbs[0].classes), [None] * len(dbs)
        else:
            classes, maps = _merged_classes(dbs)
        parts = [Selection(db, np.arange(db.num_records), m) for db, m in zip(dbs, maps)]
        reports.append(copy_parts(parts, out, split, classes, op="merge", shards=shards,
                                  shuffle=shuffle, seed=seed, memory_budget=memory_budget,
                                  scratch=scratch, overwrite=overwrite, progress=progress,
                                  provenance={"from": [str(p) for db in dbs for p in db.paths]},
                                  keeps_order=len(dbs) == 1))
    return reports
