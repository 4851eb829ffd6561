"""Write a stream source in a seeded, uniformly shuffled order with sequential I/O only.

NOTE [ external shuffle ]
Record ``i`` of the source (in source order) gets a 64-bit key, the ``i``-th output of
PCG64 seeded by (seed, the source's identity); the written order is the records
sorted by (key, i): a uniform permutation fixed by the seed and the source alone --
not by the worker count, the memory budget or where a run was interrupted.  Pass 1
reads the source once, front to back, and appends each image's bytes to the bucket
file of its key range (the key's top bits); pass 2 reads each bucket whole, sorts it
by key, prepares its images in the writer's process pool (NOTE [ checks in pass 2 ]
in :mod:`.buckets`) and feeds the records, in order, to the resumable writer (NOTE
[ crash-safe, resumable writes ] in writer.py), whose resume guarantees thus carry
over.  Where the source
fits the memory budget the buckets stay in memory: one pass.  Unshuffled (val), the
key is ``i`` and one bucket is streamed, never held whole.

NOTE [ pass-1 resume ]
The scratch folder holds ``bucket-NNNN.bin`` (frames: key, source index, payload),
``index.bin`` (msgpack ``[name, label]`` per record in source order) and
``state.json``.  About every ``commit_bytes`` the files are flushed and fsynced, then
``state.json`` (source cursor, record count, every file's length, the classes seen)
is replaced atomically.  A resume truncates every file to its recorded length and
continues from the cursor, so the files are exactly those of an uninterrupted pass.
Synced scratch pages are dropped from the page cache (as the writer's output is,
NOTE [ drop-behind ] in writer.py): a split worth two passes does not fit in memory,
so keeping them would only evict what other jobs on the host have cached.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import shutil
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import msgpack
import numpy as np

from ..progress import progress_bar
from .buckets import FRAME as _FRAME, bucket_frames, prepared
from .scan import Scan, warn_single_class
from .sources import ClassSeen, Source, close_files, read_item
from ..errors import BadImageError, OutputExistsError
from ..format.imagesize import DEFAULT_MAX_PIXELS
from .options import WriteOptions, WriteReport
from .writer import write_split

__all__ = ["write_source", "record_keys", "DEFAULT_MEMORY_BUDGET"]

DEFAULT_MEMORY_BUDGET = 4 << 30
_STATE_VERSION = 2  # 2: frames hold the source's bytes (prepared in pass 2)
_MAX_BITS = 9  # at most 512 bucket files open at once (a common limit is 1,024 fds)


def record_keys(seed: int, identity: str, start: int, count: int, *, shuffle: bool = True
                ) -> np.ndarray:
    """Keys of records ``[start, start + count)`` (NOTE [ external shuffle ]); without
    ``shuffle`` the key is the record's index."""
    if not shuffle:
        return np.arange(start, start + count, dtype=np.uint64)
    words = np.frombuffer(hashlib.blake2b(identity.encode(), digest_size=16).digest(), "<u4")
    bg = np.random.PCG64(np.random.SeedSequence([seed, *words.tolist()]))
    bg.advance(start)
    return np.asarray(bg.random_raw(count), dtype=np.uint64)


