"""The archive kinds of :mod:`.sources`: a tar of class folders, ImageNet's tar of
per-class tars, a flat tar plus a labels file, webdataset shards (any of them
compressed: NOTE [ compressed streams ])."""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tarfile
import warnings
from pathlib import Path
from typing import Iterator, Sequence

from ..format.imagetree import is_image_file
from .scan import read_label_lines, is_header, labels_file_exists

from .layout import TreeLayout, tree_layout
from .sources import (LABEL_EXTS, TAR_SUFFIXES, ClassSeen, Cursor, Item, Source,
                      clean_name, first_files, open_archive, read_member, tar_stem, tar_at)
from .compressed import decompressed
from .tarwalk import STREAM_ERRORS, Walk

__all__ = ["TarSource", "TreeTar", "TarOfTars", "FlatTar", "WebDataset"]

#: How far ahead of the parser the archive is asked for (``WILLNEED``), in two such steps.
_AHEAD = 32 << 20


class TarSource(Source):
    """Base of the tar kinds: walks each file's members from a cursor."""

    def events(self, cursor: Cursor) -> Iterator[tuple[Item | ClassSeen, Cursor]]:
        start_file = cursor[0] if cursor else 0
        self._pos = sum(self._file_sizes[:start_file])
        for k in range(start_file, len(self.files)):
            path = self.files[k]
            f, raw = open_archive(path)
            self._direct = str(path) if isinstance(f, io.BufferedReader) else None
            base = sum(self._file_sizes[:k])
            self._walk = Walk(str(path))  # the innermost archive being read
            try:
                sub = cursor[1:] if cursor and k == start_file else []
                ahead = 0
                events = self._file_events(k, f, sub, str(path))
                while True:
                    try:
                        ev, pos = next(events)
                    except StopIteration:
                        break
                    except STREAM_ERRORS as e:  # (a gzip stream's, while reading data)
                        raise self._walk.damaged(None, f"{type(e).__name__}: {e}, near byte "
                                                       f"{raw.tell():,} of the file") from None
                    here = raw.tell()
                    self._pos = base + here
                    if here >= ahead and hasattr(os, "posix_fadvise"):
                        # keep the disk reading while this process works (the kernel's
                        # own read-ahead stops at a few hundred KB ahead)
                        os.posix_fadvise(raw.fileno(), here, 2 * _AHEAD, os.POSIX_FADV_WILLNEED)
                        ahead = here + _AHEAD
                    yield ev, [k, *pos]
            finally:
                f.close()
                raw.close()
            self._pos = base + self._file_sizes[k]

    def _file_events(self, k: int, f, sub: list, where: str):
        raise NotImplementedError

    def _walk_of(self, where: str) -> Walk:
        """A new :class:`Walk` of ``where``, the one errors name from now on."""
        self._walk = Walk(where)
        return self._walk

    def _item(self, name: str, label: int | str, tf: tarfile.TarFile, m: tarfile.TarInfo,
              walk: Walk, base: int | None = 0) -> Item:
        """An item whose data is located (NOTE [ data by location ]) where the member is
        stored as is at ``base + m.offset_data`` of the file, else read now."""
        if self._direct is not None and base is not None and m.sparse is None:
            return Item(name, label, None, (self._direct, base + m.offset_data, m.size))
        return Item(name, label, read_member(tf, m, walk))


