"""Write any PyTorch-style dataset of ``(image, target)`` samples into a seqloader database.

NOTE [ writing a dataset ]
A **map-style** dataset (``__len__`` and ``__getitem__``) is written like an image
folder: in a seeded permutation of its indices (:func:`~seqloader.write.writer.write_order`),
prepared by forked worker processes (``dataset[i]``, then the image checked or encoded
and the record packed: :mod:`seqloader.write.samples`), committed by the same resumable
shard writer -- after Ctrl-C or ``kill -9`` the same call continues where it stopped
and writes the bytes an uninterrupted run writes, *provided the dataset gives the same
samples again*: the resume check (the fingerprint) covers the dataset's type, length
and the options, not its contents.  An **iterable** dataset is read once, in order,
into a spill file beside the output (pass 1: records prepared by worker processes),
then written from it in the permuted order (pass 2) and the spill removed; an
interrupted write reads the dataset again (pass 1 cannot seek into an iterator) and,
if it gave the same records, finishes pass 2 where it stopped.  The spill is read
back by random reads: put it (``scratch``) on an SSD or in the page cache.

A sample whose image bytes no decoder reads, or whose ``dataset[i]`` raises, is
skipped and reported (``<file>.bad-files.tsv``, as ``sample <index>``); a target or
image of a kind that cannot be stored is an error (a mistake in the dataset).
``target_kind="auto"`` is ``"class"`` when the first sample's target is an int
(then all must be class indices), else ``"any"``; for ``"class"`` the class names are
``classes``, else the dataset's ``classes`` attribute (torchvision's), else
``"0".."max"``.  The class labels are kept in memory while writing (4 bytes each);
after a resume they are read back from the records already written.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import lmdb
import msgpack
import numpy as np

from ..progress import progress_bar
from ..workers.processmap import process_map
from ..format.meta import Meta
from ..format.files import db_name
from ..format.keys import encode_key
from ..format.meta import file_version
from ..format.checksum import record_digest
from ..format.targets import is_class_label
from ..format.imagesize import DEFAULT_MAX_PIXELS
from .outfiles import remove_db, report_path
from .samples import SampleOptions, prepare_sample
from .shardwriter import existing_result, ShardWriter
from ..errors import BadImageError, NoRecordsError, OutputExistsError
from .options import ShardResult, WriteOptions, WriteReport, write_order
from .writer import no_records_message

__all__ = ["write_dataset"]


class _Names:
    """The names of samples in bad-file reports: ``sample <index>``."""

    def __init__(self, n: int, ids: np.ndarray | None = None):
        self.n, self.ids = n, ids

    def __getitem__(self, i: int) -> str:
        return f"sample {int(self.ids[i]) if self.ids is not None else int(i)}"

    def __len__(self) -> int:
        return self.n


class _Scan:
    """What the shard writer asks of a scan, for a dataset."""

    def __init__(self, names: _Names, classes: Sequence[str]):
        self.paths, self.classes = names, list(classes)
        self.root = Path("<dataset>")

    def __len__(self) -> int:
        return len(self.paths)


_CTX: dict[str, Any] = {}  # what forked workers prepare from (set before they fork)


def _prepare_index(pos_i: tuple[int, int]) -> tuple:
    """(position, *Prepared) of ``dataset[i]`` (in a worker: the dataset came by fork)."""
    pos, i = pos_i
    where = f"dataset[{i}]"
    try:
        sample = _CTX["dataset"][i]
    except Exception as e:  # one sample the dataset cannot give: a bad sample
        return (pos, None, f"{where} raised {type(e).__name__}: {e}", None, -1)
    return (pos, *prepare_sample(sample, where, _CTX["opt"]))


def _prepare_item(pos_sample: tuple[int, Any]) -> tuple:
    pos, sample = pos_sample
    return (pos, *prepare_sample(sample, f"sample {pos}", _CTX["opt"]))


class _DatasetWriter(ShardWriter):
    """The shard writer fed by a dataset (or a spill file) instead of image files."""

    def __init__(self, fetch: Any, n: int, split: str, order: np.ndarray, final: Path,
                 fingerprint: str, opt: WriteOptions, sopt: SampleOptions,
                 classes: list[str] | None):
        super().__init__(_Scan(_Names(n), classes or []), split, order, final, 0, fingerprint, opt)
        self.fetch, self.sopt, self.classes = fetch, sopt, classes
        self.collected: list[int] = []  # class labels of the records, in record order

    def _load_or_start(self, env: lmdb.Environment) -> Meta:
        meta = super()._load_or_start(env)
        meta.target_kind = self.sopt.target_kind
        meta.version = file_version(self.sopt.target_kind, self.sopt.image_format)
        meta.writer["dataset"] = True
        return meta

    def _prepared(self, positions: range):
        """Prepared records of ``positions`` (4-tuples, as the base writer takes them);
        class labels are collected on the way, before each record is counted."""
        for pos, value, digest, warned, label in self.fetch(positions, self.order):
            if value is not None and self.sopt.target_kind == "class":
                self.collected.append(label)
            yield pos, value, digest, warned

    def _write_records(self, env: lmdb.Environment, meta: Meta, start: int, stop: int) -> None:
        if meta.num_records and self.sopt.target_kind == "class":  # resumed: read them back
            with env.begin() as txn:
                self.collected = [msgpack.unpackb(txn.get(encode_key(k)), raw=False)["label"]
                                  for k in range(meta.num_records)]
        super()._write_records(env, meta, start, stop)

    def _labels(self, start: int, stop: int, meta: Meta) -> bytes:
        if self.sopt.target_kind != "class":
            return b""
        labels = np.asarray(self.collected, np.int64)
        if len(labels) != meta.num_records:  # pragma: no cover - invariant
            raise AssertionError(f"{len(labels)} labels for {meta.num_records} records")
        if self.classes is None:  # "0".."max", known only now
            meta.classes = [str(c) for c in range(int(labels.max(initial=-1)) + 1)]
        return labels.astype("<i4").tobytes()


def _fetch_map(dataset: Any, workers: int):
    def fetch(positions: range, order: np.ndarray):
        items = ((pos, int(order[pos])) for pos in positions)
        if workers > 1 and hasattr(os, "fork"):
            return process_map(_prepare_index, items, workers=workers)
        return map(_prepare_index, items)
    return fetch


class _Spill:
    """Pass 1 of an iterable dataset: its records (or bad-sample reasons) appended to a
    file in iteration order; pass 2 reads them back by index (NOTE [ writing a dataset ])."""

    def __init__(self, path: Path):
        self.path = path
        self.entries: list[tuple[int, int, str | None, str | None, int]] = []
        self.digest = hashlib.blake2b(digest_size=16)

    def fill(self, dataset: Iterable, workers: int, progress: bool, split: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        it = enumerate(dataset)
        prepared = (process_map(_prepare_item, it, workers=workers)
                    if workers > 1 and hasattr(os, "fork") else map(_prepare_item, it))
        with open(self.path, "wb") as f, progress_bar(unit="img", desc=f"{split} (read)",
                                                      progress=progress,
                                                      dynamic_ncols=True) as bar:
            for pos, value, digest_or_why, warned, label in prepared:
                if value is None:
                    self.entries.append((0, 0, str(digest_or_why), None, -1))
                    self.digest.update(f"bad {digest_or_why}\n".encode())
                else:
                    self.entries.append((f.tell(), len(value), None, warned, int(label)))
                    f.write(value)
                    self.digest.update(digest_or_why)
                bar.update(1)

    def fetch(self, positions: range, order: np.ndarray):
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for pos in positions:
                off, size, why, warned, label = self.entries[int(order[pos])]
                if why is not None:
                    yield pos, None, why, None, -1
                    continue
                value = os.pread(fd, size, off)
                if len(value) != size:
                    raise OSError(f"{self.path}: short read at {off}; the spill file changed "
                                  "while it was being written from")
                yield pos, value, record_digest(value), warned, label
        finally:
            os.close(fd)


def _kind_of(first: Any, target_kind: str, sopt: SampleOptions) -> str:
    if target_kind not in ("auto", "class", "any"):
        raise ValueError(f"target_kind={target_kind!r}: use 'auto', 'class' or 'any'")
    if target_kind != "auto":
        return target_kind
    if isinstance(first, dict):
        first = (None, first.get(sopt.label_key))
    target = first[1] if isinstance(first, (tuple, list)) and len(first) == 2 else None
    return "class" if is_class_label(target) else "any"


def _out_file(out: str | Path, split: str) -> Path:
    p = Path(out)
    return p if p.name.endswith(".lmdb") else p / f"{db_name(split)}.lmdb"


def write_dataset(dataset: Any, out: str | Path, split: str = "train", *, seed: int = 0,
                  shuffle: bool = True, workers: int | None = None, image_format: str = "jpeg",
                  short_side: int | None = None, quality: int = 95, max_size: int | None = None,
                  verify: bool = True, target_kind: str = "auto",
                  classes: Sequence[str] | None = None, strict: bool = False,
                  overwrite: bool = False, progress: bool = True,
                  scratch: str | Path | None = None, commit_bytes: int = 64 << 20,
                  max_pixels: int | None = DEFAULT_MAX_PIXELS, image_key: str = "image",
                  label_key: str = "label") -> WriteReport:
    """Write ``dataset`` -- a map-style or iterable dataset of ``(image, target)`` pairs,
    or of dicts such as a Hugging Face ``datasets.Dataset`` yields (the image under
    ``image_key``, the target under ``label_key``: NOTE [ dict samples ]) --
    to ``out`` (a folder: ``<out>/ILSVRC-<split>.lmdb``, which ``Loader(out, split)``
    reads; or a ``.lmdb`` path), in a permutation drawn from ``seed`` (``shuffle``).

    Images: encoded bytes, PIL images or HWC uint8 numpy arrays; stored as JPEG
    (``quality``; encoded bytes as they are, if they are a sound JPEG, shrunk with
    ``max_size``) or, with ``image_format="pixels"``, as uint8 pixels shrunk to
    ``short_side`` (NOTE [ stored pixels ]).  Targets: class indices or, with
    ``target_kind="any"``, any msgpack value and numpy arrays (NOTE [ targets ]); the
    Loader collates them like ``default_collate``.  ``workers`` processes prepare
    samples (default: one per core plus one); a commit every ``commit_bytes`` of records
    (what an interrupted run keeps).  Resumable, bad samples skipped and
    reported (``strict``: an error) -- NOTE [ writing a dataset ].  Raises
    FileExistsError rather than replace a database written differently (``overwrite``),
    NoRecordsError if no sample could be stored.  Encoded images whose header claims more
    than ``max_pixels`` pixels are bad samples, refused before any decode (NOTE [ pixel
    limit ]; None: no limit)."""
    if image_format not in ("jpeg", "pixels"):
        raise ValueError(f"image_format={image_format!r}: use 'jpeg' or 'pixels'")
    mapped = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    if not mapped and not hasattr(dataset, "__iter__"):
        raise TypeError(f"dataset is a {type(dataset).__name__}: give a map-style dataset "
                        "(__len__ and __getitem__) or an iterable of (image, target) pairs")
    opt = WriteOptions(seed=seed, shuffle=shuffle, verify=verify, strict=strict,
                       max_size=max_size, quality=quality, store_paths=False,
                       workers=workers or (os.cpu_count() or 1) + 1, overwrite=overwrite,
                       progress=progress, image_format=image_format, short_side=short_side,
                       commit_bytes=commit_bytes, max_pixels=max_pixels)
    final = _out_file(out, split)
    if final.exists() and not overwrite and not final.is_file():
        raise OutputExistsError(f"{final} is not a file; choose another output")
    cls = list(classes) if classes is not None else None
    if cls is None and isinstance(getattr(dataset, "classes", None), (list, tuple)) \
            and all(isinstance(c, str) for c in dataset.classes):
        cls = list(dataset.classes)
    if cls is None:  # a Hugging Face dataset's ClassLabel names
        names = getattr(getattr(dataset, "features", {}).get(label_key), "names", None) \
            if isinstance(getattr(dataset, "features", None), dict) else None
        if isinstance(names, list) and all(isinstance(c, str) for c in names):
            cls = list(names)
    spill = None
    if mapped:
        n = len(dataset)
        if n == 0:
            raise ValueError(f"the dataset ({type(dataset).__name__}) has no samples; nothing to write")
        kind = _kind_of(dataset[0], target_kind, SampleOptions(image_key=image_key,
                                                               label_key=label_key))
        ident = repr((type(dataset).__module__, type(dataset).__qualname__, n))
    else:
        kind = target_kind if target_kind != "auto" else None
        spill = _Spill(Path(scratch or final.parent) / f"{final.name}.spill")
    sopt = SampleOptions(kind or "any", tuple(cls) if cls is not None else None, image_format,
                         short_side, quality, max_size, verify, max_pixels,
                         image_key=image_key, label_key=label_key)
    _CTX.update(opt=sopt, dataset=dataset)
    try:
        if spill is not None:
            if kind is None:  # auto: peek at the first sample
                dataset = _peeked(dataset, target_kind, sopt)
                sopt = _CTX["opt"]
            spill.fill(dataset, opt.workers, progress, split)
            n = len(spill.entries)
            if n == 0:
                raise ValueError("the iterable dataset gave no samples; nothing to write")
            ident = "iterable " + spill.digest.hexdigest()
        order = write_order(n, seed=seed, shuffle=shuffle)
        if (image_key, label_key) != ("image", "label"):
            ident += repr((image_key, label_key))
        fp = _fingerprint(ident, split, order, opt, sopt, cls)
        fetch = spill.fetch if spill is not None else _fetch_map(dataset, opt.workers)
        writer = _DatasetWriter(fetch, n, split, order, final, fp, opt, sopt, cls)
        return _run(writer, final, fp, opt, split)
    finally:
        _CTX.clear()
        if spill is not None:
            spill.path.unlink(missing_ok=True)


def _peeked(dataset: Iterable, target_kind: str, sopt: SampleOptions) -> Iterable:
    """``dataset``'s samples, the first looked at to resolve ``target_kind`` 'auto'."""
    import dataclasses
    import itertools

    it = iter(dataset)
    first = next(it, None)
    kind = _kind_of(first, target_kind, sopt) if first is not None else "any"
    _CTX["opt"] = dataclasses.replace(sopt, target_kind=kind)
    return itertools.chain([first], it) if first is not None else []


