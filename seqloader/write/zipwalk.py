"""Zip archives as stream sources: a zip of class folders (read as a tar of them), a zip
of a dataset folder (``[top/]train/<class>/...``, ``[top/]val/<class>/...``: one source
per split), and Kaggle's ``imagenet-object-localization-challenge.zip``.

NOTE [ reading a zip in order ]
A zip's member list is its central directory, at the end of the file: it is read
first, then the members in the order of their local headers' offsets -- the archive's
physical order, so the disk streams as it does for a tar -- through one large buffer.
Every member read is checked: its local header's signature and name against the
central directory's (a damaged header), its CRC-32 when its last byte is read
(damaged data) and its length (cut short).  Members of a known part of the layout
that the split does not read (Kaggle's test images, annotations, the other split) are
passed over unread; any other member's local header is read, so that a name damaged
in the central directory is never taken for a file to pass over.  The cursor is
``[file index, index of the next member in that order]``.

NOTE [ inflating ahead ]
Inflating a deflated member costs about as much CPU as reading it from a hard disk
(~150 MB/s a core): done in line, it would halve the rate at which pass 1 reads.  So
the reading thread reads each member's stored bytes in order and hands them to two
threads that inflate and check them (zlib releases the GIL); the events are yielded in
order, at most ``_WINDOW`` members behind the reads, so memory stays bounded and a
damaged member stops the run at its own place in the order.

NOTE [ Kaggle's ImageNet zip ]
``imagenet-object-localization-challenge.zip`` holds ``ILSVRC/Data/CLS-LOC/train/
<wnid>/*.JPEG`` (train), a flat ``ILSVRC/Data/CLS-LOC/val/`` labelled by
``LOC_val_solution.csv`` (``ImageId,PredictionString``: the first word of the
prediction is the WordNet id), ``test/`` (unlabelled) and the localization annotations.
``LOC_synset_mapping.txt`` (``wnid description`` lines, sorted by WordNet id as
ImageFolder sorts the train folders) is the class list: label ``i`` is its line ``i``.
Both splits come from one command; val's labels are checked against its images from
the central directory before anything is written.
"""
from __future__ import annotations

import collections
import csv
import functools
import hashlib
import io
import os
import struct
import warnings
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import DamagedArchiveError, FormatError
from ..format.imagetree import is_image_file
from .sources import (READ_BUFFER, ClassSeen, Cursor, Item, Source, clean_name,
                      named_or_starts)

__all__ = ["ZipSource", "is_zip", "zip_splits", "KAGGLE_MAPPING", "KAGGLE_VAL"]

KAGGLE_MAPPING = "LOC_synset_mapping.txt"
KAGGLE_VAL = "LOC_val_solution.csv"
_KAGGLE_DATA = "ILSVRC/Data/CLS-LOC/"
_SPLITS = ("train", "val")
_AHEAD = 32 << 20
_WINDOW = 32  # members read ahead of the consumer, their inflating in flight
#: What zipfile raises on a damaged central directory.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, struct.error, ValueError,
               NotImplementedError, RuntimeError)


def is_zip(path: str | Path) -> bool:
    """Whether ``path`` is a zip by name (``.zip``) or by its first bytes."""
    return named_or_starts(path, ".zip", (b"PK\x03\x04", b"PK\x05\x06"))


def _damaged(where: str, offset: int | None, what: str) -> DamagedArchiveError:
    at = f" at byte {offset:,}" if offset is not None else ""
    return DamagedArchiveError(f"{where}: damaged or cut short{at}: {what}; download or copy "
                               "it again (`unzip -t` shows the damage)")


def _open_zip(path: Path, fileobj) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(fileobj)
    except _ZIP_ERRORS as e:
        raise _damaged(str(path), None, "no readable central directory at its end (missing "
                       f"central directory: {e}); the download is incomplete, or this is not "
                       "a zip") from None


