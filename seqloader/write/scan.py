"""Find the labelled images of a split folder, by torchvision ``ImageFolder``'s rules.

NOTE [ ImageFolder compatibility ]
Classes are the sorted names of the split folder's sub-folders and labels their
index, exactly as ``torchvision.datasets.ImageFolder`` computes them, so a model
trained from a seqloader database and one trained from the folders agree on what
label 7 means.  Images in nested sub-folders of a class belong to that class.  An
empty class folder keeps its label (``allow_empty=True``) with a warning, so later
labels never shift.  Two deliberate differences, both about files ImageFolder
would fail on anyway: hidden files and hidden sub-folders *inside* a class are
ignored (e.g. macOS ``._x.JPEG`` resource forks), and a hidden *class* folder is
kept (ImageFolder counts it) but warned about.
"""
from __future__ import annotations

import csv
import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import NotFoundError
from ..format.imagetree import is_image_file

__all__ = ["Scan", "scan_class_tree", "scan_labelled_folder",
           "read_label_lines", "is_header", "warn_single_class", "labels_file_exists"]

def _unreadable_folder(err: OSError) -> None:
    """os.walk skips a folder it cannot list: its images would silently be missing."""
    raise ValueError(f"cannot list folder {err.filename}: {err.strerror}; fix its permissions "
                     "(or move it out of the dataset) and run again") from err


def _walk_once(top: Path, repeated: list[str], root: Path | None = None
               ) -> list[tuple[str, list[str]]]:
    """``(folder, file names)`` under ``top`` in sorted order, following symbolic links
    but entering each real folder once, and never one that contains ``top`` (a link
    to ``..`` would pull in ``top`` again and the other classes) or is the split folder
    ``root`` or contains it (a class folder that links to ``.`` would pull in every
    class); skipped ones are appended to ``repeated``."""
    top_real = Path(os.path.realpath(top))
    root_real = None if root is None else Path(os.path.realpath(root))
    seen: set[str] = set()
    found = []
    for dirpath, dirnames, fnames in os.walk(top, followlinks=True, onerror=_unreadable_folder):
        real = os.path.realpath(dirpath)
        if real in seen or (real != str(top_real) and top_real.is_relative_to(real)) or (
                root_real is not None and root_real.is_relative_to(real)):
            repeated.append(dirpath)
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()  # the first of several links to a folder is the one kept: sorted
        found.append((dirpath, fnames))
    return sorted(found)


@dataclass
class Scan:
    """The images of one split, in sorted (ImageFolder) order.

    ``paths`` are posix paths relative to ``root``; ``labels[i]`` is the label of
    ``paths[i]``.  Held as a list of str and an int32 array: ~100 bytes per file,
    whatever the image sizes (ImageNet train: ~130 MB).
    """

    root: Path
    classes: list[str]
    paths: list[str]
    labels: np.ndarray
    empty_classes: list[str] = field(default_factory=list)
    ignored: int = 0
    #: what the images come from, stored in each file's metadata (``writer["source"]``):
    #: an archive source's digest (:func:`~seqloader.write.extshuffle.source_digest`);
    #: None for a folder tree, which the plan's fingerprint identifies
    source: str | None = None

    def __len__(self) -> int:
        return len(self.paths)


def scan_class_tree(root: str | Path) -> Scan:
    """Scan ``root/<class>/**/<image>`` (ImageFolder layout)."""
    root = Path(root)
    if not root.is_dir():
        raise NotFoundError(f"split folder {root} does not exist or is not a folder")
    with os.scandir(root) as it:
        classes = sorted(e.name for e in it if e.is_dir())
    if not classes:
        raise ValueError(f"{root} has no class sub-folders; expected {root}/<class>/<image>. "
                         "For a flat folder of images plus a labels file use --val-labels")
    hidden = [c for c in classes if c.startswith(".")]
    if hidden:
        warnings.warn(f"{root}: hidden folder(s) {hidden} are counted as classes (ImageFolder "
                      "does the same, so labels stay compatible); remove them if unintended",
                      stacklevel=2)
    paths: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    ignored = 0
    repeated: list[str] = []
    for label, cls in enumerate(classes):
        n_before = len(paths)
        for dirpath, fnames in _walk_once(root / cls, repeated, root):
            rel = Path(dirpath).relative_to(root).as_posix()
            if any(part.startswith(".") for part in rel.split("/")[1:]):
                continue
            for fname in sorted(fnames):
                if is_image_file(fname):
                    paths.append(f"{rel}/{fname}")
                    labels.append(label)
                else:
                    ignored += 1
        if len(paths) == n_before:
            empty.append(cls)
    if repeated:
        warnings.warn(f"{root}: skipped {len(repeated)} folder(s) reached again through "
                      f"symbolic links (a link loop, or a second link to one folder): "
                      f"{repeated[:3]}{' ...' if len(repeated) > 3 else ''}", stacklevel=2)
    if empty:
        warnings.warn(f"{root}: {len(empty)} class folder(s) have no images and keep their "
                      f"labels (ImageFolder allow_empty=True): {empty[:10]}"
                      f"{' ...' if len(empty) > 10 else ''}", stacklevel=2)
    return Scan(root, classes, paths, np.asarray(labels, np.int32), empty, ignored)


#: First fields of a labels file's header line (lower case), e.g. Kaggle's "ImageId".
_HEADER_WORDS = {"imageid", "image_id", "image", "images", "img", "filename", "file_name",
                 "file", "files", "name", "path", "id", "key"}