def _fingerprint(ident: str, split: str, order: np.ndarray, opt: WriteOptions,
                 sopt: SampleOptions, classes: list[str] | None) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(("dataset", file_version(sopt.target_kind, sopt.image_format), ident, split,
                   classes, sopt)).encode())
    if sopt.max_pixels != DEFAULT_MAX_PIXELS:  # (the default: fingerprints as before it)
        h.update(repr(("max_pixels", sopt.max_pixels)).encode())
    h.update(order.astype("<i8").tobytes())
    return h.hexdigest()


def _run(writer: _DatasetWriter, final: Path, fp: str, opt: WriteOptions, split: str) -> WriteReport:
    report = WriteReport(split)
    partial = final.with_name(final.name + ".partial")
    if final.exists() and not opt.overwrite:
        report.shards.append(existing_result(final, fp, writer.scan, opt))
        return report
    try:
        result: ShardResult = writer.run(0, len(writer.order))
    except BadImageError:
        remove_db(partial)
        raise
    report.shards.append(result)
    if result.num_records == 0:  # NOTE [ no records, no database ]
        remove_db(result.path)
        raise NoRecordsError(no_records_message(report, split))
    if result.bad_files or result.warned_files:
        import warnings
        warnings.warn(f"{split}: {len(result.bad_files)} sample(s) skipped, "
                      f"{len(result.warned_files)} stored with a decoder warning; see "
                      f"{report_path(final)}", stacklevel=3)
    return report
