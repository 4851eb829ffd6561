"""Which source reads a split's input files: :func:`source_kind` tells the kind from a
file's first members, :func:`open_source` opens the source of that kind (the archives of
:mod:`seqloader.write.archives`, or the LMDB files of :mod:`seqloader.write.migrate`)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .archives import FlatTar, TarOfTars, TreeTar, WebDataset
from .migrate import TensorpackLMDB
from .parquet import ParquetSource, is_parquet, parquet_splits
from .zipwalk import ZipSource, is_zip, zip_splits
from ..errors import NotFoundError
from ..format.imagetree import is_image_file
from .sources import LABEL_EXTS, TAR_SUFFIXES, Source, clean_name, first_files

__all__ = ["open_source", "source_kind", "source_splits", "check_source_path"]

#: The first bytes of image files (JPEG, PNG, GIF, TIFF), none a tar's first name could have.
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"II*\x00", b"MM\x00*")


def check_source_path(path: str | Path) -> None:
    """Refuse, in one line, a source that is missing or is one image file (not a folder
    tree or an archive: it would be read as a damaged tar)."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(f"no such file or folder: {path}")
    if p.is_file():
        with open(p, "rb") as f:
            head = f.read(8)
        if is_image_file(p.name) or head.startswith(_IMAGE_MAGIC):
            raise ValueError(f"{path} is an image file; a source is a folder tree (the folder "
                             "holding train/<class>/<image>) or archive files (tars, "
                             "webdataset shards, zips, parquet files, LMDB files): give the "
                             "folder or archive")


def _sample_keys(names: list[str], *, labelled: bool = False) -> set[str]:
    """The webdataset keys (path up to the name's first dot) of ``names`` -- of its label
    members (``key.cls``/``key.json``) with ``labelled``.  A shard pairs each image with a
    label of the same key; a stray ``dataset_info.json`` among class folders pairs none."""
    keys = set()
    for n in names:
        d, _, base = n.rpartition("/")
        key, _, ext = base.partition(".")
        if not labelled or ext.lower() in LABEL_EXTS:
            keys.add(f"{d}/{key}")
    return keys


def source_kind(path: str | Path, *, labels: bool = False) -> str:
    """``"lmdb"``, ``"parquet"``, ``"zip"``, ``"tar-of-tars"``, ``"webdataset"``, ``"flat"``
    or ``"tree"``, from the file's name or first bytes, then its first members (ValueError
    for anything else)."""
    path = Path(path)
    if path.is_dir() or path.suffix in (".lmdb", ".mdb"):
        return "lmdb"
    if is_parquet(path):
        return "parquet"
    if is_zip(path):
        return "zip"
    members = first_files(path)
    names = [clean_name(m.name) for m in members]
    if names and names[0].lower().endswith(TAR_SUFFIXES):
        return "tar-of-tars"
    images = [n for n in names if is_image_file(n.rsplit("/", 1)[-1])]
    if _sample_keys(names, labelled=True) & _sample_keys(images):
        return "webdataset"
    if labels:
        return "flat"
    if any("/" in n for n in images):  # (an image at the top is skipped, as in the tree)
        return "tree"
    raise ValueError(f"{path}: cannot tell how its images are labelled (first members: "
                     f"{names[:3]}); expected a tar of per-class tars, a tar of class "
                     "folders, webdataset shards (key.jpg + key.cls/.json), or flat images "
                     "with --val-labels FILE")


def source_splits(path: str | Path, split: str | None, by_name) -> list[str]:
    """The splits one source file gives: ``[split]`` if given; a zip or a parquet file
    may hold several or none (:func:`~.zipwalk.zip_splits`,
    :func:`~.parquet.parquet_splits`); else ``[by_name(path)]``."""
    if is_parquet(path):
        return parquet_splits(path, split, by_name)
    if is_zip(path):
        try:
            named = split or by_name(path)
        except ValueError:
            named = None
        return zip_splits(path, split, named)
    return [split or by_name(path)]


def open_source(files: Sequence[str | Path], *, split: str = "",
                labels_file: str | Path | None = None,
                classes: Sequence[str] | None = None, image_column: str | None = None,
                label_column: str | None = None) -> Source:
    """The source of one split's ``files`` (all of one kind; webdataset shards in the
    order given).  ``labels_file`` labels a flat tar; ``classes`` fixes the class list
    labels index into (give the train split's, so that val's labels agree);
    ``image_column``/``label_column`` name a parquet file's columns."""
    files = [Path(f) for f in files]
    if not files:
        raise ValueError("no source files given")
    kinds = {source_kind(f, labels=labels_file is not None) for f in files}
    if len(kinds) > 1:
        raise ValueError(f"the files of split {split!r} are of different kinds ({sorted(kinds)})"
                         "; give one split's files of one kind")
    kind = kinds.pop()
    if labels_file is not None and kind != "flat":
        raise ValueError(f"a labels file was given for {files[0]}, but it is a {kind} source "
                         "whose labels are inside it; drop --val-labels")
    if (image_column or label_column) and kind != "parquet":
        raise ValueError(f"--image-column/--label-column name a parquet file's columns; "
                         f"{files[0]} is a {kind} source: drop them")
    if kind == "parquet":
        return ParquetSource(files, split=split, classes=classes, image_column=image_column,
                             label_column=label_column)
    if kind == "zip":
        return ZipSource(files, split=split, classes=classes)
    if kind == "lmdb":
        return TensorpackLMDB(files, classes=classes)
    if kind == "flat":
        return FlatTar(files, labels_file, classes=classes)
    if kind == "tree":
        return TreeTar(files, split=split, classes=classes)
    return {"tar-of-tars": TarOfTars, "webdataset": WebDataset}[kind](files, classes=classes)
