"""Stream sources: the labelled images of archives, read front to back once.

A source yields ``(event, cursor)`` pairs in a fixed order: an :class:`Item` (one
image: its record name, its class and its bytes) or a :class:`ClassSeen` (a class
that exists even if it has no image, e.g. an empty inner tar).  ``cursor`` is a small
JSON-serialisable position *after* that event; ``events(cursor)`` starts there, so a
killed pass resumes without reading what it had (NOTE [ stream cursors ]).

Kinds (see :func:`open_source`): a tar of a class-folder tree, a tar of per-class
tars (ImageNet's ``ILSVRC2012_img_train.tar``: the inner tar's name is the class), a
flat tar of images plus a labels file (``ILSVRC2012_img_val.tar``), webdataset
shards (``key.jpg`` + ``key.cls``/``key.json``), each optionally gzip'd; and the
original loader's / tensorpack's LMDB files (:mod:`seqloader.write.migrate`).

NOTE [ stream cursors ]
For tars the cursor is ``[file index, header offset in the (decompressed) outer tar,
header offset inside the inner tar]``: tarfile reads a member's header at an offset
and knows where the next one starts, so a resume seeks there instead of walking
600,000 headers (each a seek on a hard disk).  A gzip'd tar seeks forward by
decompressing, which is still one sequential read.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from .scan import _read_label_lines, is_image_file

__all__ = ["Item", "ClassSeen", "Source", "TarSource", "open_source", "source_kind", "read_item",
           "close_files"]

#: Read-ahead of archive files: large requests keep a disk streaming (a 128 KB
#: request per seek would be ~10 % of an HDD's bandwidth).
READ_BUFFER = 16 << 20
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_LABEL_EXTS = ("cls", "json")


@dataclass
class Item:
    """One image of a source: ``name`` is unique in the source and is the record's stored
    path (``class/file`` as in the extracted tree where there is one); ``label`` is a class
    name (str) or a label index (int); ``data`` its encoded bytes."""

    name: str
    label: int | str
    data: bytes | None
    #: where ``data`` lies in an uncompressed archive, ``(path, offset, size)``, when the
    #: source leaves reading it to whoever prepares the item (NOTE [ data by location ])
    loc: tuple[str, int, int] | None = None


# NOTE [ data by location ]
# The images of an uncompressed tar are not handed to the decode workers as bytes
# (pickled through a pipe: four copies of every image, and the main process's time):
# the source gives their location, and a worker reads them with ``pread``.  The main
# process's large sequential reads of the tar's headers, and the kernel's read-ahead,
# have just brought those pages into the page cache, so the disk is still read once,
# in order.


def read_item(item: Item) -> bytes:
    """The bytes of ``item``: its data, or read from its location."""
    if item.data is not None:
        return item.data
    path, offset, size = item.loc
    return read_at(path, offset, size)


_FDS: dict[str, int] = {}


def read_at(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` at ``offset`` (descriptors cached per process)."""
    fd = _FDS.get(path)
    if fd is None:
        fd = _FDS[path] = os.open(path, os.O_RDONLY)
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ValueError(f"{path}: {len(data)} of {size} bytes at offset {offset}: the archive "
                         "was cut short while being read")
    return data


def close_files() -> None:
    """Close the descriptors :func:`read_at` opened in this process."""
    while _FDS:
        os.close(_FDS.popitem()[1])


@dataclass
class ClassSeen:
    """A class the source declares, with or without images (it keeps its label)."""

    name: str


Cursor = list  # JSON-serialisable; [] is the start