def _sync_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Pass1:
    """Pass 1 into ``2 ** bits`` buckets, on disk (``scratch``) or in memory (None)."""

    def __init__(self, source: Source, split: str, opt: WriteOptions, bits: int,
                 scratch: Path | None):
        self.source, self.split, self.opt, self.bits, self.scratch = source, split, opt, bits, scratch
        self.plan = repr((_STATE_VERSION, source.fingerprint(), split, opt.seed, opt.shuffle,
                          bits))
        n = 1 << bits
        if scratch is None:
            self.buckets: list = [io.BytesIO() for _ in range(n)]
            self.index: io.IOBase = io.BytesIO()
            self.state = self._new_state()
            return
        scratch.mkdir(parents=True, exist_ok=True)
        state_path = scratch / "state.json"
        self.state = json.loads(state_path.read_text()) if state_path.exists() else None
        if self.state is not None and self.state["plan"] != self.plan:
            raise OutputExistsError(
                f"{scratch} holds an unfinished first pass of another command (other source "
                "files, seed, options or --memory-budget); re-run that command to finish it, "
                "or pass --overwrite to discard it")
        self.state = self.state or self._new_state()
        self.buckets = [self._open(f"bucket-{b:04d}.bin", self.state["buckets"][b])
                        for b in range(n)]
        self.index = self._open("index.bin", self.state["index"])

    def _new_state(self) -> dict:
        return {"plan": self.plan, "done": False, "cursor": [], "records": 0,
                "buckets": [0] * (1 << self.bits), "index": 0, "classes": [], "position": 0}

    def _open(self, name: str, length: int):
        f = open(self.scratch / name, "a+b")
        f.truncate(length)  # (NOTE [ pass-1 resume ]: what the last commit recorded)
        f.seek(length)
        return f

    def close(self) -> None:
        for f in (*self.buckets, self.index):
            if not isinstance(f, io.BytesIO):
                f.close()

    def _commit(self, done: bool = False) -> None:
        st = self.state
        st["done"] = done
        st["position"] = self.source.position()
        if self.scratch is None:
            return
        for f in (*self.buckets, self.index):
            f.flush()
            os.fsync(f.fileno())
            if hasattr(os, "posix_fadvise"):  # not read again before pass 2: see below
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        st["buckets"] = [f.tell() for f in self.buckets]
        st["index"] = self.index.tell()
        _sync_write(self.scratch / "state.json", json.dumps(st))

    def run(self) -> None:
        st, opt = self.state, self.opt
        if st["done"]:
            return
        shift = 64 - self.bits
        keys, key0 = np.empty(0, np.uint64), st["records"]
        seen = set(st["classes"])
        bar = progress_bar(total=self.source.total_bytes(), initial=st["position"], unit="B",
                           unit_scale=True, desc=f"{self.split} pass 1: read", dynamic_ncols=True,
                           progress=opt.progress, smoothing=0.05)
        pending = 0
        try:  # bytes only: images are prepared in pass 2 (NOTE [ checks in pass 2 ])
            for ev, cursor in self.source.events(st["cursor"]):
                if isinstance(ev, ClassSeen):
                    if ev.name not in seen:
                        seen.add(ev.name)
                        st["classes"].append(ev.name)
                    st["cursor"] = cursor
                    continue
                src = st["records"]
                if src - key0 >= len(keys):
                    key0 = src
                    keys = record_keys(opt.seed, self.source.identity(), src, 1 << 16,
                                       shuffle=opt.shuffle)
                key = int(keys[src - key0])
                data = read_item(ev)
                bucket = self.buckets[key >> shift if self.bits else 0]
                bucket.write(_FRAME.pack(key, src, len(data)))
                bucket.write(data)
                self.index.write(msgpack.packb([ev.name, ev.label], use_bin_type=True))
                st["records"] = src + 1
                st["cursor"] = cursor
                pending += len(data)
                bar.update(self.source.position() - bar.n)
                if pending >= opt.commit_bytes:
                    self._commit()
                    pending = 0
                    bar.set_postfix_str(f"{st['records']:,} images")
            self._commit(done=True)
        finally:
            close_files()
            bar.close()


def _resolve_labels(raw: list, seen: list[str], source: Source) -> tuple[list[str], np.ndarray]:
    """The class list and each record's label index (ImageFolder's sorted class names, or
    the source's fixed list)."""
    names = {x for x in raw if isinstance(x, str)}
    ints = [x for x in raw if not isinstance(x, str)]
    if source.classes is not None:
        classes = list(source.classes)
    elif names and ints:
        raise ValueError(f"{source.files[0]}: some labels are class names ({sorted(names)[:3]}) "
                         f"and some label indices ({ints[:3]}); use one kind")
    elif names or not ints:
        classes = sorted(names | set(seen))
    else:
        classes = getattr(source, "index_classes", lambda m: [str(i) for i in range(m + 1)])(
            max(ints))
    index = {c: i for i, c in enumerate(classes)}
    out = np.empty(len(raw), np.int32)
    for i, x in enumerate(raw):
        lab = index.get(x) if isinstance(x, str) else int(x)
        if lab is None or not 0 <= lab < len(classes):
            raise ValueError(f"{source.files[0]}: label {x!r} is not one of the {len(classes)} "
                             f"classes (e.g. {classes[:3]}) nor an index below {len(classes)}; "
                             + ("these are the train split's classes: fix the labels, or give "
                                "the right source" if source.classes is not None else
                                "preprocess train in the same run so its classes are known, or "
                                "fix the labels"))
        out[i] = lab
    return classes, out


def _bits_for(source: Source, opt: WriteOptions, budget: int) -> tuple[int, bool]:
    """(log2 of the bucket count, whether the buckets fit in memory)."""
    size = source.total_bytes()
    if size * 1.1 <= budget:
        return 0, True
    if not opt.shuffle:
        return 0, False
    # two buckets in memory at a time (NOTE [ pass-2 read-ahead ]), 1.25x for uneven sizes
    bits = max(1, math.ceil(math.log2(size * 2.5 / budget)))
    if bits > _MAX_BITS:
        raise ValueError(f"--memory-budget {budget / 2**30:.2f} GiB is too small for "
                         f"{size / 2**30:.1f} GiB of source: it needs more than "
                         f"{1 << _MAX_BITS} bucket files; give at least "
                         f"{size * 2.5 / (1 << _MAX_BITS) / 2**30:.2f} GiB")
    return bits, False


