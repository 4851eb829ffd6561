"""Write a stream source in a seeded, uniformly shuffled order with sequential I/O only.

NOTE [ external shuffle ]
Record ``i`` of the source (in source order) gets a 64-bit key, the ``i``-th output of
PCG64 seeded by (seed, the source's identity); the written order is the records
sorted by (key, i): a uniform permutation fixed by the seed and the source alone --
not by the worker count, the memory budget or where a run was interrupted.  Pass 1
reads the source once, front to back, prepares each image (decode check,
re-encode) in the writer's process pool and appends it to the bucket file of its
key range (the key's top bits); pass 2 reads each bucket whole, sorts it by key and
feeds its records, in order, to the resumable writer (NOTE [ crash-safe, resumable
writes ] in writer.py), whose resume guarantees thus carry over.  Where the source
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

import hashlib
import io
import json
import math
import os
import shutil
import struct
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import msgpack
import numpy as np
from tqdm import tqdm

from ..dataflow.imap import process_map
from ..format.checksum import record_digest
from ..format.records import Record, pack_record
from .prepare import prepare_image
from .scan import Scan
from .sources import ClassSeen, Item, Source, close_files, read_item
from ..errors import BadImageError
from .options import WriteOptions, WriteReport, stored_name
from .writer import write_split

__all__ = ["write_source", "record_keys", "DEFAULT_MEMORY_BUDGET"]

DEFAULT_MEMORY_BUDGET = 4 << 30
_FRAME = struct.Struct("<QQI")  # key, source index, payload length
_STATE_VERSION = 1
_MAX_BITS = 9  # at most 512 bucket files open at once (a common limit is 1,024 fds)
_OPT: WriteOptions | None = None  # what forked pass-1 workers prepare with


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


def _prepare(item: tuple) -> tuple:
    """In a worker: an item's payload, ``[image, reencoded, decoder warning or None]`` or
    ``[None, reason, None]``."""
    if item[0] == "c":
        return item
    src, name, label, cursor, data, loc = item
    o = _OPT
    p = prepare_image(read_item(Item(name, label, data, loc)), verify=o.verify,
                      max_size=o.max_size, quality=o.quality, restart=o.restart_markers)
    payload = ([p.data, p.reencoded, p.warning] if p.data is not None
               else [None, p.error or "unknown error", None])
    return src, name, label, cursor, msgpack.packb(payload, use_bin_type=True)


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
                          opt.verify, opt.max_size, opt.quality, opt.restart_markers, bits))
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
            raise FileExistsError(
                f"{scratch} holds an unfinished first pass of another command (other source "
                "files, seed, options or --memory-budget); re-run that command to finish it, "
                "or pass --overwrite to discard it")
        self.state = self.state or self._new_state()
        self.buckets = [self._open(f"bucket-{b:04d}.bin", self.state["buckets"][b])
                        for b in range(n)]
        self.index = self._open("index.bin", self.state["index"])

    def _new_state(self) -> dict:
        return {"plan": self.plan, "done": False, "cursor": [], "records": 0, "bad": 0,
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
        global _OPT
        st, opt = self.state, self.opt
        if st["done"]:
            return
        shift = 64 - self.bits
        keys, key0 = np.empty(0, np.uint64), st["records"]
        seen = set(st["classes"])
        bar = tqdm(total=self.source.total_bytes(), initial=st["position"], unit="B",
                   unit_scale=True, desc=f"{self.split} pass 1: read", dynamic_ncols=True,
                   disable=not opt.progress, smoothing=0.05)
        counter = iter(range(st["records"], 1 << 62))

        def work() -> Iterator[tuple]:
            for ev, cursor in self.source.events(st["cursor"]):
                if isinstance(ev, ClassSeen):
                    yield "c", ev.name, cursor
                else:
                    yield next(counter), ev.name, ev.label, cursor, ev.data, ev.loc

        _OPT = opt  # (before the workers fork)
        if (opt.verify or opt.max_size or opt.restart_markers) and hasattr(os, "fork") and (
                os.cpu_count() or 1) > 1:  # decoding: in the writer's process pool
            results = process_map(_prepare, work(), workers=min(
                opt.workers, (os.cpu_count() or 1) + 1))
        else:  # a header check only: cheaper here than a round trip to a worker
            results = map(_prepare, work())
        pending = 0
        try:
            for r in results:
                if r[0] == "c":
                    if r[1] not in seen:
                        seen.add(r[1])
                        st["classes"].append(r[1])
                    st["cursor"] = r[2]
                    continue
                src, name, label, cursor, payload = r
                if src - key0 >= len(keys):
                    key0 = src
                    keys = record_keys(opt.seed, self.source.identity(), src, 1 << 16,
                                       shuffle=opt.shuffle)
                key = int(keys[src - key0])
                if payload[1:2] == b"\xc0":  # [nil, reason] (0x92 0xc0 ...): a bad image
                    if opt.strict:
                        reason = msgpack.unpackb(payload)[1]
                        raise BadImageError(f"{self.source.root_label()}/{name}: {reason}. Fix or "
                                            "remove the file, or drop --strict to skip bad files")
                    st["bad"] += 1
                self.buckets[key >> shift if self.bits else 0].write(
                    _FRAME.pack(key, src, len(payload)) + payload)
                self.index.write(msgpack.packb([name, label], use_bin_type=True))
                st["records"] = src + 1
                st["cursor"] = cursor
                pending += len(payload)
                bar.update(self.source.position() - bar.n)
                if pending >= opt.commit_bytes:
                    self._commit()
                    pending = 0
                    bar.set_postfix_str(f"{st['records']:,} images, {st['bad']} bad")
            self._commit(done=True)
        finally:
            close_files()
            close = getattr(results, "close", None)
            if close is not None:
                close()
            bar.close()


def _frames(f, limit: int) -> Iterator[tuple[int, int, bytes | memoryview]]:
    """(key, source index, payload) of a bucket's first ``limit`` bytes; views into an
    in-memory bucket (no second copy of a split that fits the budget)."""
    if isinstance(f, io.BytesIO):
        buf, pos = f.getbuffer(), 0
        while pos < limit:
            key, src, n = _FRAME.unpack_from(buf, pos)
            pos += _FRAME.size + n
            yield key, src, buf[pos - n:pos]
        return
    while f.tell() < limit:
        key, src, n = _FRAME.unpack(f.read(_FRAME.size))
        yield key, src, f.read(n)


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
                             "preprocess train in the same run so its classes are known, or "
                             "fix the labels")
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
                 scratch: str | Path | None = None) -> tuple[WriteReport, list[str]]:
    """Write ``source`` to ``out`` (as :func:`~seqloader.writer.write_split` does) in the
    order of NOTE [ external shuffle ], holding at most about ``memory_budget`` bytes of
    records; returns the report and the class list.  ``scratch`` (default:
    ``<out>.scratch`` beside ``out``) holds pass 1's buckets and is removed at the end.
    Resumable after an interruption in either pass (NOTE [ pass-1 resume ])."""
    out = Path(out)
    if memory_budget <= 0:
        raise ValueError(f"memory budget must be a positive number of bytes, got {memory_budget}")
    scratch = Path(scratch) if scratch is not None else out.with_name(out.name + ".scratch")
    if opt.overwrite and scratch.exists():
        shutil.rmtree(scratch)
    done = None if (scratch / "state.json").exists() else _already_written(out, split, opt)
    if done is not None:
        return done
    bits, in_memory = _bits_for(source, opt, memory_budget)
    p1 = _Pass1(source, split, opt, bits, None if in_memory else scratch)
    try:
        try:
            p1.run()
        except BadImageError:
            p1.close()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
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

        def load(b: int):
            f = p1.buckets[b]
            f.seek(0)
            frames = _frames(f, lengths[b])
            return sorted(frames, key=lambda fr: (fr[0], fr[1])) if opt.shuffle else frames

        def feed(positions: range) -> Iterator[tuple[int, bytes | None, bytes | str, str | None]]:
            wanted = [b for b in range(1 << bits)
                      if starts[b + 1] > positions.start and starts[b] < positions.stop]
            # NOTE [ pass-2 read-ahead ]: the next bucket is read (and sorted) while this
            # one is written, so the disk reads while the writer works: two buckets in memory
            with ThreadPoolExecutor(1, thread_name_prefix="seqloader-bucket") as ex:
                nxt = ex.submit(load, wanted[0]) if wanted else None
                for j, b in enumerate(wanted):
                    frames = nxt.result()
                    if j + 1 < len(wanted):
                        nxt = ex.submit(load, wanted[j + 1])
                    yield from emit(positions, starts[b], frames)

        def emit(positions: range, lo: int, frames) -> Iterator[tuple]:
            for pos, (_, src, payload) in enumerate(frames, lo):
                if pos >= positions.stop:
                    break
                if pos < positions.start:
                    continue
                assert src == order[pos], (src, pos)  # invariant: buckets are key ranges
                image, extra, warned = msgpack.unpackb(payload, raw=False)
                if image is None:
                    yield pos, None, extra, None
                    continue
                value = pack_record(Record(image, int(labels[src]), stored_name(names[src])
                                           if opt.store_paths else None, extra))
                yield pos, value, record_digest(value), warned

        present = set(labels.tolist())
        scan = Scan(source.root_label(), classes, names, labels,
                    [c for i, c in enumerate(classes) if i not in present])
        if not in_memory:  # pass 2 reads the buckets with large requests
            for b, f in enumerate(p1.buckets):
                f.close()
                p1.buckets[b] = open(scratch / f"bucket-{b:04d}.bin", "rb", buffering=16 << 20)
        report = write_split(scan, out, split, opt, order=order, feed=feed)
    finally:
        p1.close()
    shutil.rmtree(scratch, ignore_errors=True)
    return report, classes



def _already_written(out: Path, split: str, opt: WriteOptions
                     ) -> tuple[WriteReport, list[str]] | None:
    """The outputs of a finished run of this command (no scratch left), without reading
    the source again; None unless all of them exist.  Their records' names are not
    compared with the source (that needs a pass over it): options and split are."""
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
            w.get("verify"), w.get("max_size"), bool(w.get("restart_markers"))) == (
            split, opt.shuffle, opt.seed if opt.shuffle else None, opt.shards, opt.verify,
            opt.max_size, opt.restart_markers)
        if not same:
            raise FileExistsError(f"{f} already exists and was not written by this command "
                                  "(another split, seed or options, or unfinished); pass "
                                  "--overwrite to replace it, or choose another output folder")
        if opt.strict and meta.bad_files:
            raise FileExistsError(f"{f} was written without --strict and skipped "
                                  f"{len(meta.bad_files)} bad file(s); pass --overwrite to write "
                                  "it again with --strict, or run without --strict to accept it")
        classes = meta.classes
        report.shards.append(ShardResult(f, meta.num_records, meta.image_bytes, meta.bad_files,
                                         0.0, skipped=True))
    return report, classes