def _listing(path: Path) -> list[zipfile.ZipInfo]:
    """The members of ``path`` in physical order (NOTE [ reading a zip in order ])."""
    st = path.stat()
    return _cached_listing(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)  # (the splits of one zip are opened one after the other)
def _cached_listing(path: str, size: int, mtime: int) -> list[zipfile.ZipInfo]:
    path = Path(path)
    with open(path, "rb") as f:
        zf = _open_zip(path, f)
        infos = zf.infolist()
        zf.close()
    for info in infos:
        if ".." in info.filename.replace("\\", "/").split("/"):
            raise FormatError(f"{path}: member {info.filename} has a '..' in its path "
                              "(extraction refuses it); rebuild the zip with paths relative "
                              "to its top folder")
    return sorted(infos, key=lambda i: i.header_offset)


_LOCAL = struct.Struct("<4s2B4HL2L2H")  # a local file header (zipfile's structFileHeader)
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate",
            zipfile.ZIP_BZIP2: "bzip2"}


def _stored_bytes(f, info: zipfile.ZipInfo, where: str, data: bool = True) -> bytes:
    """The bytes of ``info`` as stored (compressed), its local header checked first
    against the central directory (NOTE [ reading a zip in order ]); ``data=False``: the
    header only."""
    def bad(what: str) -> DamagedArchiveError:
        return _damaged(where, info.header_offset, f"{what} (member {info.filename})")

    f.seek(info.header_offset)
    head = f.read(_LOCAL.size)
    if len(head) != _LOCAL.size:
        raise bad("the file ends inside a local header (truncated member)")
    sig, _, _, flags, method, _, _, _, _, _, n_name, n_extra = _LOCAL.unpack(head)
    name = f.read(n_name)
    if sig != b"PK\x03\x04":
        raise bad("bad local header (no local header signature)")
    if name.decode("utf-8" if flags & 0x800 else "cp437", "replace") != info.orig_filename:
        raise bad(f"bad local header (its name {name[:80]!r} is not the central directory's)")
    if info.flag_bits & 1:
        raise bad("an encrypted member (not supported: extract the zip with its password)")
    if info.compress_type not in _METHODS:
        raise bad(f"compression method {info.compress_type} (not supported: re-zip it with "
                  "deflate, or extract it)")
    if not data:
        return b""
    f.seek(n_extra, 1)
    out = f.read(info.compress_size)
    if len(out) != info.compress_size:
        raise bad(f"the file ends after {len(out)} of its {info.compress_size} bytes "
                  "(truncated member)")
    return out


def _unpacked(stored: bytes, info: zipfile.ZipInfo, where: str) -> bytes:
    """``stored`` decompressed, its length and CRC-32 checked (in a thread: zlib and bz2
    release the GIL)."""
    try:
        if info.compress_type == zipfile.ZIP_DEFLATED:
            d = zlib.decompressobj(-15)
            out = d.decompress(stored) + d.flush()
            complete = d.eof
        elif info.compress_type == zipfile.ZIP_BZIP2:
            import bz2

            d = bz2.BZ2Decompressor()
            out, complete = d.decompress(stored), d.eof
        else:
            out, complete = stored, True
    except (zlib.error, OSError, ValueError) as e:
        raise _damaged(where, info.header_offset, f"member {info.filename}'s "
                       f"{_METHODS[info.compress_type]} data is damaged ({e})") from None
    if not complete or len(out) != info.file_size:
        raise _damaged(where, info.header_offset, f"member {info.filename} holds {len(out)} of "
                       f"its {info.file_size} bytes (truncated member)")
    if zlib.crc32(out) != info.CRC:
        raise _damaged(where, info.header_offset, f"CRC mismatch in member {info.filename} "
                       f"(CRC-32 {zlib.crc32(out):08x}, the central directory says "
                       f"{info.CRC:08x})")
    return out


