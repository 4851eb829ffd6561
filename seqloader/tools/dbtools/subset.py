"""``subset``: a smaller database made of chosen records, copied as stored -- by classes
(a list, the first N, N at random), images per class, or a fraction, with a seed.

Which records is a pure function of the labels (read from the metadata: no data pass)
and the options (:func:`select`); the records are then copied in the database's order
(:func:`~.reshard.copy_parts`).  Labels are kept, or renumbered 0..K-1 over the kept
classes (``renumber``); either way ``ILSVRC-<split>.classes.tsv`` beside the output
maps each label to the source's label and the class name.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ...read.database import open_database
from ...read.database import path_splits
from .reshard import CopyReport, copy_parts
from .stream import Selection

__all__ = ["select", "subset", "class_ids", "write_class_map"]


def class_ids(wanted: Sequence[str | int], classes: Sequence[str]) -> list[int]:
    """The labels of ``wanted`` class names (or label numbers) in ``classes``; ValueError
    naming one that is neither."""
    index = {c: i for i, c in enumerate(classes)}
    out = []
    for w in wanted:
        w = str(w)
        if w in index:
            out.append(index[w])
        elif w.isdigit() and int(w) < len(classes):
            out.append(int(w))
        else:
            raise ValueError(f"class {w!r} is neither a class name nor a label below "
                             f"{len(classes)} (classes: {', '.join(classes[:5])}"
                             f"{', ...' if len(classes) > 5 else ''}); see `seqloader info`")
    return sorted(set(out))


def select(labels: np.ndarray | None, classes: Sequence[str], *,
           class_list: Sequence[str | int] | None = None, first_classes: int | None = None,
           random_classes: int | None = None, per_class: int | None = None,
           fraction: float | None = None, complement: bool = False, seed: int = 0,
           n: int | None = None) -> tuple[np.ndarray, list[int]]:
    """The chosen records (ascending global indices) and the kept classes (their source
    labels, ascending).  ``labels`` None: a database of other targets than classes
    (only ``fraction`` applies).  Per-class picks and fractions are drawn per class,
    from ``seed``; ``complement``: every record *not* chosen."""
    by_class = [x is not None for x in (class_list, first_classes, random_classes)]
    if sum(by_class) > 1:
        raise ValueError("choose classes one way: --classes, --first-classes or --random-classes")
    if per_class is not None and fraction is not None:
        raise ValueError("choose --per-class or --fraction, not both")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"--fraction {fraction}: give a number in (0, 1]")
    if per_class is not None and per_class < 1:
        raise ValueError(f"--per-class {per_class}: give a number of images >= 1")
    k = len(classes)
    rng_classes = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    rng_records = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    if labels is None:
        if any(by_class) or per_class is not None:
            raise ValueError("this database's targets are not classes: only --fraction applies")
        if n is None:
            raise ValueError("select: give n, the record count, for a database without labels")
        chosen = (np.arange(n) if fraction is None
                  else np.sort(rng_records.choice(n, round(fraction * n), replace=False)))
        return (_complement(chosen, n) if complement else chosen).astype(np.int64), []
    for n, flag in ((first_classes, "--first-classes"), (random_classes, "--random-classes")):
        if n is not None and not 1 <= n <= k:
            raise ValueError(f"{flag} {n}: the database has {k} classes; give 1 to {k}")
    if class_list is not None:
        wanted = class_ids(class_list, classes)
    elif first_classes is not None:
        wanted = list(range(first_classes))
    elif random_classes is not None:
        wanted = sorted(rng_classes.choice(k, random_classes, replace=False).tolist())
    else:
        wanted = list(range(k))
    picked = []
    for c in wanted:
        idx = np.flatnonzero(labels == c)
        m = per_class if per_class is not None else (
            round(fraction * len(idx)) if fraction is not None else len(idx))
        picked.append(idx if m >= len(idx) else rng_records.choice(idx, m, replace=False))
    chosen = np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)
    if complement:
        chosen = _complement(chosen, len(labels))
        wanted = sorted(set(np.unique(labels[chosen]).tolist()))
    return chosen.astype(np.int64), wanted


def _complement(chosen: np.ndarray, n: int) -> np.ndarray:
    return np.setdiff1d(np.arange(n, dtype=np.int64), chosen, assume_unique=True)


def write_class_map(path: Path, kept: Sequence[int], classes: Sequence[str], renumber: bool) -> None:
    """``label<TAB>source label<TAB>class name`` per kept class, replaced atomically."""
    rows = ["label\tsource_label\tclass\n"] + [
        f"{j if renumber else c}\t{c}\t{classes[c]}\n" for j, c in enumerate(kept)]
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w") as f:
        f.write("".join(rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def subset(path: str | Path, out: str | Path, *, split: str | None = None,
           classes: Sequence[str | int] | None = None, first_classes: int | None = None,
           random_classes: int | None = None, per_class: int | None = None,
           fraction: float | None = None, complement: bool = False, renumber: bool = False,
           seed: int = 0, shards: int = 1, overwrite: bool = False,
           progress: bool = True) -> list[CopyReport]:
    """Write the records :func:`select` chooses of each split at ``path`` (a folder: every
    split; or ``split``) to ``out``, in ``shards`` files per split (module docstring)."""
    plans = []  # every split's selection first: a mistake is refused before any writing
    for s in path_splits(path, split):
        db = open_database(path, s)
        kind = db.metas[0].target_kind
        labels = db.labels() if kind == "class" else None
        chosen, kept = select(labels, db.classes, class_list=classes,
                              first_classes=first_classes, random_classes=random_classes,
                              per_class=per_class, fraction=fraction, complement=complement,
                              seed=seed, n=db.num_records)
        if renumber and labels is None:
            raise ValueError("--renumber: this database's targets are not classes")
        if len(chosen) == 0:
            raise ValueError(f"split {db.split!r}: no records chosen ({db.num_records} records); "
                             "choose more (a larger --fraction or --per-class), or name the "
                             "other split with --split")
        if shards > len(chosen):
            raise ValueError(f"--shards {shards}: split {db.split!r} gets {len(chosen)} "
                             f"records; give 1 to {len(chosen)}")
        plans.append((db, labels, chosen, kept))
    reports = []
    for db, labels, chosen, kept in plans:
        label_map, names = None, list(db.classes)
        if renumber:
            label_map = np.full(len(db.classes), -1, np.int64)
            label_map[kept] = np.arange(len(kept))
            names = [db.classes[c] for c in kept]
        opts = {"classes": None if classes is None else [str(c) for c in classes],
                "first_classes": first_classes, "random_classes": random_classes,
                "per_class": per_class, "fraction": fraction, "complement": complement,
                "renumber": renumber, "seed": seed}
        rep = copy_parts([Selection(db, chosen, label_map)], out, db.split, names, op="subset",
                         shards=shards, overwrite=overwrite, progress=progress,
                         provenance={"from": [str(p) for p in db.paths], **opts},
                         keeps_order=True)
        if labels is not None:
            write_class_map(Path(out) / f"ILSVRC-{db.split}.classes.tsv", kept, db.classes, renumber)
        reports.append(rep)
    return reports
