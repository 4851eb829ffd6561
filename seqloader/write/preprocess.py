"""Preprocess an ImageNet-style tree (``<root>/<split>/<class>/*``) into LMDB files.

The library side of ``preprocess_sequential.py`` and ``seqloader preprocess``.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Sequence

from ..format.files import db_name
from ..read.remote import is_url
from .overlap import refuse_overlap
from .scan import Scan, scan_class_tree, scan_labelled_folder, warn_single_class
from .writer import WriteOptions, WriteReport, write_split
from ..errors import NotFoundError, OutputExistsError

__all__ = ["DEFAULT_SPLITS", "preprocess", "preprocess_sources", "scan_split", "shuffles_split",
           "split_of"]

DEFAULT_SPLITS = ("train", "val")


def shuffles_split(split: str, shuffle: bool) -> bool:
    """Training splits are written in a seeded shuffled order; others keep sorted order."""
    return shuffle and split.startswith("train")


def _has_class_folders(folder: Path) -> bool:
    with os.scandir(folder) as it:
        return any(e.is_dir() and not e.name.startswith(".") for e in it)


def _has_entries(folder: Path) -> bool:
    with os.scandir(folder) as it:
        return any(True for _ in it)


def scan_split(root: Path, split: str, *, labels_file: str | Path | None = None,
               train_classes: Sequence[str] | None = None) -> Scan:
    """Scan ``root/split``: class folders, or a flat folder plus ``labels_file``."""
    folder = root / split
    if labels_file is not None:
        if _has_class_folders(folder):
            raise ValueError(f"{folder} has class sub-folders, but a labels file was given; "
                             "use one or the other")
        return scan_labelled_folder(folder, labels_file, train_classes)
    if folder.is_dir() and not _has_class_folders(folder) and _has_entries(folder):
        raise ValueError(f"{folder} holds files but no class folders; give its labels with "
                         "--val-labels FILE ('filename class' lines or CSV)")
    return scan_class_tree(folder)


def preprocess(imagenet_dir: str | Path, lmdb_dir: str | Path, *,
               splits: Sequence[str] | None = None, val_labels: str | Path | None = None,
               options: WriteOptions | None = None, staging: str | Path | None = None,
               storage_options: dict | None = None) -> list[WriteReport]:
    """Write ``<lmdb_dir>/ILSVRC-<split>.lmdb`` (or its shards) for each split.

    ``lmdb_dir`` may be a folder URL (``s3://bucket/prefix``, any fsspec protocol that
    can write): each shard is then written in the local folder ``staging`` (default: one
    in the system temp folder) and uploaded when complete, with ``storage_options`` for
    fsspec (NOTE [ writing to object storage ] in :mod:`seqloader.write.upload`); the
    reports' shard paths are then the objects' URLs.

    ``splits`` defaults to those of ``train``/``val`` that exist.  Training splits
    are shuffled with ``options.seed`` unless ``options.shuffle`` is False; other
    splits keep ImageFolder's sorted order.  ``val_labels`` labels a flat ``val``
    folder, with the classes of ``train`` when that folder exists.  Raises
    :class:`~seqloader.write.writer.NoRecordsError` at a split none of whose images could be
    stored (its bad-files report stays; splits written before it too).
    """
    root, out = Path(imagenet_dir), Path(lmdb_dir)
    opt = options or WriteOptions()
    if not root.is_dir():
        raise NotFoundError(f"dataset folder {root} does not exist")
    uploader = None
    if isinstance(lmdb_dir, str) and is_url(lmdb_dir):
        from .upload import Uploader

        uploader = Uploader(lmdb_dir, staging=staging, storage_options=storage_options)
    elif staging is not None:
        raise ValueError(f"staging={staging} (--staging) is for an output URL, where shards are "
                         f"written locally, then uploaded; {lmdb_dir} is a local folder: drop it")
    elif out.exists() and not out.is_dir():
        raise OutputExistsError(f"output folder {out} is a file; name a folder (it is created "
                                "if missing) for the .lmdb files")
    if splits is None:
        splits = [s for s in DEFAULT_SPLITS if (root / s).is_dir()]
        if not splits:
            raise NotFoundError(f"{root} has neither train/ nor val/; point at the folder "
                                "that holds them, or name the split folders with --splits")
    missing = [s for s in splits if not (root / s).is_dir()]
    if missing:
        raise NotFoundError(f"split folder(s) {missing} not found in {root}")
    refuse_overlap([root / s for s in splits], lmdb_dir, holding_ok=True)
    train_classes = None
    if (root / "train").is_dir():
        with os.scandir(root / "train") as it:
            train_classes = sorted(e.name for e in it if e.is_dir())
    reports = []
    # every split scanned (a labels file read and checked in full) before any is written
    scans = [scan_split(root, split, labels_file=val_labels if split == "val" else None,
                        train_classes=train_classes) for split in splits]
    for split, scan in zip(splits, scans):
        if split == "train" and len(scan.classes) == 1:
            warn_single_class(split, scan.classes[0], scan.paths[0] if scan.paths else "",
                              root / split)
        if train_classes is not None and scan.classes != train_classes:
            warnings.warn(f"{split}: its {len(scan.classes)} classes differ from train's "
                          f"{len(train_classes)}, so labels will not agree between the splits; "
                          "check the folders", stacklevel=2)
        split_opt = WriteOptions(**{**vars(opt), "shuffle": shuffles_split(split, opt.shuffle)})
        if uploader is not None:
            reports.append(uploader.write_split(scan, split, split_opt))
            continue
        out.mkdir(parents=True, exist_ok=True)
        reports.append(write_split(scan, out / f"{db_name(split)}.lmdb", split, split_opt))
    return reports


def split_of(path: str | Path) -> str:
    """The split an archive holds, from its name: ``train`` or ``val`` (as in
    ``ILSVRC2012_img_train.tar``, ``ILSVRC-val.lmdb``)."""
    name = Path(path).name.lower()
    found = [s for s in DEFAULT_SPLITS if s in name]
    if len(found) != 1:
        raise ValueError(f"cannot tell the split of {path} from its name; name it with "
                         "--split (e.g. --split train)")
    return found[0]


def preprocess_sources(sources: Sequence[str | Path], lmdb_dir: str | Path, *,
                       split: str | None = None, val_labels: str | Path | None = None,
                       class_names: Sequence[str] | None = None,
                       options: WriteOptions | None = None, memory_budget: int | None = None,
                       scratch: str | Path | None = None, image_column: str | None = None,
                       label_column: str | None = None) -> list[WriteReport]:
    """Write ``<lmdb_dir>/ILSVRC-<split>.lmdb`` from archives read sequentially once
    (:mod:`seqloader.write.sources`), shuffled by :mod:`seqloader.write.extshuffle` within
    ``memory_budget``.  Each file's split is ``split`` or comes from its name; a split's
    files are read in the order given; train goes first, so that val's labels
    (``val_labels`` for a flat val tar) index train's classes.  ``class_names`` names
    the classes of sources labelled by index (tensorpack LMDB files).  A zip or parquet
    file may give several splits (Kaggle's zip: train and val) or none (a test file);
    ``image_column``/``label_column`` name parquet files' columns."""
    from .extshuffle import DEFAULT_MEMORY_BUDGET, write_source
    from .inputs import check_source_path, open_source, source_splits

    opt = options or WriteOptions()
    if is_url(lmdb_dir):
        raise ValueError(f"archive sources are written to a local folder; give one, then "
                         f"upload it (or preprocess the extracted folder tree straight to "
                         f"{lmdb_dir})")
    if opt.image_format != "jpeg":
        raise ValueError(f"image_format={opt.image_format!r} (--format pixels) is not "
                         "supported for archive sources yet; preprocess them as JPEG, or the "
                         "extracted folder tree with --format pixels")
    out = Path(lmdb_dir)
    for f in sources:
        check_source_path(f)
    refuse_overlap(sources, out, holding_ok=True)
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output folder {out} is a file; name a folder (it is created "
                                "if missing) for the .lmdb files")
    by_split: dict[str, list[Path]] = {}
    for f in sources:
        for s in source_splits(f, split, split_of):
            by_split.setdefault(s, []).append(Path(f))
    if not by_split:
        raise ValueError(f"no split to write from {[str(f) for f in sources]}; give the "
                         "train or validation files")
    cols = {"image_column": image_column, "label_column": label_column}
    order = sorted(by_split, key=lambda s: (s != "train", s != "val", s))
    for s in order:  # the files it writes (or their shards): NOTE [ outputs apart from inputs ]
        for f in sources:
            name = Path(f).name
            if (os.path.realpath(Path(f).parent) == os.path.realpath(out)
                    and (name == f"{db_name(s)}.lmdb"
                         or name.startswith(f"{db_name(s)}-") and name.endswith(".lmdb"))):
                raise ValueError(f"the source {f} has the name of a database file this command "
                                 f"writes into {out} ({db_name(s)}.lmdb or its shards): "
                                 "writing there would destroy its input, which this command "
                                 "reads; write to another folder, or rename the source")
    train_classes = list(class_names) if class_names is not None else None
    # every split's source opened (a labels file read and checked in full, each archive's
    # kind known) before any split is written: not hours later, after train
    opened = {s: open_source(by_split[s], split=s,
                             labels_file=val_labels if s != "train" else None,
                             classes=train_classes, **cols) for s in order}

    def with_train_classes(classes: list[str]) -> None:
        """Train's classes are known (after its first pass, before it is written): the other
        splits' sources reopened so their labels index them, a labels file checked in full."""
        for s in order:
            if s != "train" and class_names is None:
                opened[s] = open_source(by_split[s], split=s, labels_file=val_labels,
                                        classes=classes, **cols)

    reports = []
    created = not out.exists()
    try:
        for s in order:
            split_opt = WriteOptions(**{**vars(opt), "shuffle": shuffles_split(s, opt.shuffle)})
            out.mkdir(parents=True, exist_ok=True)
            report, _ = write_source(
                opened[s], out / f"{db_name(s)}.lmdb", s, split_opt,
                memory_budget=memory_budget or DEFAULT_MEMORY_BUDGET,
                scratch=None if scratch is None else Path(scratch) / f"{db_name(s)}.scratch",
                on_classes=with_train_classes if s == "train" else None)
            reports.append(report)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # (a failure before anything was written leaves no empty folder)
        raise
    return reports