@dataclass(frozen=True)
class _Layout:
    """What a zip holds: ``kind`` "kaggle", "dataset" (split folders under ``root``) or
    "tree" (class folders under ``root``); ``splits`` the splits it holds."""

    kind: str
    root: str
    splits: tuple[str, ...]


def _layout(names: list[str], stem: str, split: str) -> _Layout:
    files = [n for n in names if n and not n.endswith("/")]
    for n in files:
        if n.rsplit("/", 1)[-1] == KAGGLE_MAPPING:
            root = n[:-len(KAGGLE_MAPPING)]
            data = root + _KAGGLE_DATA
            if any(m.startswith(data) for m in files):
                splits = [s for s in _SPLITS if any(m.startswith(f"{data}{s}/") for m in files)]
                if "val" in splits and root + KAGGLE_VAL not in files:
                    splits.remove("val")
                return _Layout("kaggle", root, tuple(splits))
    images = [n for n in files if is_image_file(n.rsplit("/", 1)[-1])]
    tops = {n.split("/", 1)[0] for n in images if "/" in n}
    roots = [""] + ([f"{tops.pop()}/"] if len(tops) == 1 else [])
    for root in roots:  # (a dataset folder, zipped as itself or as its contents)
        found = tuple(s for s in _SPLITS if any(n.startswith(f"{root}{s}/") and n.count("/")
                                                >= root.count("/") + 2 for n in images))
        if found:
            return _Layout("dataset", root, found)
    top = roots[-1]
    if top and top[:-1] in (split, stem) and all(n.count("/") >= 2 for n in images):
        return _Layout("tree", top, (split,))  # (a class tree zipped with its folder)
    return _Layout("tree", "", (split,))


def zip_splits(path: str | Path, split: str | None, default: str | None) -> list[str]:
    """The splits ``path`` holds (a Kaggle zip or a dataset folder: those present;
    ``split``: that one alone); ``default`` is the split a zip of class folders holds."""
    path = Path(path)
    names = [clean_name(i.filename) + ("/" if i.is_dir() else "") for i in _listing(path)]
    layout = _layout(names, _stem(path), split or default or "")
    if layout.kind == "dataset":  # (a flat split folder is not a class tree: said, not lost)
        depth = layout.root.count("/") + 1
        flat = [s for s in _SPLITS if s not in layout.splits and any(
            n.startswith(f"{layout.root}{s}/") and n.count("/") == depth and
            is_image_file(n.rsplit("/", 1)[-1]) for n in names)]
        if flat:
            warnings.warn(f"{path}: {layout.root}{flat[0]}/ holds images without class "
                          "folders and is not written; extract it and preprocess it with "
                          "--val-labels FILE", stacklevel=2)
    if layout.kind == "tree":
        if not (split or default):
            raise ValueError(f"cannot tell the split of {path} from its name; name it with "
                             "--split (e.g. --split train)")
        return [split or default]
    if split is not None and split not in layout.splits:
        raise ValueError(f"{path} holds the split(s) {list(layout.splits)}, not {split!r}; "
                         f"give --split {layout.splits[0] if layout.splits else 'train'}")
    if not layout.splits:
        raise ValueError(f"{path}: a {layout.kind} layout with no train/ or val/ images")
    return [split] if split is not None else list(layout.splits)


def _stem(path: Path) -> str:
    return path.name[:-4] if path.name.lower().endswith(".zip") else path.stem