def is_header(name: str, token: str) -> bool:
    """Whether the first line ``name token`` of a labels file is a header, by its form: a
    known header word ("ImageId", "filename", ...), or words without digits or a file
    extension (a file name has one or the other -- ImageNet's have both -- and a class
    token is a WordNet id or an index).  A data line is never taken for one because its
    class is seen on no other line."""
    name, token = name.strip().lower(), token.strip().lower()
    if name in _HEADER_WORDS:
        return True
    return not any(c.isdigit() or c == "." for c in name) and not any(
        c.isdigit() for c in token)


def warn_single_class(split: str, cls: str, example: str, where: str | Path) -> None:
    """A train split of one class is almost always a layout read one level too high (e.g.
    Kaggle's ``ILSVRC/Data/CLS-LOC/train/<class>/...`` taken as class ``ILSVRC``)."""
    warnings.warn(f"{where}: split {split!r} has a single class, {cls!r} (images such as "
                  f"{example!r}): the class is the first folder of each image's path; if the "
                  "classes are deeper (as in Kaggle's ILSVRC/Data/CLS-LOC/train/<class>/...), "
                  "give the folder that holds the class folders (extract an archive first)",
                  stacklevel=3)


def labels_file_exists(labels_file: Path) -> None:
    """:class:`~seqloader.errors.NotFoundError` unless ``labels_file`` is a file, saying
    what file is expected (a folder is not one)."""
    if labels_file.is_dir():
        raise NotFoundError(
            f"labels file {labels_file} is a directory; give the file in it that labels the "
            "val images: 'filename class' lines (e.g. ILSVRC2012_val_00000001.JPEG n01751748), "
            "a CSV such as Kaggle's LOC_val_solution.csv, or the devkit "
            "ILSVRC2012_devkit_t12.tar.gz")
    if not labels_file.is_file():
        raise NotFoundError(f"labels file {labels_file} does not exist")


def read_label_lines(labels_file: Path) -> list[tuple[int, str, str]]:
    """(line number, file name, class token) for each data line of a labels file (UTF-8,
    with or without a byte-order mark)."""
    try:
        text = labels_file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{labels_file} is not UTF-8 text ({e.reason} at byte {e.start}); "
                         "save it as UTF-8") from None
    rows: list[tuple[int, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "," in line:
            fields = next(csv.reader(io.StringIO(line)))
        else:
            fields = line.split()
        if len(fields) < 2 or not fields[1].split():
            raise ValueError(f"{labels_file}:{lineno}: expected 'filename class' or "
                             f"'filename,class', got {line!r}")
        # ImageNet's LOC_val_solution.csv puts "wnid x0 y0 x1 y1 ..." in the second field.
        rows.append((lineno, fields[0].strip(), fields[1].split()[0]))
    return rows


def scan_labelled_folder(root: str | Path, labels_file: str | Path,
                         classes: Sequence[str] | None = None) -> Scan:
    """Scan a flat folder of images whose labels come from ``labels_file``.

    Each line is ``filename class`` or ``filename,class`` (CSV, e.g. ImageNet's
    ``LOC_val_solution.csv``; a header line is skipped).  ``filename`` may omit the
    extension.  ``class`` is a class name (e.g. a WordNet id) or a 0-based label
    index into ``classes``.  ``classes`` should be the train split's class list so
    labels agree; without it, the sorted class names in the file are used.
    Every image must have exactly one label and every label an image.
    """
    root, labels_file = Path(root), Path(labels_file)
    if not root.is_dir():
        raise NotFoundError(f"split folder {root} does not exist or is not a folder")
    labels_file_exists(labels_file)
    files = sorted(f for f in os.listdir(root) if is_image_file(f) and (root / f).is_file())
    by_name = {f: f for f in files}
    by_stem: dict[str, str] = {}
    for f in files:
        by_stem.setdefault(os.path.splitext(f)[0], f)
    rows = read_label_lines(labels_file)
    if rows and rows[0][1] not in by_name and rows[0][1] not in by_stem and is_header(
            rows[0][1], rows[0][2]):
        rows = rows[1:]  # a header line such as "ImageId,PredictionString"
    if classes is None:
        tokens = {tok for _, _, tok in rows}
        if any(t.isdigit() for t in tokens):
            raise ValueError(f"{labels_file} gives numeric labels but no class list is known; "
                             "preprocess the train split in the same run (its folders define "
                             "the classes) or use class names in the labels file")
        classes = sorted(tokens)
    classes = list(classes)
    index = {c: i for i, c in enumerate(classes)}
    label_of: dict[str, int] = {}
    for lineno, name, tok in rows:
        f = by_name.get(name) or by_stem.get(name)
        if f is None:
            raise ValueError(f"{labels_file}:{lineno}: no image {name!r} in {root}; fix the "
                             "labels file or restore the image")
        if tok in index:
            label = index[tok]
        elif tok.isdigit() and int(tok) < len(classes):
            label = int(tok)
        else:
            raise ValueError(f"{labels_file}:{lineno}: class {tok!r} is not one of the "
                             f"{len(classes)} classes (e.g. {classes[:3]}) nor a label index "
                             f"below {len(classes)}")
        if f in label_of and label_of[f] != label:
            raise ValueError(f"{labels_file}:{lineno}: {f} is labelled twice, differently")
        label_of[f] = label
    unlabelled = [f for f in files if f not in label_of]
    if unlabelled:
        raise ValueError(f"{len(unlabelled)} image(s) in {root} have no line in {labels_file} "
                         f"(e.g. {unlabelled[:3]}); add their labels or move them out")
    labels = np.asarray([label_of[f] for f in files], np.int32)
    present = set(labels.tolist())
    empty = [c for i, c in enumerate(classes) if i not in present]
    return Scan(root, classes, files, labels, empty, 0)