def write_source(source: Source, out: str | Path, split: str, opt: WriteOptions, *,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 scratch: str | Path | None = None,
                 on_classes: Callable[[list[str]], None] | None = None
                 ) -> tuple[WriteReport, list[str]]:
    """Write ``source`` to ``out`` (as :func:`~seqloader.writer.write_split` does) in the
    order of NOTE [ external shuffle ], holding at most about ``memory_budget`` bytes of
    records; returns the report and the class list.  ``scratch`` (default:
    ``<out>.scratch`` beside ``out``) holds pass 1's buckets and is removed at the end.
    Resumable after an interruption in either pass (NOTE [ pass-1 resume ]).
    ``on_classes(classes)`` is called once the class list is known (after pass 1), before
    anything is written: another split's labels are checked against it there, and an
    error it raises leaves no database (pass 1's scratch stays, to be resumed)."""
    out = Path(out)
    if memory_budget <= 0:
        raise ValueError(f"memory budget must be a positive number of bytes, got {memory_budget}")
    scratch = Path(scratch) if scratch is not None else out.with_name(out.name + ".scratch")
    if opt.overwrite and scratch.exists():
        shutil.rmtree(scratch)
    digest = source_digest(source, split, opt)
    done = None if (scratch / "state.json").exists() else _already_written(out, split, opt,
                                                                             digest)
    if done is not None:
        if on_classes is not None:
            on_classes(done[1])
        return done
    bits, in_memory = _bits_for(source, opt, memory_budget)
    p1 = _Pass1(source, split, opt, bits, None if in_memory else scratch)
    try:
        p1.run()
        st = p1.state
        for f in (*p1.buckets, p1.index):
            f.flush()
            f.seek(0)
        raw = list(msgpack.Unpacker(p1.index, raw=False, max_buffer_size=1 << 30))
        if len(raw) != st["records"]:  # pragma: no cover - invariant
            raise AssertionError(f"{len(raw)} index entries for {st['records']} records")
        names = [r[0] for r in raw]
        if len(set(names)) != len(names):
            dup = Counter(names).most_common(1)[0][0]
            raise ValueError(f"{source.files[0]}: image {dup!r} is in the source more than once;"
                             " remove the duplicate (records need distinct names)")
        if hasattr(source, "check_names"):
            source.check_names(names)
        classes, labels = _resolve_labels([r[1] for r in raw], st["classes"], source)
        if split == "train" and len(classes) == 1 and names:
            warn_single_class(split, classes[0], names[0], source.root_label())
        if on_classes is not None:
            on_classes(classes)
        present = set(labels.tolist())
        empty = [c for i, c in enumerate(classes) if i not in present]
        if empty:  # (as the folder tree's scan says)
            warnings.warn(f"{source.root_label()}: {len(empty)} class folder(s) have no images "
                          f"and keep their labels (ImageFolder allow_empty=True): {empty[:10]}"
                          f"{' ...' if len(empty) > 10 else ''}", stacklevel=2)
        del raw
        n = len(names)
        if n == 0:
            raise ValueError(f"{source.files[0]}: no images found for split {split!r}")
        keys = record_keys(opt.seed, source.identity(), 0, n, shuffle=opt.shuffle)
        order = np.lexsort((np.arange(n), keys))
        counts = np.bincount((keys >> np.uint64(64 - bits)).astype(np.int64) if bits
                             else np.zeros(n, np.int64), minlength=1 << bits)
        starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        lengths = [f.seek(0, 2) for f in p1.buckets]

        def load(b: int) -> list[tuple[int, int, int, int]]:
            frames = bucket_frames(p1.buckets[b], lengths[b], None if in_memory else
                                   scratch / f"bucket-{b:04d}.bin")
            return sorted(frames, key=lambda fr: (fr[0], fr[1])) if opt.shuffle else frames

        def located(positions: range) -> Iterator[tuple[int, int, int, int, int]]:
            wanted = [b for b in range(1 << bits)
                      if starts[b + 1] > positions.start and starts[b] < positions.stop]
            # NOTE [ pass-2 read-ahead ]: the next bucket is read (into the page cache;
            # its headers sorted) while this one's images are prepared and written
            with ThreadPoolExecutor(1, thread_name_prefix="seqloader-bucket") as ex:
                nxt = ex.submit(load, wanted[0]) if wanted else None
                for j, b in enumerate(wanted):
                    frames = nxt.result()
                    if j + 1 < len(wanted):
                        nxt = ex.submit(load, wanted[j + 1])
                    for pos, (_, src, off, size) in enumerate(frames, starts[b]):
                        if pos >= positions.stop:
                            break
                        if pos < positions.start:
                            continue
                        assert src == order[pos], (src, pos)  # invariant: buckets are key ranges
                        yield pos, src, b, off, size

        def feed(positions: range) -> Iterator[tuple[int, bytes | None, bytes | str, str | None]]:
            where = lambda item: (int(item[1]), f"{source.root_label()}/{names[item[1]]}")  # noqa: E731
            for pos, src, value, extra, warned in prepared(located(positions), buckets, labels,
                                                           names, opt, where):
                if value is None and opt.strict:
                    raise BadImageError(f"{source.root_label()}/{names[src]}: {extra}. Fix or "
                                        "remove the file, or drop --strict to skip bad files")
                yield pos, value, extra, warned

        scan = Scan(source.root_label(), classes, names, labels,
                    [c for i, c in enumerate(classes) if i not in present], source=digest)
        buckets = p1.buckets if in_memory else [scratch / f"bucket-{b:04d}.bin"
                                                 for b in range(1 << bits)]
        try:
            report = write_split(scan, out, split, opt, order=order, feed=feed)
        except BadImageError:  # (--strict: the writer removed its files)
            p1.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    finally:
        p1.close()
        close_files()  # (pass 2 without workers read the buckets here)
    shutil.rmtree(scratch, ignore_errors=True)
    return report, classes



