"""``export``: a database back to a class-folder tree, or to webdataset tar shards.

NOTE [ export ]
Images are written as stored (the bytes the database holds: the source file's, or
what the writer re-encoded; stored pixels become lossless PNGs), in the database's
order, one sequential pass.  A tree gets ``<out>/<split>/<class>/<file>``: the file
name the record stores (its path below the split folder, as preprocess stored it), or
``<split>_<index>.jpg`` for records without one; every class gets its folder, empty
or not, so ``preprocess`` of the tree gives the same labels.  Webdataset shards
``<out>/<split>-NNNNNN.tar`` hold ``<key>.jpg`` and ``<key>.cls`` (the label) or
``<key>.json`` (``{"label", "class", "path"}``, or ``{"target"}`` for databases of
other targets), key = the record's index; ``<out>/<split>-classes.txt`` lists the
class names in label order (``preprocess --class-names`` reads it back).  Everything
is written into ``<out>.partial`` and renamed to ``<out>`` when complete: a crash
leaves only the ``.partial`` folder, which the next run discards and redoes.
"""
from __future__ import annotations

import json
import os
import posixpath
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import msgpack
import numpy as np

from ...progress import progress_bar
from ...errors import FormatError, OutputError, OutputExistsError
from ...format.records import IMAGE_HEAD, Record, image_span, unpack_record
from ...format.targets import decode_target
from ...read.database import Database, open_database
from ...read.database import path_splits
from ...write.overlap import refuse_overlap
from .stream import RecordStream, Selection

__all__ = ["export", "ExportReport", "EXPORT_FORMATS", "tree_name", "stored_record",
           "DEFAULT_SHARD_BYTES", "MARKER"]

EXPORT_FORMATS = ("tree", "webdataset")
DEFAULT_SHARD_BYTES = 1 << 30


#: The file in an export's folder that records what it holds (NOTE [ export identity ]).
MARKER = ".seqloader-export.json"

# NOTE [ export identity ]
# A finished export holds MARKER: the identity of what was exported (each source file's
# fingerprint and checksum, the splits, the format, targets and shard size) and its
# reports.  Re-running the same export finds the same identity and reports "already
# complete" (as reshard, subset and merge skip finished files); a different one is
# refused without --overwrite.  It is a dot file at the top of the folder, beside the
# split folders or tar shards, where neither preprocess nor webdataset looks.


@dataclass
class ExportReport:
    split: str
    num_records: int
    files: int
    bytes: int
    #: True when a finished export of the same identity was found (nothing written)
    already: bool = False


def _identity(dbs: list[Database], to: str, targets: str, shard_bytes: int) -> dict:
    return {"sources": [[db.split, [[m.fingerprint, m.checksum] for m in db.metas]]
                        for db in dbs],
            "format": to, "targets": targets, "shard_bytes": shard_bytes}


def _finished(out: Path, identity: dict) -> list[ExportReport] | None:
    """The reports of the finished export at ``out`` if it has ``identity``."""
    try:
        doc = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("identity") != identity:
        return None
    return [ExportReport(**r, already=True) for r in doc.get("reports", [])]


def tree_name(rec: Record, index: int, split: str, class_name: str, ext: str = ".jpg") -> str:
    """Where record ``index`` goes below ``<out>/<split>`` (NOTE [ export ]): its stored
    path if that lies in its class folder, else its file name (or ``<split>_<index>``)
    in the class folder; never outside it (``..`` and absolute parts are dropped)."""
    parts = [p for p in (rec.path or "").replace("\\", "/").split("/") if p not in ("", ".", "..")]
    if rec.shape is not None:  # stored pixels: a PNG of them
        parts = parts[:-1] + [posixpath.splitext(parts[-1])[0] + ".png"] if parts else []
        ext = ".png"
    if len(parts) > 1 and parts[0] == class_name:
        return "/".join(parts)
    return f"{class_name}/{parts[-1] if parts else f'{split}_{index:08d}{ext}'}"


def stored_record(value: bytes | memoryview, where: str) -> Record:
    """The record ``value`` with ``image`` a view of its bytes (NOTE [ record layout ]: the
    image comes first; the fields after it are unpacked, the image is not copied); any
    other layout is unpacked whole."""
    mv = memoryview(value)
    span = image_span(mv[:IMAGE_HEAD], len(mv))
    if span is None:
        return unpack_record(value, where=where)
    up = msgpack.Unpacker(raw=False)
    up.feed(mv[span[1]:])
    try:
        d = dict((up.unpack(), up.unpack()) for _ in range((mv[0] & 0x0F) - 1))
    except Exception:  # (msgpack raises several types) -- the full check names the fault
        return unpack_record(value, where=where)
    if not isinstance(d.get("label", -1), int):
        return unpack_record(value, where=where)
    shape = tuple(d["shape"]) if "shape" in d else None
    if shape is not None and (len(shape) != 3 or span[1] - span[0] != shape[0] * shape[1] * 3):
        return unpack_record(value, where=where)
    return Record(mv[span[0]:span[1]], d.get("label", -1), d.get("path"), d.get("reencoded"),
                  target=decode_target(d["target"], where) if "target" in d else None,
                  shape=shape)


def _image(rec: Record) -> bytes | memoryview:
    if rec.shape is None:
        return rec.image
    rgb = np.frombuffer(rec.image, np.uint8).reshape(rec.shape)
    ok, png = cv2.imencode(".png", np.ascontiguousarray(rgb[:, :, ::-1]))
    if not ok:  # pragma: no cover - PNG encoding of uint8 pixels does not fail
        raise RuntimeError("OpenCV could not encode a PNG")
    return png.tobytes()


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