class Source:
    """The interface of a stream source (subclasses implement :meth:`events`)."""

    kind = "?"

    def __init__(self, files: Sequence[str | Path], *, classes: Sequence[str] | None = None):
        self.files = [Path(f) for f in files]
        for f in self.files:
            if not f.exists():
                raise FileNotFoundError(f"source {f} does not exist")
        #: the class list labels index into, when fixed in advance (else: the sorted
        #: class names seen, as ImageFolder sorts its folders)
        self.classes = list(classes) if classes is not None else None
        self._file_sizes = [_size(f) for f in self.files]
        self._pos = 0

    def identity(self) -> str:
        """What the seeded order depends on: the kind, the files' names and sizes (not
        their folder or times: a copy elsewhere is the same source)."""
        return repr((self.kind, [(f.name, s) for f, s in zip(self.files, self._file_sizes)]))

    def fingerprint(self) -> str:
        """:meth:`identity` plus modification times and label inputs: an unfinished pass
        over another version of the source is not resumed."""
        h = hashlib.blake2b(self.identity().encode(), digest_size=16)
        for f in self.files:
            h.update(str(f.stat().st_mtime_ns).encode())
        return h.hexdigest()

    def total_bytes(self) -> int:
        """The on-disk size of the source (what a pass reads)."""
        return sum(self._file_sizes)

    def position(self) -> int:
        """On-disk bytes of the source consumed so far (for progress)."""
        return self._pos

    def events(self, cursor: Cursor) -> Iterator[tuple[Item | ClassSeen, Cursor]]:
        raise NotImplementedError

    def root_label(self) -> Path:
        """Shown before record names in messages about bad images."""
        return self.files[0] if len(self.files) == 1 else self.files[0].parent


def _size(p: Path) -> int:
    if p.is_dir():
        return sum(c.stat().st_size for c in p.iterdir() if c.is_file())
    return p.stat().st_size


def _open_archive(path: Path) -> tuple[io.IOBase, io.FileIO]:
    """(the tar's byte stream, the raw file under it) -- decompressed if gzip'd."""
    raw = io.FileIO(path, "rb")
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(raw.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    buffered = io.BufferedReader(raw, READ_BUFFER)
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered, mode="rb"), raw
    return buffered, raw


def _tar_at(fileobj: io.IOBase, offset: int, where: str) -> tarfile.TarFile:
    """A TarFile reading headers from ``offset`` on (NOTE [ stream cursors ])."""
    fileobj.seek(offset)
    try:
        return tarfile.TarFile(fileobj=fileobj, mode="r")
    except tarfile.TarError as e:
        raise ValueError(f"{where}: not a readable tar at byte {offset} ({e}); check that the "
                         "download is complete (compare its size or checksum)") from None


def _members(tf: tarfile.TarFile, where: str) -> Iterator[tarfile.TarInfo]:
    """The members of ``tf`` in order, without the TarFile keeping a list of them (1.28 M
    TarInfos would hold ~1 GB)."""
    while True:
        try:
            m = tf.next()
        except tarfile.TarError as e:
            raise ValueError(f"{where}: damaged tar after byte {tf.offset} ({e}); check that "
                             "the download is complete") from None
        if m is None:
            return
        tf.members.clear()
        yield m


def _read(tf: tarfile.TarFile, m: tarfile.TarInfo, where: str) -> bytes:
    f = tf.extractfile(m)
    data = f.read() if f is not None else b""
    if len(data) != m.size:
        raise ValueError(f"{where}: member {m.name} is cut short ({len(data)} of {m.size} "
                         "bytes); the archive is incomplete -- download it again")
    return data