class TreeTar(TarSource):
    """A tar of a folder tree: ``class/.../image`` under the top folders its layout says
    (NOTE [ archive layouts ]): the class is the first folder under them, and only the
    images of split ``split`` are read from an archive of a whole dataset folder."""

    kind = "tree"

    def __init__(self, files, *, split: str = "", classes=None):
        super().__init__(files, classes=classes)
        self.split = split

    def _file_events(self, k, f, sub, where):
        sample = [clean_name(m.name) for m in first_files(self.files[k], images=True)]
        layout = tree_layout(sample, split=self.split, stem=tar_stem(self.files[k].name))
        tf = tar_at(f, sub[0] if sub else 0, where)
        walk = self._walk_of(where)
        taken, splits, skipped = 0, set(), {}
        for m in walk.members(tf):
            name = clean_name(m.name)
            if not name:  # the archive's root entry (``./``)
                continue
            parts = name.split("/")
            if m.isdir():  # a class folder, even an empty one (as in the extracted tree)
                why, rest = layout.place(parts, self.split, folder=True)
                if why is None and len(rest) == 1 and rest[0]:
                    yield ClassSeen(rest[0]), [m.offset]
                continue
            if not m.isfile() or not is_image_file(parts[-1]) or any(
                    p.startswith(".") for p in parts[1:-1]):
                continue
            why, rest = layout.place(parts, self.split)
            if why is None:
                taken += 1
                yield self._item("/".join(rest), rest[0], tf, m, walk), [tf.offset]
                continue
            if why == "outside":
                raise ValueError(
                    f"{where}: image {m.name} is outside {layout.top}/, the folder the "
                    f"archive's first images are in ({layout.describe()}); archive one folder "
                    "tree (or extract it and preprocess the folder)")
            if why == "other split" and layout.splits:
                splits.add(parts[1] if layout.top is not None else parts[0])
            skipped.setdefault(why, name)
        self._said(where, layout, taken or bool(sub), splits, skipped)  # (resumed: not all seen)

    def _said(self, where: str, layout: TreeLayout, taken: int | bool, splits: set[str],
              skipped: dict[str, str]) -> None:
        """After the walk: a split asked for that the dataset folder lacks stops the run; an
        image in no class folder was skipped, as in the extracted tree (a warning)."""
        if layout.splits and not taken:
            raise ValueError(
                f"{where} holds a dataset folder ({layout.describe()}) without a "
                f"{self.split!r} split folder with images (its split folders: "
                f"{sorted(splits) or 'none'}); give the split to read with --split")
        if "no class folder" in skipped:
            warnings.warn(f"{where}: image(s) not inside a class folder are skipped, as "
                          "preprocessing the extracted folder skips them (e.g. "
                          f"{skipped['no class folder']})", stacklevel=2)


class TarOfTars(TarSource):
    """A tar of per-class tars (ImageNet train): the inner tar's name is the class, its
    images the class's; records are named ``class/image`` as in the extracted tree."""

    kind = "tar-of-tars"

    def _file_events(self, k, f, sub, where):
        outer = tar_at(f, sub[0] if sub else 0, where)
        resume = sub[1] if len(sub) > 1 else None  # inside the inner tar at sub[0]
        outer_walk = self._walk_of(where)
        for m in outer_walk.members(outer):
            if not m.isfile() or not m.name.lower().endswith(TAR_SUFFIXES):
                continue
            cls = tar_stem(clean_name(m.name))
            after = outer.offset
            if resume is None:
                start = 0
                yield ClassSeen(cls), [m.offset, 0]
            else:
                start, resume = resume, None
            inner_where = f"{where}:{m.name}"
            # an inner tar is compressed (read through its decompressor) or stored as is,
            # in one piece (its images located in the outer file) or sparse (GNU tar
            # --sparse: tarfile fills its holes; read, not located)
            inner = decompressed(outer.extractfile(m), inner_where)
            stored = isinstance(inner, io.BufferedReader) and m.sparse is None
            base = m.offset_data if stored else None
            tf = tar_at(inner, start, inner_where)
            walk = self._walk_of(inner_where)
            for im in walk.members(tf):
                # (the path inside the class folder, as extracting the inner tar there
                # makes it; hidden folders skipped, as the tree's scan skips them)
                name = clean_name(im.name)
                parts = name.split("/")
                if im.isfile() and is_image_file(parts[-1]) and not any(
                        p.startswith(".") for p in parts[:-1]):
                    yield (self._item(f"{cls}/{name}", cls, tf, im, walk, base),
                           [m.offset, tf.offset])
            self._walk = outer_walk
            outer.offset = after


