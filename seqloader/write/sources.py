"""Stream sources: the labelled images of archives, read front to back once.

A source yields ``(event, cursor)`` pairs in a fixed order: an :class:`Item` (one
image: its record name, its class and its bytes) or a :class:`ClassSeen` (a class
that exists even if it has no image, e.g. an empty inner tar).  ``cursor`` is a small
JSON-serialisable position *after* that event; ``events(cursor)`` starts there, so a
killed pass resumes without reading what it had (NOTE [ stream cursors ]).

Kinds (see :func:`~seqloader.write.inputs.open_source`): a tar of a class-folder tree, a tar of per-class
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

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from .compressed import decompressed
from ..format.imagetree import is_image_file
from .tarwalk import STREAM_ERRORS, Walk
from ..errors import DamagedArchiveError, NotFoundError

__all__ = ["named_or_starts", "Item", "ClassSeen", "Source", "read_item", "read_at", "close_files", "READ_BUFFER",
           "TAR_SUFFIXES", "LABEL_EXTS", "open_archive", "tar_at", "tar_members", "read_member",
           "clean_name", "tar_stem", "first_files"]

#: Read-ahead of archive files: large requests keep a disk streaming (a 128 KB
#: request per seek would be ~10 % of an HDD's bandwidth).
READ_BUFFER = 16 << 20
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz",
                ".tar.zst", ".tzst")
LABEL_EXTS = ("cls", "json")


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
        raise DamagedArchiveError(f"{path}: damaged or cut short at byte {offset + len(data):,}"
                                  f": {len(data)} of the {size} bytes of a member at "
                                  f"{offset:,}; download or copy it again")
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
                raise NotFoundError(f"source {f} does not exist")
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


def open_archive(path: Path) -> tuple[io.IOBase, io.FileIO]:
    """(the tar's byte stream, the raw file under it) -- decompressed if gzip'd, bzip2'd,
    xz'd or zstd'd (NOTE [ compressed streams ]); the stream is the buffered raw file
    itself (a :class:`io.BufferedReader`) only when the tar is stored as is."""
    raw = io.FileIO(path, "rb")
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(raw.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    buffered = io.BufferedReader(raw, READ_BUFFER)
    try:
        return decompressed(buffered, str(path)), raw
    except BaseException:
        raw.close()
        raise


def tar_at(fileobj: io.IOBase, offset: int, where: str) -> tarfile.TarFile:
    """A TarFile reading headers from ``offset`` on (NOTE [ stream cursors ])."""
    try:
        fileobj.seek(offset)
        return tarfile.TarFile(fileobj=fileobj, mode="r")
    except STREAM_ERRORS as e:
        raise DamagedArchiveError(f"{where}: not a readable tar at byte {offset:,} ({e}); "
                                  "check that the download is complete (compare its size or "
                                  "checksum)") from None


def first_files(path: Path, n: int = 32, *, images: bool = False) -> list[tarfile.TarInfo]:
    """The first ``n`` file members of the tar ``path`` (only image files: ``images``),
    read from its start: what tells its kind and layout before it is read."""
    f, raw = open_archive(path)
    try:
        tf = tar_at(f, 0, str(path))
        out = []
        for m in tar_members(tf, str(path)):
            if m.isfile() and (not images or is_image_file(m.name.rsplit("/", 1)[-1])):
                out.append(m)
            if len(out) >= n:
                break
        return out
    finally:
        f.close()
        raw.close()


def tar_members(tf: tarfile.TarFile, where: str) -> Iterator[tarfile.TarInfo]:
    """The members of ``tf`` in order, the end proven (:class:`~.tarwalk.Walk`)."""
    return Walk(where).members(tf)


def read_member(tf: tarfile.TarFile, m: tarfile.TarInfo, walk: Walk) -> bytes:
    f = tf.extractfile(m)
    try:
        data = f.read() if f is not None else b""
    except STREAM_ERRORS as e:
        raise walk.damaged(m.offset_data, f"member {m.name}'s data cannot be read ({e})") from None
    if len(data) != m.size:
        raise walk.damaged(m.offset_data + len(data), f"member {m.name} is cut short "
                                                      f"({len(data)} of {m.size} bytes)")
    return data


def named_or_starts(path: str | Path, suffix: str, magics: tuple[bytes, ...]) -> bool:
    """Whether ``path``'s name ends with ``suffix`` (any case) or its first bytes start
    with one of ``magics``; an unreadable file is neither (the caller's open says why)."""
    path = Path(path)
    if path.suffix.lower() == suffix:
        return True
    try:
        with open(path, "rb") as f:
            return f.read(max(map(len, magics))).startswith(magics)
    except OSError:
        return False


def clean_name(name: str) -> str:
    """A member's path as extraction creates it, so that a tar made with ``tar -C dir .``
    (``./class/x.JPEG``, and a ``./`` entry for ``dir`` itself) gives the same classes as
    the extracted tree: no leading ``/``, no ``.`` or empty parts (``a/./b``, ``a//b`` are
    ``a/b``); ``""`` for the archive's own root entry (``.``, ``./``), which is no class.
    (Names with ``..`` are refused by :class:`~.tarwalk.Walk`.)"""
    return "/".join(p for p in name.split("/") if p not in ("", "."))


def tar_stem(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    for suf in TAR_SUFFIXES:
        if base.lower().endswith(suf):
            return base[:-len(suf)]
    return base
