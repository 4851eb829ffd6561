"""Write a scanned split into seqloader LMDB file(s): seeded order, streaming, resumable.

NOTE [ crash-safe, resumable writes ]
Each shard is written to ``<file>.partial`` and renamed to ``<file>`` only after
its final metadata (``complete=True``) is committed and synced.  Every commit
(about ``commit_bytes`` of records) also rewrites the metadata with the writer's
progress: the next source position, the record count, the checksum chain state
and the bad files so far.  LMDB commits are atomic, so after Ctrl-C or
``kill -9`` the partial file holds exactly the records of its last commit and
the progress that matches them.  Re-running the same command checks the plan's
fingerprint (sources, order, options) and continues from there; the write order
and the per-image processing are deterministic, so the result is byte-for-byte
the records of an uninterrupted run.  A complete file is never replaced without
``overwrite``; a complete shard with the same fingerprint is skipped (so a
multi-shard run resumes at its first unfinished shard) -- unless ``strict`` is asked
for and it (or the partial file being resumed) skipped bad files: that is an error.
``overwrite`` removes the old files only once it holds the writer's lock on
``<file>.partial``, so never under another run still writing it.  The bad-files
report ``<file>.bad-files.tsv`` is written (atomically) before the rename, so a
complete file never lacks it.

NOTE [ drop-behind ]
Once a commit is on disk (LMDB syncs every commit), the writer tells the kernel it
will not read those records' pages again (``posix_fadvise(DONTNEED)`` over the
whole pages inside the span of the commit's records; the meta pages at the start
of the file are never in it, and a B-tree page in it that LMDB needs again is read
back).  Writing a 140 GB split would otherwise fill the page cache with output
nobody reads soon, evicting what other jobs on the host -- a training run, say --
have cached.  It is also
cheaper: the next commit's pages are allocated from the ones just freed instead of
fresh memory.  On this benchmark VM, whose never-touched memory costs a hypervisor
fault on first use, the commit thread's CPU for a 1 GB split fell from ~2.9 to
~1.7 s of system time (warm 10,000-image runs: 6.4-6.8 s instead of 6.8-8.0 s).
The cost: a database written just now is read from disk, not from the cache, by
the first pass over it.
"""
from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import sys
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import lmdb
import numpy as np
from tqdm import tqdm

from .. import __version__
from ..read.database import Database, close_env, open_env, read_meta
from ..format.checksum import CHECKSUM_ALGORITHM, EMPTY_CHECKSUM, chain_checksum, record_digest
from ..format.meta import EXTENT_DTYPE, IMAGE_FORMATS, PLAIN_VERSION, Meta, file_version, pack_meta
from ..format.keys import META_KEY, encode_key
from ..format.records import Record, pack_record
from ..format.files import bad_files_path, is_shard_name, shard_files, shard_path
from ..errors import FormatError
from ..read.pages import PAGE as _PAGE, address, map_base, unmap
from .prepare import JPEGTRAN_HELP, prepare_image
from ..dataflow.imap import named_errors, process_map
from ..dataflow.ordered import ordered_map
from .scan import Scan
from ..errors import BadImageError, NoRecordsError, WorkerDiedError

__all__ = ["WriteOptions", "ShardResult", "WriteReport", "BadImageError", "NoRecordsError",
           "write_split", "write_order"]