class FlatTar(TarSource):
    """A tar of images without folders-as-classes, labelled by a labels file: lines
    ``filename class`` / ``filename index`` or CSV such as Kaggle's
    ``LOC_val_solution.csv`` (a header line is skipped).  A file name may omit its
    extension; every image needs a label."""

    kind = "flat"

    def __init__(self, files, labels_file: str | Path, *, classes=None):
        super().__init__(files, classes=classes)
        self.labels_file = Path(labels_file)
        labels_file_exists(self.labels_file)
        rows = (_devkit_rows(self.labels_file) if self.labels_file.name.lower().endswith(
            TAR_SUFFIXES) else read_label_lines(self.labels_file))
        # the archives' image names, read before anything is written: the labels file is
        # checked against them, and a first line is a header only if it cannot be data
        images = _image_names(tuple((str(f), *_stat(f)) for f in self.files))
        known = set(images) | {os.path.splitext(n)[0] for n in images}
        if rows and rows[0][1] not in known and is_header(rows[0][1], rows[0][2]):
            rows = rows[1:]  # a header such as "ImageId,PredictionString"
        self.label_of: dict[str, int | str] = {}
        self._line_of: dict[str, int] = {}
        for lineno, name, tok in rows:
            label: int | str = int(tok) if tok.isdigit() and not (
                classes is not None and tok in classes) else tok
            old = self.label_of.setdefault(name, label)
            self._line_of.setdefault(name, lineno)
            if old != label:
                raise ValueError(f"{self.labels_file}:{lineno}: {name} is labelled twice, "
                                 "differently")
        unlabelled = [n for n in images if n not in self.label_of
                      and os.path.splitext(n)[0] not in self.label_of]
        if unlabelled:
            raise ValueError(
                f"{len(unlabelled)} of the {len(images)} images of "
                f"{', '.join(f.name for f in self.files)} have no line in {self.labels_file} "
                f"(e.g. {unlabelled[:3]}); is this the labels file of these archives? Add "
                "their labels or give the right file")
        self.check_labels()

    def check_labels(self) -> None:
        """Every label names one of :attr:`classes` or is an index below their count (when
        the class list is known: the train split's): checked in full before any split is
        written, not after train's hours."""
        if self.classes is None:
            return
        known, n = set(self.classes), len(self.classes)
        for name, label in self.label_of.items():
            if label in known or (isinstance(label, int) and label < n):
                continue
            raise ValueError(
                f"{self.labels_file}:{self._line_of[name]}: {name}'s class {str(label)!r} is "
                f"not one of the {n} classes of the train split (or --class-names), e.g. "
                f"{self.classes[:3]}, nor a label index below {n}; fix the line, or give the "
                "labels file of these archives (and the train split they belong to)")

    def check_names(self, names: Sequence[str]) -> None:
        """Warn about labels whose image was not in the archive (all records read)."""
        found = set()
        for n in names:
            base = n.rsplit("/", 1)[-1]
            found.update((base, os.path.splitext(base)[0]))
        unused = [k for k in self.label_of if k not in found]
        if unused:
            warnings.warn(f"{self.labels_file}: {len(unused)} labelled image(s) are not in "
                          f"{', '.join(f.name for f in self.files)} (e.g. {unused[:3]}); is "
                          "this the labels file of these archives?", stacklevel=2)

    def identity(self) -> str:
        digest = hashlib.blake2b(self.labels_file.read_bytes(), digest_size=16).hexdigest()
        return super().identity() + digest

    def _file_events(self, k, f, sub, where):
        tf = tar_at(f, sub[0] if sub else 0, where)
        walk = self._walk_of(where)
        for m in walk.members(tf):
            name = clean_name(m.name)
            base = name.rsplit("/", 1)[-1]
            if not m.isfile() or not is_image_file(base):
                continue
            label = self.label_of.get(base, self.label_of.get(os.path.splitext(base)[0]))
            if label is None:
                raise ValueError(f"{where}: image {name} has no line in {self.labels_file}; "
                                 "add its label (or use the labels file of this archive)")
            yield self._item(name, label, tf, m, walk), [tf.offset]


def _stat(f: Path) -> tuple[int, int]:
    st = f.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=8)
def _image_names(files: tuple[tuple[str, int, int], ...]) -> tuple[str, ...]:
    """The file names of the image members of flat tars (``(path, size, mtime)`` each, so
    a changed file is read again), read once per run: a walk of the headers only."""
    names = []
    for path, _, _ in files:
        f, raw = open_archive(Path(path))
        try:
            tf = tar_at(f, 0, path)
            for m in Walk(path).members(tf):
                base = clean_name(m.name).rsplit("/", 1)[-1]
                if m.isfile() and is_image_file(base):
                    names.append(base)
        finally:
            f.close()
            raw.close()
    return tuple(names)