def _clean(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name


def _stem(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    for suf in _TAR_SUFFIXES:
        if base.lower().endswith(suf):
            return base[:-len(suf)]
    return base


class TarSource(Source):
    """Base of the tar kinds: walks each file's members from a cursor."""

    def events(self, cursor: Cursor) -> Iterator[tuple[Item | ClassSeen, Cursor]]:
        start_file = cursor[0] if cursor else 0
        self._pos = sum(self._file_sizes[:start_file])
        for k in range(start_file, len(self.files)):
            path = self.files[k]
            f, raw = _open_archive(path)
            self._direct = None if isinstance(f, gzip.GzipFile) else str(path)
            base = sum(self._file_sizes[:k])
            try:
                sub = cursor[1:] if cursor and k == start_file else []
                for ev, pos in self._file_events(k, f, sub, str(path)):
                    self._pos = base + raw.tell()
                    yield ev, [k, *pos]
            finally:
                f.close()
                raw.close()
            self._pos = base + self._file_sizes[k]

    def _file_events(self, k: int, f, sub: list, where: str):
        raise NotImplementedError

    def _item(self, name: str, label: int | str, tf: tarfile.TarFile, m: tarfile.TarInfo,
              where: str, base: int | None = 0) -> Item:
        """An item whose data is located (NOTE [ data by location ]) where the member is
        stored as is at ``base + m.offset_data`` of the file, else read now."""
        if self._direct is not None and base is not None and m.sparse is None:
            return Item(name, label, None, (self._direct, base + m.offset_data, m.size))
        return Item(name, label, _read(tf, m, where))


class TreeTar(TarSource):
    """A tar of a class-folder tree: ``[top/]class/.../image``; the class is the first
    folder (a single top folder named like the split or the archive is dropped)."""

    kind = "tree"

    def __init__(self, files, *, split: str = "", classes=None):
        super().__init__(files, classes=classes)
        self.split = split

    def _file_events(self, k, f, sub, where):
        tf = _tar_at(f, sub[0] if sub else 0, where)
        strip = None
        for m in _members(tf, where):
            name = _clean(m.name)
            parts = name.split("/")
            if not m.isfile() or not is_image_file(parts[-1]) or any(
                    p.startswith(".") for p in parts[1:-1]):
                continue
            if strip is None:
                strip = len(parts) >= 3 and parts[0] in (self.split, _stem(self.files[k].name))
            if strip:
                parts = parts[1:]
            if len(parts) < 2:
                raise ValueError(f"{where}: image {m.name} is not inside a class folder; a tar "
                                 "of a class tree holds class/image paths (for flat images "
                                 "give their labels with --val-labels)")
            yield self._item("/".join(parts), parts[0], tf, m, where), [tf.offset]


class TarOfTars(TarSource):
    """A tar of per-class tars (ImageNet train): the inner tar's name is the class, its
    images the class's; records are named ``class/image`` as in the extracted tree."""

    kind = "tar-of-tars"

    def _file_events(self, k, f, sub, where):
        outer = _tar_at(f, sub[0] if sub else 0, where)
        resume = sub[1] if len(sub) > 1 else None  # inside the inner tar at sub[0]
        for m in _members(outer, where):
            if not m.isfile() or not m.name.lower().endswith(_TAR_SUFFIXES):
                continue
            cls = _stem(_clean(m.name))
            after = outer.offset
            if resume is None:
                start = 0
                yield ClassSeen(cls), [m.offset, 0]
            else:
                start, resume = resume, None
            inner_where = f"{where}:{m.name}"
            inner, base = outer.extractfile(m), m.offset_data
            if m.name.lower().endswith((".gz", ".tgz")) or m.sparse is not None:
                inner, base = gzip.GzipFile(fileobj=inner, mode="rb"), None
            tf = _tar_at(inner, start, inner_where)
            for im in _members(tf, inner_where):
                name = _clean(im.name).rsplit("/", 1)[-1]
                if im.isfile() and is_image_file(name):
                    yield (self._item(f"{cls}/{name}", cls, tf, im, inner_where, base),
                           [m.offset, tf.offset])
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
        if not self.labels_file.is_file():
            raise FileNotFoundError(f"labels file {self.labels_file} does not exist")
        rows = (_devkit_rows(self.labels_file) if self.labels_file.name.lower().endswith(
            _TAR_SUFFIXES) else _read_label_lines(self.labels_file))
        if len(rows) > 1:
            tok = rows[0][2]  # a header such as "ImageId,PredictionString"
            if not (tok.isdigit() or (classes is not None and tok in classes)
                    or any(t == tok for _, _, t in rows[1:])):
                rows = rows[1:]
        self.label_of: dict[str, int | str] = {}
        for lineno, name, tok in rows:
            label: int | str = int(tok) if tok.isdigit() and not (
                classes is not None and tok in classes) else tok
            old = self.label_of.setdefault(name, label)
            if old != label:
                raise ValueError(f"{self.labels_file}:{lineno}: {name} is labelled twice, "
                                 "differently")

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
        tf = _tar_at(f, sub[0] if sub else 0, where)
        for m in _members(tf, where):
            name = _clean(m.name)
            base = name.rsplit("/", 1)[-1]
            if not m.isfile() or not is_image_file(base):
                continue
            label = self.label_of.get(base, self.label_of.get(os.path.splitext(base)[0]))
            if label is None:
                raise ValueError(f"{where}: image {name} has no line in {self.labels_file}; "
                                 "add its label (or use the labels file of this archive)")
            yield self._item(name, label, tf, m, where), [tf.offset]


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
        tf = _tar_at(f, sub[0] if sub else 0, where)
        shard = _stem(self.files[k].name)
        key, parts = None, {}
        for m in _members(tf, where):
            if not m.isfile():
                continue
            name = _clean(m.name)
            d, _, base = name.rpartition("/")
            mkey, _, ext = base.partition(".")
            mkey = f"{d}/{mkey}" if d else mkey
            if mkey != key:
                if key is not None:
                    yield self._sample(where, shard, key, parts), [m.offset]
                key, parts = mkey, {}
            ext = ext.lower()
            if ext in _LABEL_EXTS or is_image_file(base):
                parts[ext] = _read(tf, m, where)
        if key is not None:
            yield self._sample(where, shard, key, parts), [tf.offset]

    def _sample(self, where: str, shard: str, key: str, parts: dict) -> Item:
        images = [e for e in parts if e not in _LABEL_EXTS]
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


def _peek(path: Path, n: int = 32) -> list[tarfile.TarInfo]:
    f, raw = _open_archive(path)
    try:
        tf = _tar_at(f, 0, str(path))
        out = []
        for m in _members(tf, str(path)):
            if m.isfile():
                out.append(m)
            if len(out) >= n:
                break
        return out
    finally:
        f.close()
        raw.close()


def source_kind(path: str | Path, *, labels: bool = False) -> str:
    """``"lmdb"``, ``"tar-of-tars"``, ``"webdataset"``, ``"flat"`` or ``"tree"``, from the
    file's first members (ValueError for anything else)."""
    path = Path(path)
    if path.is_dir() or path.suffix in (".lmdb", ".mdb"):
        return "lmdb"
    members = _peek(path)
    names = [_clean(m.name) for m in members]
    if names and names[0].lower().endswith(_TAR_SUFFIXES):
        return "tar-of-tars"
    if any(n.rsplit("/", 1)[-1].partition(".")[2].lower() in _LABEL_EXTS for n in names):
        return "webdataset"
    images = [n for n in names if is_image_file(n.rsplit("/", 1)[-1])]
    if labels:
        return "flat"
    if images and "/" in images[0]:
        return "tree"
    raise ValueError(f"{path}: cannot tell how its images are labelled (first members: "
                     f"{names[:3]}); expected a tar of per-class tars, a tar of class "
                     "folders, webdataset shards (key.jpg + key.cls/.json), or flat images "
                     "with --val-labels FILE")


def open_source(files: Sequence[str | Path], *, split: str = "",
                labels_file: str | Path | None = None,
                classes: Sequence[str] | None = None) -> Source:
    """The source of one split's ``files`` (all of one kind; webdataset shards in the
    order given).  ``labels_file`` labels a flat tar; ``classes`` fixes the class list
    labels index into (give the train split's, so that val's labels agree)."""
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
    if kind == "lmdb":
        from .migrate import TensorpackLMDB

        return TensorpackLMDB(files, classes=classes)
    if kind == "flat":
        return FlatTar(files, labels_file, classes=classes)
    if kind == "tree":
        return TreeTar(files, split=split, classes=classes)
    return {"tar-of-tars": TarOfTars, "webdataset": WebDataset}[kind](files, classes=classes)