class _Plan:
    """What one zip gives one split: :meth:`action` of each member."""

    def __init__(self, path: Path, infos: list[zipfile.ZipInfo], split: str, classes):
        self.path, self.split = path, split
        names = [clean_name(i.filename) + ("/" if i.is_dir() else "") for i in infos]
        self.layout = _layout(names, _stem(path), split)
        lay = self.layout
        self.label_of: dict[str, str] | None = None
        self.classes: list[str] | None = None
        self.digest = b""
        if lay.kind == "kaggle":
            self.region = f"{lay.root}{_KAGGLE_DATA}{split}/"
            self.known = (f"{lay.root}ILSVRC/", f"{lay.root}LOC_")
            self._kaggle(infos, names, classes)
        else:
            self.region = f"{lay.root}{split}/" if lay.kind == "dataset" else lay.root
            self.known = tuple(f"{lay.root}{s}/" for s in _SPLITS if s != split
                               ) if lay.kind == "dataset" else ()

    def _kaggle(self, infos, names, classes) -> None:
        """NOTE [ Kaggle's ImageNet zip ]: the class list and val's labels, checked."""
        root, where = self.layout.root, str(self.path)
        def member(name: str) -> bytes:
            info = infos[names.index(name)]
            return _unpacked(_stored_bytes(f, info, where), info, where)

        with open(self.path, "rb") as f:
            mapping = member(root + KAGGLE_MAPPING)
            csv_bytes = member(root + KAGGLE_VAL) if self.split != "train" else b""
        wnids = [ln.split()[0] for ln in mapping.decode("utf-8", "replace").splitlines()
                 if ln.strip()]
        self.classes = list(classes) if classes is not None else wnids
        self.digest = hashlib.blake2b(mapping, digest_size=16).digest()
        known = set(self.classes)
        images = [n[len(self.region):] for n in names
                  if n.startswith(self.region) and is_image_file(n.rsplit("/", 1)[-1])]
        if self.split == "train":
            bad = sorted({n.split("/", 1)[0] for n in images if "/" in n} - known)
            if bad:
                raise ValueError(f"{where}: train folder(s) {bad[:3]} are not in its "
                                 f"{KAGGLE_MAPPING} ({len(known)} classes); is the zip complete?")
            return
        self.digest += hashlib.blake2b(csv_bytes, digest_size=16).digest()
        self.label_of = {}
        rows = csv.reader(io.StringIO(csv_bytes.decode("utf-8-sig", "replace")))
        for lineno, row in enumerate(rows, 1):
            if not row or (lineno == 1 and row[0] == "ImageId"):
                continue
            wnid = row[1].split()[0] if len(row) > 1 and row[1].split() else ""
            if wnid not in known:
                raise ValueError(f"{where}:{KAGGLE_VAL}:{lineno}: class {wnid!r} is not one of "
                                 f"the {len(known)} classes of {KAGGLE_MAPPING}; is the zip "
                                 "complete?")
            self.label_of[row[0]] = wnid
        stems = {os.path.splitext(n)[0] for n in images}
        lost = sorted(set(self.label_of) - stems)
        unlabelled = sorted(n for n in images if os.path.splitext(n)[0] not in self.label_of)
        if lost or unlabelled:
            raise ValueError(f"{where}: {KAGGLE_VAL} and {self.region} disagree: "
                             f"{len(unlabelled)} image(s) without a line (e.g. {unlabelled[:2]})"
                             f", {len(lost)} line(s) without an image (e.g. {lost[:2]})")

    def action(self, name: str, is_dir: bool) -> tuple[str, str, str]:
        """``("read", record name, class)``, ``("class", "", class)`` (a class folder),
        ``("check", "", "")`` (local header only) or ``("skip", "", "")``."""
        if not name.startswith(self.region):
            return ("skip", "", "") if name.startswith(self.known) or not name else (
                "check", "", "")
        parts = name[len(self.region):].rstrip("/").split("/")
        if not parts[0]:
            return "skip", "", ""
        if is_dir:
            if len(parts) == 1 and self.label_of is None:
                return "class", "", parts[0]
            return "skip", "", ""
        if not is_image_file(parts[-1]):
            return "check", "", ""
        if self.label_of is not None:  # Kaggle's flat val
            if len(parts) != 1:
                return "check", "", ""
            return "read", parts[0], self.label_of[os.path.splitext(parts[0])[0]]
        if len(parts) < 2 or any(p.startswith(".") for p in parts[1:-1]):
            return "check", "", ""  # (a stray top-level file, a hidden folder: as the tree)
        return "read", "/".join(parts), parts[0]