def _devkit_rows(devkit: Path) -> list[tuple[int, str, str]]:
    """(line, file name, WordNet id) of ImageNet's val images from the devkit tar
    (``ILSVRC2012_devkit_t12.tar.gz``): ``data/ILSVRC2012_validation_ground_truth.txt``
    gives each val image's ILSVRC2012_ID, ``data/meta.mat`` maps those ids to WordNet
    ids; reading that MATLAB file needs scipy (optional)."""
    try:
        from scipy.io import loadmat
    except ImportError:
        raise ValueError(f"reading {devkit.name}'s meta.mat needs scipy (pip install scipy); "
                         "or give --val-labels LOC_val_solution.csv (Kaggle) or a "
                         "'filename wnid' file") from None
    truth = meta = None
    with tarfile.open(devkit) as tf:
        for m in tf:
            if m.name.endswith("data/ILSVRC2012_validation_ground_truth.txt"):
                truth = tf.extractfile(m).read().decode().split()
            elif m.name.endswith("data/meta.mat"):
                meta = loadmat(io.BytesIO(tf.extractfile(m).read()), squeeze_me=True)
    if truth is None or meta is None:
        raise ValueError(f"{devkit} lacks data/ILSVRC2012_validation_ground_truth.txt or "
                         "data/meta.mat; give the ILSVRC2012 devkit (devkit_t12)")
    wnid = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in meta["synsets"]}
    return [(i, f"ILSVRC2012_val_{i:08d}.JPEG", wnid[int(t)]) for i, t in enumerate(truth, 1)]


class WebDataset(TarSource):
    """webdataset shards: consecutive members ``key.<image ext>`` + ``key.cls`` (an integer
    label) or ``key.json`` (an object with ``label``/``cls``: an index or a class name).
    Records are named ``<shard>/<key>.<ext>``."""

    kind = "webdataset"

    def _file_events(self, k, f, sub, where):
        tf = tar_at(f, sub[0] if sub else 0, where)
        shard = tar_stem(self.files[k].name)
        walk = self._walk_of(where)
        key, parts = None, {}
        for m in walk.members(tf):
            if not m.isfile():
                continue
            name = clean_name(m.name)
            d, _, base = name.rpartition("/")
            mkey, _, ext = base.partition(".")
            mkey = f"{d}/{mkey}" if d else mkey
            if mkey != key:
                if key is not None:
                    yield self._sample(where, shard, key, parts), [m.offset]
                key, parts = mkey, {}
            ext = ext.lower()
            if ext in LABEL_EXTS or is_image_file(base):
                parts[ext] = read_member(tf, m, walk)
        if key is not None:
            yield self._sample(where, shard, key, parts), [tf.offset]

    def _sample(self, where: str, shard: str, key: str, parts: dict) -> Item:
        images = [e for e in parts if e not in LABEL_EXTS]
        if len(images) != 1:
            raise ValueError(f"{where}: sample {key!r} has {len(images)} images "
                             f"({sorted(parts)}); expected one key.jpg (or .png, ...)")
        if "cls" in parts:
            text = parts["cls"].decode("utf-8", "replace").strip()
            if not text.lstrip("-").isdigit() or int(text) < 0:
                raise ValueError(f"{where}: {key}.cls holds {text[:40]!r}, not a label index")
            label: int | str = int(text)
        elif "json" in parts:
            try:
                obj = json.loads(parts["json"])
            except ValueError as e:
                raise ValueError(f"{where}: {key}.json is not JSON ({e})") from None
            label = obj.get("label", obj.get("cls")) if isinstance(obj, dict) else None
            if not isinstance(label, (int, str)) or isinstance(label, bool) or (
                    isinstance(label, int) and label < 0):
                raise ValueError(f"{where}: {key}.json has no 'label' (or 'cls') index or class "
                                 f"name: {parts['json'][:80]!r}")
        else:
            raise ValueError(f"{where}: sample {key!r} has no {key}.cls or {key}.json label")
        return Item(f"{shard}/{key}.{images[0]}", label, parts[images[0]])