#: Options that do not change the bytes written (nor, so, a finished database's identity).
_NOT_IDENTITY = ("strict", "shard_ids", "workers", "overwrite", "commit_bytes",
                 "initial_map_size", "progress")


_ENDS = 64 << 10


def source_digest(source: Source, split: str, opt: WriteOptions) -> str:
    """NOTE [ source identity ]: a finished database is this command's only if it was
    written from the same source (kind, files' names and sizes, labels file), class
    names, split and options.  A re-run compares this digest, stored in each file's
    metadata, before it takes the files as done (without it, a re-run with another
    archive kept the old database and said "already complete")."""
    opts = {k: v for k, v in dataclasses.asdict(opt).items() if k not in _NOT_IDENTITY
            and not (k == "max_pixels" and v == DEFAULT_MAX_PIXELS)}  # (as digests before it)
    h = hashlib.blake2b(repr((source.identity(), source.classes, split,
                              sorted(opts.items()))).encode(), digest_size=16)
    for f in source.files:  # (and their ends: another archive of the same name and size)
        f = f / "data.mdb" if f.is_dir() else f
        with open(f, "rb") as fh:
            h.update(fh.read(_ENDS))
            fh.seek(max(0, fh.seek(0, 2) - _ENDS))
            h.update(fh.read(_ENDS))
    return "stream:" + h.hexdigest()


def _already_written(out: Path, split: str, opt: WriteOptions, digest: str
                     ) -> tuple[WriteReport, list[str]] | None:
    """The outputs of a finished run of this command (no scratch left), without reading
    the source again; None unless all of them exist.  Their source, split and options
    are compared (NOTE [ source identity ]; files of older writers, which recorded no
    source: options and split only)."""
    from ..format.files import shard_path
    from ..read.database import file_meta
    from .options import ShardResult

    finals = [shard_path(out, k, opt.shards) for k in
              (opt.shard_ids if opt.shard_ids is not None else range(opt.shards))]
    if opt.overwrite or not all(f.exists() for f in finals):
        return None
    report, classes = WriteReport(split), []
    for f in finals:
        meta = file_meta(f)
        w = (meta.writer or {}) if meta else {}
        same = meta is not None and meta.complete and (
            meta.split, meta.shuffled, meta.seed if meta.shuffled else None, meta.num_shards,
            w.get("verify"), w.get("max_size"), bool(w.get("restart_markers")),
            w.get("max_pixels", DEFAULT_MAX_PIXELS)) == (
            split, opt.shuffle, opt.seed if opt.shuffle else None, opt.shards, opt.verify,
            opt.max_size, opt.restart_markers, opt.max_pixels)
        if same and w.get("source") not in (None, digest):
            raise OutputExistsError(f"{f} already exists and was written from "
                                    f"{'a folder tree' if w['source'] == 'tree' else 'another'}"
                                    " source, labels or options than this command's; pass "
                                    "--overwrite to replace it, or choose another output "
                                    "folder")
        if not same:
            raise OutputExistsError(f"{f} already exists and was not written by this command "
                                    "(another split, seed or options, or unfinished); pass "
                                    "--overwrite to replace it, or choose another output folder")
        if opt.strict and meta.bad_files:
            raise OutputExistsError(f"{f} was written without --strict and skipped "
                                    f"{len(meta.bad_files)} bad file(s); pass --overwrite to write "
                                    "it again with --strict, or run without --strict to accept it")
        classes = meta.classes
        report.shards.append(ShardResult(f, meta.num_records, meta.image_bytes, meta.bad_files,
                                         0.0, skipped=True))
    return report, classes