class _Tars:
    """Webdataset shards of one split, each closed once past ``shard_bytes``: ustar
    members written straight from the records' bytes (as :mod:`tarfile` writes them,
    without its 16 KiB copies)."""

    def __init__(self, folder: Path, split: str, shard_bytes: int):
        self.folder, self.split, self.shard_bytes = folder, split, shard_bytes
        self.f = None
        self.count = self.size = 0

    def add(self, files: list[tuple[str, bytes | memoryview]]) -> None:
        if self.f is None or self.size >= self.shard_bytes:
            self.close()
            self.f = open(self.folder / f"{self.split}-{self.count:06d}.tar", "wb",
                          buffering=1 << 20)
            self.count += 1
            self.size = 0
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            self.f.write(info.tobuf(tarfile.USTAR_FORMAT))
            self.f.write(data)
            self.f.write(b"\0" * (-len(data) % tarfile.BLOCKSIZE))
            self.size += tarfile.BLOCKSIZE + len(data) + (-len(data) % tarfile.BLOCKSIZE)

    def close(self) -> None:
        if self.f is not None:
            end = 2 * tarfile.BLOCKSIZE  # two zero blocks, padded to a whole record
            self.f.write(b"\0" * (end + (-(self.size + end) % tarfile.RECORDSIZE)))
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            self.f = None


def _export_split(db: Database, staging: Path, to: str, targets: str, shard_bytes: int,
                  progress: bool) -> ExportReport:
    kind = db.metas[0].target_kind
    if to == "tree" and kind != "class":
        raise ValueError(f"{db.paths[0]}: its targets are not classes, so it has no class "
                         "folders; export it as --format webdataset (with .json targets)")
    classes, split = db.classes, db.split
    stream = RecordStream([Selection(db, np.arange(db.num_records))])
    tars = _Tars(staging, split, shard_bytes) if to == "webdataset" else None
    if to == "tree":
        for c in classes:
            (staging / split / c).mkdir(parents=True, exist_ok=True)
    else:
        (staging / f"{split}-classes.txt").write_text("".join(f"{c}\n" for c in classes))
    nbytes = 0
    bar = progress_bar(total=db.num_records, unit="rec", desc=f"export {split}",
                       progress=progress, dynamic_ncols=True, smoothing=0.05)
    try:
        for i, value in enumerate(stream(0, db.num_records)):
            rec = stored_record(value, f"{db.paths[0]} record {i}")
            image = _image(rec)
            nbytes += len(image)
            if tars is None:
                dest = staging / split / tree_name(rec, i, split, classes[rec.label])
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(dest, "xb") as f:  # ("x": two records of one name are an error)
                    f.write(image)
            else:
                key = f"{i:08d}"
                ext = "png" if rec.shape is not None else "jpg"
                if kind != "class":
                    target = ("json", json.dumps({"target": _jsonable(rec.target)}).encode())
                elif targets == "cls":
                    target = ("cls", str(rec.label).encode())
                else:
                    target = ("json", json.dumps({"label": rec.label, "class": classes[rec.label],
                                                  "path": rec.path}).encode())
                tars.add([(f"{key}.{ext}", image), (f"{key}.{target[0]}", target[1])])
            bar.update(1)
    except FileExistsError as e:
        raise FormatError(f"{e.filename}: two records store this file name; export to "
                          "webdataset instead (its keys are record indices)") from None
    finally:
        bar.close()
        stream.close()
        if tars is not None:
            tars.close()
    return ExportReport(split, db.num_records, tars.count if tars else db.num_records, nbytes)


def export(path: str | Path, out: str | Path, *, to: str = "tree", split: str | None = None,
           targets: str = "cls", shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False,
           progress: bool = True) -> list[ExportReport]:
    """Export every split at ``path`` (or ``split``) to the folder ``out``, as a class
    tree (``to="tree"``) or webdataset shards (``"webdataset"``, ``targets`` ``"cls"``
    or ``"json"``, a new shard after ``shard_bytes``): NOTE [ export ]."""
    if to not in EXPORT_FORMATS:
        raise ValueError(f"--format {to!r}: use one of {', '.join(EXPORT_FORMATS)}")
    if targets not in ("cls", "json"):
        raise ValueError(f"--targets {targets!r}: use cls or json")
    if shard_bytes <= 0:
        raise ValueError(f"--shard-size must be positive, got {shard_bytes}")
    out = Path(out)
    dbs = [open_database(path, s) for s in path_splits(path, split)]
    whole = Path(os.path.abspath(out))  # (an output of ".": its name is the folder's)
    staging = whole.with_name(whole.name + ".partial")
    for where in (out, staging):  # (NOTE [ outputs apart from inputs ]: --overwrite removes it)
        refuse_overlap([p for db in dbs for p in db.paths], where)
    identity = _identity(dbs, to, targets, shard_bytes)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not overwrite:
        done = _finished(out, identity) if out.is_dir() else None
        if done is not None:
            return done
        raise OutputExistsError(f"{out} already exists and is not this export's output; pass "
                                "--overwrite to replace it, or choose another output folder")
    try:
        if staging.exists():  # an interrupted export's: redone
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
    except OSError as e:
        raise OutputError(f"cannot create the export's folder {staging} ({e.strerror}); name "
                          "an output folder in a place you can write to") from None
    reports = [_export_split(db, staging, to, targets, shard_bytes, progress) for db in dbs]
    (staging / MARKER).write_text(json.dumps(
        {"identity": identity,
         "reports": [{k: v for k, v in vars(r).items() if k != "already"} for r in reports]}))
    os.sync()  # (the files' data on disk before the rename publishes them)
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    os.replace(staging, out)
    return reports