@dataclass
class WriteOptions:
    """How to write a split.  Every field but ``workers``, ``overwrite``,
    ``shard_ids``, ``commit_bytes`` and ``progress`` changes the bytes written and is
    part of the resume fingerprint."""

    seed: int = 0
    shuffle: bool = True
    verify: bool = True
    strict: bool = False
    max_size: int | None = None
    quality: int = 95
    restart_markers: bool = False
    store_paths: bool = True
    shards: int = 1
    shard_ids: list[int] | None = None
    workers: int = max(4, 2 * (os.cpu_count() or 1))
    overwrite: bool = False
    commit_bytes: int = 64 << 20
    initial_map_size: int = 1 << 30
    progress: bool = True
    #: "jpeg", or "pixels": decoded uint8 RGB, shrunk to ``short_side`` (NOTE [ stored pixels ])
    image_format: str = "jpeg"
    short_side: int | None = None

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if self.shard_ids is not None:
            bad = [s for s in self.shard_ids if not 0 <= s < self.shards]
            if bad:
                raise ValueError(f"shard ids {bad} are not in [0, {self.shards}); "
                                 f"with --shards {self.shards} use 0..{self.shards - 1}")
            twice = sorted({s for s in self.shard_ids if self.shard_ids.count(s) > 1})
            if twice:
                raise ValueError(f"shard ids {twice} are listed more than once in {self.shard_ids}")
        if self.max_size is not None and self.max_size < 1:
            raise ValueError(f"max_size must be a positive number of pixels, got {self.max_size}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.image_format not in IMAGE_FORMATS:
            raise ValueError(f"image format {self.image_format!r}: use one of "
                             f"{', '.join(IMAGE_FORMATS)}")
        if self.short_side is not None and (self.image_format != "pixels" or self.short_side < 1):
            raise ValueError(f"short side {self.short_side}: it sizes stored pixels, so it needs "
                             "the 'pixels' image format (--format pixels) and must be >= 1")
        if self.restart_markers and shutil.which("jpegtran") is None:
            raise ValueError(JPEGTRAN_HELP)


@dataclass
class ShardResult:
    path: Path
    num_records: int
    image_bytes: int
    bad_files: list[list[str]]
    seconds: float
    skipped: bool = False  # already complete from an earlier run
    #: ``[path, warning]``: stored although a decoder warned (NOTE [ damaged JPEGs ])
    warned_files: list[list[str]] = field(default_factory=list)


@dataclass
class WriteReport:
    split: str
    shards: list[ShardResult] = field(default_factory=list)

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def bad_files(self) -> list[list[str]]:
        return [b for s in self.shards for b in s.bad_files]

    @property
    def warned_files(self) -> list[list[str]]:
        return [b for s in self.shards for b in s.warned_files]

    @property
    def image_bytes(self) -> int:
        return sum(s.image_bytes for s in self.shards)


def stored_pixels(data: bytes, short_side: int | None) -> tuple[bytes, tuple[int, int, int]]:
    """The record image of a stored-pixels database for the encoded image ``data`` (as
    it would be stored as a JPEG): its RGB pixels as the Loader decodes them, shrunk to
    ``short_side`` (NOTE [ stored pixels ]), and their shape."""
    from ..format.pixels import shrink_to
    from ..transforms import decode_rgb

    rgb = shrink_to(decode_rgb(data), short_side)
    return np.ascontiguousarray(rgb).tobytes(), rgb.shape


def write_order(n: int, *, seed: int, shuffle: bool) -> np.ndarray:
    """The order in which sources are written: a permutation drawn from ``seed``
    (so every run and every resume agrees), or ``arange(n)``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(np.random.SeedSequence([seed])).permutation(n)


_ACTIVE: "_ShardWriter | None" = None  # the writer whose sources forked workers prepare


def _prepare_active(pos: int) -> tuple[int, bytes | None, bytes | str, str | None]:
    return _ACTIVE._prepare(pos)


def _fingerprint(scan: Scan, split: str, order: np.ndarray, opt: WriteOptions) -> str:
    h = hashlib.blake2b(digest_size=16)
    # quality shapes every re-encoded record (CMYK, PNG-as-JPEG, ... even without
    # max_size); outside max_size it is added only where it is not the default, so the
    # fingerprints of earlier databases written with the default still match
    reencode_quality = opt.quality if opt.max_size or opt.quality != WriteOptions.quality else None
    h.update(repr((PLAIN_VERSION, split, scan.classes, opt.verify, opt.max_size,
                   reencode_quality, opt.store_paths, opt.shards)
                  + ((True,) if opt.restart_markers else ())
                  + (("pixels", opt.short_side) if opt.image_format == "pixels" else ())).encode())
    for i in order.tolist():  # (names that are not UTF-8 come back as their own bytes)
        h.update(f"{scan.paths[i]}\0{int(scan.labels[i])}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _what_differs(meta: Meta, scan: Scan, opt: WriteOptions) -> str:
    """In words, how the command that wrote ``meta`` differs from this one, as far as the
    metadata records it; else that the source images differ."""
    w = meta.writer or {}

    def say(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    then_now = [("--seed", meta.seed if meta.shuffled else None, opt.seed if opt.shuffle else None),
                ("--no-shuffle", not meta.shuffled, not opt.shuffle),
                ("--no-verify", w.get("verify") is False, not opt.verify),
                ("--max-size", w.get("max_size"), opt.max_size),
                ("--restart-markers", bool(w.get("restart_markers")), opt.restart_markers),
                ("--shards", meta.num_shards, opt.shards),
                ("--format", meta.image_format, opt.image_format),
                ("--short-side", w.get("short_side"), opt.short_side)]
    if opt.max_size or w.get("max_size") or w.get("quality", opt.quality) != opt.quality:
        then_now.append(("--quality", w.get("quality"), opt.quality))
    diffs = [f"{flag} {say(a)} then, {say(b)} now" for flag, a, b in then_now if a != b]
    if diffs:
        return "it was written with other options: " + "; ".join(diffs)
    if meta.classes != [stored_name(c) for c in scan.classes]:
        return (f"the class folders differ ({len(meta.classes)} then, {len(scan.classes)} "
                "now, or renamed)")
    return ("the source images or their labels differ: files were added, removed or "
            "renamed, or labels changed (e.g. another --val-labels file) -- or --no-paths "
            "differs")


def stored_name(name: str) -> str:
    """A file or folder name as records and metadata store it (msgpack strings are UTF-8):
    itself, or -- for a name that is not valid UTF-8 (e.g. Latin-1 ``caf\\xe9.JPEG``, which
    Python holds with surrogate escapes) -- its bytes with the invalid ones written as
    ``\\xNN``.  Such a name stopped the whole split with an encoding error."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _lock_or_fail(lockf, partial: Path, patience: float = 5.0) -> None:
    """Take the writer's exclusive lock on ``partial``.  A killed writer's decode workers
    hold it for a moment after it dies (they die with it), hence a little patience."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"another process is writing {partial}; wait for it or "
                                   "stop it before re-running") from None
            time.sleep(0.05)


def _lock_file(path: Path) -> Path:
    """The lock file LMDB keeps beside a database file."""
    return path.with_name(path.name + "-lock")


def _partials(out: Path) -> list[Path]:
    """The unfinished writes of output ``out`` (``X.lmdb``) in any layout that exist:
    ``X.lmdb.partial`` and ``X-NNNNN-of-NNNNN.lmdb.partial``."""
    single = out.with_name(out.name + ".partial")
    shards = [p for p in out.parent.glob("*.lmdb.partial")
              if is_shard_name(p.name[:-len(".partial")], out)]
    return ([single] if single.exists() else []) + sorted(shards)


def _remove_partial(partial: Path) -> None:
    """Remove an unfinished write (and LMDB's lock file), unless a writer holds it."""
    try:
        f = open(partial, "rb")
    except FileNotFoundError:
        return
    with f:
        _lock_or_fail(f, partial)
        _remove_db(partial)


def _remove_db(path: Path) -> None:
    for p in (path, _lock_file(path)):
        p.unlink(missing_ok=True)


def _tsv(field: str) -> str:
    """A field of the bad-files report: backslash, tab and line breaks escaped."""
    return (field.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def _report_path(final: Path) -> Path:
    return bad_files_path(final)


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file; OSError for anything else named like an image -- a
    FIFO would block the reader forever, so it is opened without blocking and refused
    (the scan lists names only, and a stat per name there would cost a metadata round
    trip per image on network file systems)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device named "
                          "like an image)")
        return f.read()


#: How the bad-files report marks a file that was stored although a decoder warned.
WARNED = "stored, but a decoder warned: "


def _write_report(final: Path, bad_files: list[list[str]],
                  warned_files: list[list[str]] = ()) -> None:
    """The bad-files report of ``final`` (none if there are none): the skipped files,
    then those stored although a decoder warned (reason ``WARNED`` + the warning);
    replaced atomically and synced: written before ``final`` appears, so a complete
    database never lacks it (the rename's directory sync covers its name too)."""
    report = _report_path(final)
    rows = list(bad_files) + [[p, WARNED + w] for p, w in warned_files]
    if not rows:
        report.unlink(missing_ok=True)
        return
    tmp = report.with_name(report.name + ".partial")
    with open(tmp, "w") as f:
        f.write("".join(f"{_tsv(p)}\t{_tsv(r)}\n" for p, r in rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, report)


class _ShardWriter:
    """Writes positions ``[start, stop)`` of the order into one shard file."""

    def __init__(self, scan: Scan, split: str, order: np.ndarray, final: Path, shard: int,
                 fingerprint: str, opt: WriteOptions, feed: Feed | None = None):
        self.scan, self.split, self.order, self.final = scan, split, order, final
        self.feed = feed
        self.shard, self.fingerprint, self.opt = shard, fingerprint, opt
        self.partial = final.with_name(final.name + ".partial")
        self._fd: int | None = None  # of the partial file while writing (drop-behind)

    def _load_or_start(self, env: lmdb.Environment) -> Meta:
        try:
            meta = read_meta(env, self.partial, require_complete=False)
        except FormatError:
            meta = None
        if meta is not None and meta.fingerprint != self.fingerprint:
            raise FileExistsError(
                f"{self.partial} is an unfinished write of a different command: "
                f"{_what_differs(meta, self.scan, self.opt)}. Re-run that command to finish "
                "it, or pass --overwrite to discard it and start again")
        if meta is not None and meta.bad_files and self.opt.strict:
            path, why = meta.bad_files[0]
            raise FileExistsError(
                f"{self.partial} is an unfinished write started without --strict that already "
                f"skipped {len(meta.bad_files)} bad file(s) (e.g. {path}: {why}); re-run with "
                "--overwrite to start again with --strict, or without --strict to finish it "
                f"(the skipped files are then listed in {_report_path(self.final)})")
        if meta is None:
            o = self.opt
            meta = Meta(split=self.split, classes=[stored_name(c) for c in self.scan.classes],
                        num_records=0,
                        complete=False, checksum=EMPTY_CHECKSUM, fingerprint=self.fingerprint,
                        shard=self.shard, num_shards=o.shards, shuffled=o.shuffle,
                        seed=o.seed if o.shuffle else None, image_format=o.image_format,
                        version=file_version("class", o.image_format),
                        created=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                        writer={"seqloader": __version__, "verify": o.verify,
                                "max_size": o.max_size, "quality": o.quality,
                                "restart_markers": o.restart_markers,
                                "short_side": o.short_side,
                                # NOTE [ restart index ] in format/jpeg.py (absent: an older writer)
                                "restart_index": o.restart_markers})
        # the fingerprint includes the format version, which fixes the algorithm
        assert meta.checksum_algorithm == CHECKSUM_ALGORITHM, meta.checksum_algorithm
        return meta

    def _prepare(self, pos: int) -> tuple[int, bytes | None, bytes | str, str | None]:
        """(position, record value, digest, decoder warning or None) or (position, None,
        error reason, None)."""
        i = int(self.order[pos])
        rel = self.scan.paths[i]
        try:
            data = _read_regular(self.scan.root / rel)
        except OSError as e:
            return pos, None, f"cannot read: {e.strerror or e}", None
        p = prepare_image(data, verify=self.opt.verify, max_size=self.opt.max_size,
                          quality=self.opt.quality, restart=self.opt.restart_markers)
        if p.data is None:
            return pos, None, p.error or "unknown error", None
        image, shape = p.data, None
        if self.opt.image_format == "pixels":  # NOTE [ stored pixels ]
            image, shape = stored_pixels(p.data, self.opt.short_side)
        value = pack_record(Record(image, int(self.scan.labels[i]),
                                   stored_name(rel) if self.opt.store_paths else None, p.reencoded,
                                   shape=shape))
        return pos, value, record_digest(value), p.warning  # CHECKSUM_ALGORITHM: _load_or_start

    def _labels(self, start: int, stop: int, meta: Meta) -> bytes:
        """The labels of the stored records, in record order (int32 little-endian)."""
        bad = {p for p, _ in meta.bad_files}
        idx = [int(i) for i in self.order[start:stop]
               if stored_name(self.scan.paths[int(i)]) not in bad]
        if len(idx) != meta.num_records:  # pragma: no cover - invariant
            raise AssertionError(f"{len(idx)} labels for {meta.num_records} records")
        return self.scan.labels[idx].astype("<i4").tobytes()

    def _prepared(self, positions: range):
        """``_prepare`` over ``positions`` in order: threads when only reading (I/O), forked
        processes when decoding (:func:`~seqloader.dataflow.imap.process_map`): one per
        core plus one, which keeps the cores busy while a decoder waits for this process
        (measured: 6.0-6.2 s for 10,000 images against 6.2-6.4 s with one per core).
        An unexpected exception (not a bad image: those are bad-files rows) raises
        :class:`~seqloader.errors.RecordError` naming the position and source file, in
        threads and processes alike."""
        global _ACTIVE
        opt = self.opt
        if (not (opt.verify or opt.max_size or opt.image_format == "pixels")
                or os.cpu_count() == 1 or not hasattr(os, "fork")):
            return ordered_map(named_errors(self._prepare, self._where), positions,
                               workers=opt.workers)
        _ACTIVE = self
        return process_map(_prepare_active, positions, where=self._where,
                           workers=min(opt.workers, (os.cpu_count() or 1) + 1))

    def _where(self, pos: int) -> tuple[int, str]:
        """(position in the write order, source file) of ``pos``, for errors."""
        return pos, str(self.scan.root / self.scan.paths[int(self.order[pos])])

    def _commit(self, env: lmdb.Environment, pending: list[tuple[bytes, bytes]], meta: Meta) -> None:
        while True:
            try:
                with env.begin(write=True) as txn:
                    for key, value in pending:
                        if not txn.put(key, value, append=True):  # pragma: no cover - invariant
                            raise AssertionError(f"key {key!r} already present")
                    txn.put(META_KEY, pack_meta(meta))
                break
            except lmdb.MapFullError:
                env.set_mapsize(env.info()["map_size"] * 2)
        if pending and self.extents is not None:
            ext = self._locate(env, [key for key, _ in pending])
            if ext is None:  # no /proc: the file gets no extents; readers use the B-tree
                self.extents = None
            else:
                self.extents.append(ext)
                self._drop_behind(ext)

    def _drop_behind(self, ext: np.ndarray) -> None:
        """NOTE [ drop-behind ]: forget the committed (and synced) pages of these records,
        whole pages strictly inside their span only."""
        if self._fd is None or not len(ext) or not hasattr(os, "posix_fadvise"):
            return
        lo = -(-int(ext["offset"].min()) // _PAGE) * _PAGE
        hi = int((ext["offset"] + ext["length"]).max()) // _PAGE * _PAGE
        if hi > lo:
            os.posix_fadvise(self._fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)

    def _locate(self, env: lmdb.Environment, keys: list[bytes]) -> np.ndarray | None:
        """Extents of committed records (NOTE [ record extents ] in shard.py), or None
        without /proc.  Called right after their commit, their pages are in the page
        cache, so this reads nothing from disk."""
        base = map_base(str(self.partial))
        if base is None:
            return None
        out = np.empty(len(keys), EXTENT_DTYPE)
        with env.begin(buffers=True) as txn:
            for j, key in enumerate(keys):
                value = txn.get(key)
                out[j] = (address(value) - base, len(value))
                del value
        unmap(base, env.info()["map_size"])  # keep the writer's RSS flat (NOTE [ mapped pages ])
        return out

    def _relocate_small(self, env: lmdb.Environment, ext: np.ndarray) -> np.ndarray:
        """Values small enough to live inside B-tree leaves (about half a page or less)
        move whenever a later commit copies their leaf, so their extents are looked up
        again once every record is in.  Larger values sit in overflow pages, which LMDB
        never moves; a real photo is rarely small enough to need this."""
        small = np.flatnonzero(ext["length"] <= env.stat()["psize"] // 2)
        if len(small):
            ext[small] = self._locate(env, [encode_key(int(i)) for i in small])
        return ext

    def _committed_extents(self) -> list[np.ndarray]:
        """Extents of the records an interrupted run of this command already committed to
        ``self.partial`` (one sequential pass over them), or [] if there are none."""
        from ..read.reader import RangeReader

        if not self.partial.exists() or self.partial.stat().st_size == 0:  # (just created)
            return []
        env = open_env(self.partial, readahead=False)
        try:
            meta = read_meta(env, self.partial, require_complete=False)
        except FormatError:
            return []
        finally:
            close_env(env)
        if meta.fingerprint != self.fingerprint or not meta.num_records:
            return []
        if self.opt.progress:  # (a walk of the B-tree's leaves, before the progress bar)
            print(f"{self.partial.name}: resuming after {meta.num_records:,} records "
                  f"({meta.image_bytes / 2**30:.2f} GiB); indexing them",
                  file=sys.stderr, flush=True)
        reader = RangeReader(Database((self.partial,), (meta,)))
        try:
            return [reader.extents([(0, meta.num_records)])]
        finally:
            reader.close()

    def run(self, start: int, stop: int) -> ShardResult:
        """Write (or finish writing) this shard from source positions [start, stop)."""
        try:
            return self._run(start, stop)
        except WorkerDiedError as e:
            raise type(e)(f"{self.partial}: a decode worker process died (killed by the "
                          "out-of-memory killer or a signal? see `dmesg`); what was "
                          "committed is kept: re-run the same command to resume (with "
                          f"fewer --workers if memory is short) [{e}]", worker=e.worker,
                          pid=e.pid, exitcode=e.exitcode) from e
        except (lmdb.Error, OSError) as e:
            if isinstance(e, (FileExistsError, FileNotFoundError, IsADirectoryError)):
                raise  # (our own messages, or a path error that names the path)
            raise OSError(f"{self.partial}: cannot write ({type(e).__name__}: {e}); check that "
                          "the output folder is writable and has free space, then re-run the "
                          "same command: it resumes where it stopped") from e

    def _run(self, start: int, stop: int) -> ShardResult:
        t0 = time.perf_counter()
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        # the lock first, then what an earlier run committed: another run of this command
        # may be writing the file (or finish and rename it while this one waits)
        lockf = os.fdopen(os.open(self.partial, os.O_RDONLY | os.O_CREAT, 0o644), "rb")
        try:
            _lock_or_fail(lockf, self.partial)
            held = os.fstat(lockf.fileno())
            now = os.stat(self.partial) if self.partial.exists() else None
        except BaseException:
            lockf.close()
            raise
        if now is None or not os.path.samestat(now, held):
            lockf.close()  # finished (renamed) by the run we waited for: is it this one's?
            if self.final.exists() and not self.opt.overwrite:
                return _existing(self.final, self.fingerprint, self.scan, self.opt)
            raise RuntimeError(f"{self.partial} was moved by another process while this one "
                               "waited for it; re-run the command")
        if self.opt.overwrite:  # only now, with the lock: never under a writer still at work
            _remove_db(self.final)
            os.truncate(self.partial, 0)  # (the lock is on this file: emptied, not removed)
            _lock_file(self.partial).unlink(missing_ok=True)
        self._fd = lockf.fileno()
        env = None
        try:
            self.extents: list[np.ndarray] | None = self._committed_extents()
            env = lmdb.open(str(self.partial), subdir=False, map_size=self.opt.initial_map_size,
                            readahead=False, meminit=False, max_dbs=0, lock=True)
            meta = self._load_or_start(env)
            self._write_records(env, meta, start, stop)
            meta.complete = True
            meta.next_source = stop - start
            meta.labels = self._labels(start, stop, meta)
            if self.extents is not None:
                ext = np.concatenate(self.extents) if self.extents else np.empty(0, EXTENT_DTYPE)
                if len(ext) != meta.num_records:  # pragma: no cover - invariant
                    raise AssertionError(f"{len(ext)} extents for {meta.num_records} records")
                meta.extents = self._relocate_small(env, ext).tobytes()
            self._commit(env, [], meta)
            env.sync(True)
            _write_report(self.final, meta.bad_files, meta.warned_files)  # before the rename
        except BaseException:
            if env is not None:
                env.close()
            lockf.close()
            self._fd = None
            raise
        env.close()
        try:  # renamed under the lock: a run waiting for it then sees it gone (see above)
            os.replace(self.partial, self.final)
        finally:
            lockf.close()
            self._fd = None
        _lock_file(self.partial).unlink(missing_ok=True)
        dirfd = os.open(self.final.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
        return ShardResult(self.final, meta.num_records, meta.image_bytes, meta.bad_files,
                           time.perf_counter() - t0, warned_files=meta.warned_files)

    def _write_records(self, env: lmdb.Environment, meta: Meta, start: int, stop: int) -> None:
        opt = self.opt
        pending: list[tuple[bytes, bytes]] = []
        pending_bytes = 0
        label = f"{self.split}" + (f" {self.shard + 1}/{opt.shards}" if opt.shards > 1 else "")
        bar = tqdm(total=stop - start, initial=meta.next_source, unit="img", desc=label,
                   disable=not opt.progress, dynamic_ncols=True, smoothing=0.05)
        nbytes, t_last = 0, time.perf_counter()
        positions = range(start + meta.next_source, stop)
        # Commits (LMDB copy + write + fsync of ~64 MB) run in a background thread while the
        # next batch is prepared; at most one is in flight, so memory stays ~2 x commit_bytes.
        committer = ThreadPoolExecutor(1, thread_name_prefix="seqloader-commit")
        inflight: Future | None = None

        def commit() -> None:
            nonlocal inflight, pending, pending_bytes
            if inflight is not None:
                inflight.result()
            snapshot = dataclasses.replace(meta, bad_files=list(meta.bad_files),
                                           warned_files=list(meta.warned_files))
            inflight = committer.submit(self._commit, env, pending, snapshot)
            pending, pending_bytes = [], 0

        try:
            # (not bound to a name: an exception must free the generator, and with it the
            # decode processes, which hold the lock -- a traceback keeps the frame's locals)
            for pos, value, digest, warned in (self.feed(positions) if self.feed
                                               else self._prepared(positions)):
                if value is None:
                    path = self.scan.paths[int(self.order[pos])]
                    if opt.strict:
                        raise BadImageError(f"{self.scan.root / path}: {digest}. Fix or remove "
                                            "the file, or drop --strict to skip bad files")
                    meta.bad_files.append([stored_name(path), str(digest)])
                else:
                    if warned:
                        path = self.scan.paths[int(self.order[pos])]
                        meta.warned_files.append([stored_name(path), warned])
                    key = encode_key(meta.num_records)
                    pending.append((key, value))
                    pending_bytes += len(value)
                    meta.checksum = chain_checksum(meta.checksum, key, digest,
                                                   meta.checksum_algorithm)
                    meta.num_records += 1
                    meta.image_bytes += len(value)
                    nbytes += len(value)
                meta.next_source = pos + 1 - start
                bar.update(1)
                if pending_bytes >= opt.commit_bytes:
                    commit()
                now = time.perf_counter()
                if now - t_last > 1.0:
                    bar.set_postfix_str(f"{nbytes / (now - t_last) / 2**20:.0f} MB/s, "
                                        f"{len(meta.bad_files)} bad")
                    nbytes, t_last = 0, now
            if pending:
                commit()
        finally:
            if inflight is not None:
                inflight.result()  # a commit in progress completes (atomically) even on Ctrl-C
            committer.shutdown()
            bar.close()


#: Prepared records of order positions, in order: ``(position, value, digest, warning or
#: None)`` or ``(position, None, reason, None)`` for a bad source (what
#: ``_ShardWriter._prepare`` gives).
Feed = Callable[[range], Iterator[tuple[int, "bytes | None", "bytes | str", "str | None"]]]


def write_split(scan: Scan, out: str | Path, split: str,
                options: WriteOptions | None = None, *, order: np.ndarray | None = None,
                feed: Feed | None = None) -> WriteReport:
    """Write ``scan`` to ``out`` (a ``.lmdb`` file path; with ``options.shards > 1``,
    to ``<stem>-SSSSS-of-NNNNN.lmdb`` beside it).

    Streams: memory is bounded by ``commit_bytes`` plus the in-flight images,
    whatever the dataset size.  Resumable and crash-safe (see NOTE [ crash-safe,
    resumable writes ]).  Raises :class:`FileExistsError` rather than replacing a
    complete database written differently (pass ``overwrite``), and
    :class:`BadImageError` in ``strict`` mode, after removing what this call wrote, and
    :class:`NoRecordsError` when no image could be stored (NOTE [ no records, no database ]).
    ``order`` replaces the seeded permutation of ``scan`` (it must be one fixed by the
    command, e.g. :mod:`~seqloader.write.extshuffle`'s); ``feed`` gives the prepared
    records of positions of ``order`` instead of reading ``scan``'s files.
    """
    opt = options or WriteOptions()
    out = Path(out)
    if len(scan) == 0:
        raise ValueError(f"split {split!r} at {scan.root} has no images; nothing to write")
    if opt.shards > len(scan):
        raise ValueError(f"--shards {opt.shards} is more than the {len(scan)} images of "
                         f"split {split!r}; use at most {len(scan)}")
    if order is None:
        order = write_order(len(scan), seed=opt.seed, shuffle=opt.shuffle)
    fingerprint = _fingerprint(scan, split, order, opt)
    bounds = [round(k * len(scan) / opt.shards) for k in range(opt.shards + 1)]
    # the split in another layout (one file vs shards, another shard count) would be
    # what readers open, or make them fail: replace it only when told to
    ours = {shard_path(out, k, opt.shards) for k in range(opt.shards)}
    others = sorted(p for p in {out, *shard_files(out)} - ours if p.exists())
    if others and not opt.overwrite:
        raise FileExistsError(f"{others[0]} holds split {split!r} in another layout "
                              f"({len(others)} file(s); this command writes {opt.shards}); pass "
                              "--overwrite to replace them, or choose another output folder")
    for p in others:
        _remove_db(p)
        _report_path(p).unlink(missing_ok=True)
    # an unfinished write in another layout: up to the whole split's size of disk
    mine = {p.with_name(p.name + ".partial") for p in ours}
    stale = sorted(p for p in _partials(out) if p not in mine)
    if stale and not opt.overwrite:
        raise FileExistsError(f"{stale[0]} is an unfinished write of split {split!r} in "
                              f"another layout (this command writes {opt.shards} file(s)); "
                              "re-run the command that started it to finish it, or pass "
                              "--overwrite to remove it")
    for p in stale:
        _remove_partial(p)
    report = WriteReport(split)
    written: list[Path] = []
    for k in (opt.shard_ids if opt.shard_ids is not None else range(opt.shards)):
        final = shard_path(out, k, opt.shards)
        partial = final.with_name(final.name + ".partial")
        if final.exists() and not opt.overwrite:  # (with overwrite, removed under the lock)
            report.shards.append(_existing(final, fingerprint, scan, opt))
            _lock_file(partial).unlink(missing_ok=True)  # (a kill between rename and unlink)
            continue
        writer = _ShardWriter(scan, split, order, final, k, fingerprint, opt, feed)
        try:
            report.shards.append(writer.run(bounds[k], bounds[k + 1]))
        except BadImageError:
            _remove_db(partial)
            for p in written:
                _remove_db(p)
            raise
        written.append(final)
    if report.shards and report.num_records == 0:  # NOTE [ no records, no database ]
        for r in report.shards:
            _remove_db(r.path)
        raise NoRecordsError(_no_records(report, split))
    if report.bad_files or report.warned_files:
        reports = [str(_report_path(r.path)) for r in report.shards
                   if r.bad_files or r.warned_files]
        said = [f"{len(report.bad_files)} file(s) could not be decoded and were skipped"
                * bool(report.bad_files),
                f"{len(report.warned_files)} file(s) decoded with a warning and were stored"
                * bool(report.warned_files)]
        warnings.warn(f"{split}: {'; '.join(s for s in said if s)}; see {', '.join(reports[:3])}"
                      f"{f' (+{len(reports) - 3} more)' if len(reports) > 3 else ''}", stacklevel=2)
    return report


# NOTE [ no records, no database ]
# A split whose every source failed (all undecodable: e.g. Git LFS pointers, HEIC files
# named .jpg, a wrong folder) would otherwise be a complete database of 0 records: the
# command succeeds and `verify` passes, and the failure only shows when training starts
# -- far from its cause.  So it is an error here, naming the reports and the first
# reasons, and the empty files (this run's, or an earlier version's that this run
# would have skipped as complete) are removed: no file that looks complete is left.
# The reports stay: they are the diagnosis.  (With --shard-ids, the rule applies to
# the shards this run writes.)


def _no_records(report: WriteReport, split: str) -> str:
    bad = report.bad_files
    reports = [str(_report_path(r.path)) for r in report.shards if r.bad_files]
    first = "; ".join(f"{path}: {why}" for path, why in bad[:3])
    return (f"split {split!r}: none of its {len(bad)} image(s) could be read and decoded, so "
            f"no database was written (it would have 0 records). The reasons are listed in "
            f"{', '.join(reports[:3])}{' ...' if len(reports) > 3 else ''}; the first: {first}"
            f"{f' (and {len(bad) - 3} more)' if len(bad) > 3 else ''}. Check that the folder holds the real images "
            "(not placeholders, e.g. Git LFS pointers), fix or replace them, and re-run")


def _existing(final: Path, fingerprint: str, scan: Scan, opt: WriteOptions) -> ShardResult:
    """The result of ``final``, already complete, if this command (``scan``, ``opt``, whose
    plan has ``fingerprint``) wrote it: not with ``--strict`` if it skipped bad files."""
    env = open_env(final)
    try:
        meta = read_meta(env, final, require_complete=False)
    except FormatError:
        meta = None
    finally:
        close_env(env)
    if meta is None or not meta.complete or meta.fingerprint != fingerprint:
        why = ("different sources, order or options" if meta is None
               else _what_differs(meta, scan, opt))
        raise FileExistsError(f"{final} already exists and was not written by this command "
                              f"({why}); pass --overwrite to replace it, or choose another "
                              "output folder")
    if opt.strict and meta.bad_files:
        raise FileExistsError(f"{final} was written without --strict and skipped "
                              f"{len(meta.bad_files)} bad file(s), listed in "
                              f"{_report_path(final)}; pass --overwrite to write it again with "
                              "--strict (it stops at the first bad file), or run without "
                              "--strict to accept it")
    return ShardResult(final, meta.num_records, meta.image_bytes, meta.bad_files, 0.0, skipped=True,
                       warned_files=meta.warned_files)