class ZipSource(Source):
    """The images of one split of zip files (NOTE [ reading a zip in order ]); labels by
    the layout's rule: a class folder's name, or Kaggle's val CSV (NOTE [ Kaggle's
    ImageNet zip ]), whose mapping file also fixes the class list."""

    kind = "zip"

    def __init__(self, files: Sequence[str | Path], *, split: str,
                 classes: Sequence[str] | None = None):
        super().__init__(files, classes=classes)
        self.split = split
        self._plans = [_Plan(f, _listing(f), split, classes) for f in self.files]
        fixed = [p.classes for p in self._plans if p.classes is not None]
        if fixed and self.classes is None:
            self.classes = fixed[0]
        kaggle = [p for p in self._plans if p.layout.kind == "kaggle"]
        if kaggle:
            warnings.warn(f"{kaggle[0].path.name}: Kaggle's ImageNet layout: train and val "
                          "are read; test/ (unlabelled) and the annotations (ILSVRC/Annotations,"
                          " ImageSets, LOC_train_solution.csv) are skipped", stacklevel=2)

    def identity(self) -> str:
        return super().identity() + repr((self.split, [
            (p.layout, p.digest.hex()) for p in self._plans]))

    def events(self, cursor: Cursor) -> Iterator[tuple[Item | ClassSeen, Cursor]]:
        start_file = cursor[0] if cursor else 0
        for k in range(start_file, len(self.files)):
            path, plan = self.files[k], self._plans[k]
            base = sum(self._file_sizes[:k])
            raw = io.FileIO(path, "rb")
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(raw.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            f = io.BufferedReader(raw, READ_BUFFER)
            # NOTE [ inflating ahead ]: deflated members are read here, in order, and
            # inflated (and checked) by two threads, _WINDOW members ahead of the consumer
            pool = ThreadPoolExecutor(2, thread_name_prefix="seqloader-inflate")
            queue: collections.deque = collections.deque()
            try:
                infos = _listing(path)
                ahead = 0
                for i in range(cursor[1] if cursor and k == start_file else 0, len(infos)):
                    info = infos[i]
                    what, name, label = plan.action(clean_name(info.filename), info.is_dir())
                    if what == "skip":
                        continue
                    here = info.header_offset
                    if here >= ahead and hasattr(os, "posix_fadvise"):
                        # (as for a tar: keep the disk reading while this process works)
                        os.posix_fadvise(raw.fileno(), here, 2 * _AHEAD, os.POSIX_FADV_WILLNEED)
                        ahead = here + _AHEAD
                    if what == "check":
                        _stored_bytes(f, info, str(path), data=False)
                        continue
                    if what == "class":
                        queue.append((ClassSeen(label), None, [k, i + 1], here))
                    else:
                        stored = _stored_bytes(f, info, str(path))
                        job = (pool.submit(_unpacked, stored, info, str(path))
                               if info.compress_type != zipfile.ZIP_STORED
                               else _unpacked(stored, info, str(path)))
                        queue.append((name, label, [k, i + 1], job, here))
                    while len(queue) > _WINDOW:
                        yield self._done(queue.popleft(), base)
                while queue:
                    yield self._done(queue.popleft(), base)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
                f.close()
            self._pos = base + self._file_sizes[k]

    def _done(self, entry: tuple, base: int) -> tuple[Item | ClassSeen, Cursor]:
        """The event of a queued member, its data inflated (NOTE [ inflating ahead ])."""
        if len(entry) == 4:
            ev, _, cur, here = entry
        else:
            name, label, cur, job, here = entry
            ev = Item(name, label, job if isinstance(job, bytes) else job.result())
        self._pos = base + here
        return ev, cur
