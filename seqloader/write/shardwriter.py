"""Writing one shard file: prepared records in, resumable commits, drop-behind (NOTEs
[ crash-safe, resumable writes ] and [ drop-behind ] in :mod:`.writer`)."""
from __future__ import annotations

import dataclasses
import datetime
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import lmdb
import numpy as np

from ..progress import progress_bar
from ..version import __version__
from ..read.database import file_meta, read_meta
from ..format.checksum import CHECKSUM_ALGORITHM, EMPTY_CHECKSUM, chain_checksum, record_digest
from ..format.meta import DIGEST_BYTES, EXTENT_DTYPE, Meta, digest_entry, file_version, pack_meta
from ..format.keys import META_KEY, encode_key
from ..format.records import Record, pack_record
from ..errors import FormatError, OutputExistsError
from ..read.pages import PAGE as _PAGE, value_extents
from .prepare import prepare_image
from ..workers.processmap import named_errors, process_map
from ..workers.threadmap import thread_map
from .scan import Scan
from ..errors import BadImageError, WorkerDiedError

from .committed import committed_records
from .outfiles import (lock_file, lock_or_fail, read_regular, remove_db, report_path,
                    write_report)
from .options import ShardResult, WriteOptions, what_differs, stored_name, stored_pixels

__all__ = ["Feed", "ShardWriter", "existing_result", "prepare_record"]


def prepare_record(data: bytes, label: int, name: str, opt: WriteOptions
                   ) -> tuple[bytes | None, bytes | str, str | None]:
    """The record stored for the encoded image ``data`` of source file ``name``: ``(record
    value, digest, decoder warning or None)``, or ``(None, error reason, None)`` for a bad
    image (:func:`~seqloader.write.prepare.prepare_image` decides).  Pure; what every
    writer path's workers run."""
    p = prepare_image(data, verify=opt.verify, max_size=opt.max_size, quality=opt.quality,
                      restart=opt.restart_markers, max_pixels=opt.max_pixels)
    if p.data is None:
        return None, p.error or "unknown error", None
    image, shape = p.data, None
    if opt.image_format == "pixels":  # NOTE [ stored pixels ]
        image, shape = stored_pixels(p.data, opt.short_side)
    value = pack_record(Record(image, label, stored_name(name) if opt.store_paths else None,
                               p.reencoded, shape=shape))
    return value, record_digest(value), p.warning  # CHECKSUM_ALGORITHM: _load_or_start


_ACTIVE: "ShardWriter | None" = None  # the writer whose sources forked workers prepare


def _prepare_active(pos: int) -> tuple[int, bytes | None, bytes | str, str | None]:
    return _ACTIVE._prepare(pos)



class ShardWriter:
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
            raise OutputExistsError(
                f"{self.partial} is an unfinished write of a different command: "
                f"{what_differs(meta, self.scan, self.opt)}. Re-run that command to finish "
                "it, or pass --overwrite to discard it and start again")
        if meta is not None and meta.bad_files and self.opt.strict:
            path, why = meta.bad_files[0]
            raise OutputExistsError(
                f"{self.partial} is an unfinished write started without --strict that already "
                f"skipped {len(meta.bad_files)} bad file(s) (e.g. {path}: {why}); re-run with "
                "--overwrite to start again with --strict, or without --strict to finish it "
                f"(the skipped files are then listed in {report_path(self.final)})")
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
                                # NOTE [ pixel limit ] (absent: an older writer, no limit)
                                "max_pixels": o.max_pixels,
                                # NOTE [ restart index ] in format/jpeg.py (absent: an older writer)
                                "restart_index": o.restart_markers,
                                # NOTE [ source identity ] in extshuffle.py (absent: older)
                                "source": getattr(self.scan, "source", None) or "tree"})
        # the fingerprint includes the format version, which fixes the algorithm
        assert meta.checksum_algorithm == CHECKSUM_ALGORITHM, meta.checksum_algorithm
        return meta

    def _prepare(self, pos: int) -> tuple[int, bytes | None, bytes | str, str | None]:
        """(position, record value, digest, decoder warning or None) or (position, None,
        error reason, None)."""
        i = int(self.order[pos])
        rel = self.scan.paths[i]
        try:
            data = read_regular(self.scan.root / rel)
        except OSError as e:
            return pos, None, f"cannot read: {e.strerror or e}", None
        return (pos, *prepare_record(data, int(self.scan.labels[i]), rel, self.opt))

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
        processes when decoding (:func:`~seqloader.workers.processmap.process_map`): one per
        core plus one, which keeps the cores busy while a decoder waits for this process
        (measured: 6.0-6.2 s for 10,000 images against 6.2-6.4 s with one per core).
        An unexpected exception (not a bad image: those are bad-files rows) raises
        :class:`~seqloader.errors.RecordError` naming the position and source file, in
        threads and processes alike."""
        global _ACTIVE
        opt = self.opt
        if (not (opt.verify or opt.max_size or opt.image_format == "pixels")
                or os.cpu_count() == 1 or not hasattr(os, "fork")):
            return thread_map(named_errors(self._prepare, self._where), positions,
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

    def _locate(self, env: lmdb.Environment, keys) -> np.ndarray | None:
        """Extents of just-committed records (:func:`~seqloader.read.pages.value_extents`)."""
        return value_extents(str(self.partial), env, keys)

    def _relocate_small(self, env: lmdb.Environment, ext: np.ndarray) -> np.ndarray:
        """Values small enough to live inside B-tree leaves (about half a page or less)
        move whenever a later commit copies their leaf, so their extents are looked up
        again once every record is in.  Larger values sit in overflow pages, which LMDB
        never moves; a real photo is rarely small enough to need this."""
        small = np.flatnonzero(ext["length"] <= env.stat()["psize"] // 2)
        if len(small):
            ext[small] = self._locate(env, [encode_key(int(i)) for i in small])
        return ext

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
            lock_or_fail(lockf, self.partial)
            held = os.fstat(lockf.fileno())
            now = os.stat(self.partial) if self.partial.exists() else None
        except BaseException:
            lockf.close()
            raise
        if now is None or not os.path.samestat(now, held):
            lockf.close()  # finished (renamed) by the run we waited for: is it this one's?
            if self.final.exists() and not self.opt.overwrite:
                return existing_result(self.final, self.fingerprint, self.scan, self.opt)
            raise RuntimeError(f"{self.partial} was moved by another process while this one "
                               "waited for it; re-run the command")
        if self.opt.overwrite:  # only now, with the lock: never under a writer still at work
            remove_db(self.final)
            os.truncate(self.partial, 0)  # (the lock is on this file: emptied, not removed)
            lock_file(self.partial).unlink(missing_ok=True)
        self._fd = lockf.fileno()
        env = None
        try:
            done = committed_records(self.partial, self.fingerprint, progress=self.opt.progress)
            self.extents: list[np.ndarray] | None = done.extents
            self.digests = done.digests  # NOTE [ record digests ], [ resumed digests ]
            env = lmdb.open(str(self.partial), subdir=False, map_size=self.opt.initial_map_size,
                            readahead=False, meminit=False, max_dbs=0, lock=True)
            meta = self._load_or_start(env)
            self._write_records(env, meta, start, stop)
            meta.complete = True
            meta.next_source = stop - start
            meta.labels = self._labels(start, stop, meta)
            if len(self.digests) != meta.num_records * DIGEST_BYTES:  # pragma: no cover
                raise AssertionError(f"{len(self.digests)} digest bytes, {meta.num_records} records")
            meta.digests = bytes(self.digests)
            if self.extents is not None:
                ext = np.concatenate(self.extents) if self.extents else np.empty(0, EXTENT_DTYPE)
                if len(ext) != meta.num_records:  # pragma: no cover - invariant
                    raise AssertionError(f"{len(ext)} extents for {meta.num_records} records")
                meta.extents = self._relocate_small(env, ext).tobytes()
            self._commit(env, [], meta)
            env.sync(True)
            write_report(self.final, meta.bad_files, meta.warned_files)  # before the rename
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
        lock_file(self.partial).unlink(missing_ok=True)
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
        bar = progress_bar(total=stop - start, initial=meta.next_source, unit="img",
                           desc=label, progress=opt.progress, dynamic_ncols=True, smoothing=0.05)
        nbytes, t_last, rate = 0, time.perf_counter(), ""
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
                    self.digests += digest_entry(digest)
                    meta.num_records += 1
                    meta.image_bytes += len(value)
                    nbytes += len(value)
                meta.next_source = pos + 1 - start
                bar.update(1)
                if pending_bytes >= opt.commit_bytes:
                    commit()
                now = time.perf_counter()
                if now - t_last > 1.0:
                    rate = f"{nbytes / (now - t_last) / 2**20:.0f} MB/s, "
                    bar.set_postfix_str(f"{rate}{len(meta.bad_files)} bad")
                    nbytes, t_last = 0, now
            if pending:
                commit()
        finally:
            if inflight is not None:
                inflight.result()  # a commit in progress completes (atomically) even on Ctrl-C
            committer.shutdown()
            # (the bar's last word: the bad count of the report, not that of its last redraw)
            bar.set_postfix_str(f"{rate}{len(meta.bad_files)} bad", refresh=False)
            bar.close()


def existing_result(final: Path, fingerprint: str, scan: Scan, opt: WriteOptions) -> ShardResult:
    """The result of ``final``, already complete, if this command (``scan``, ``opt``, whose
    plan has ``fingerprint``) wrote it: not with ``--strict`` if it skipped bad files."""
    meta = file_meta(final)
    if meta is None or not meta.complete or meta.fingerprint != fingerprint:
        why = ("different sources, order or options" if meta is None
               else what_differs(meta, scan, opt))
        raise OutputExistsError(f"{final} already exists and was not written by this command "
                                f"({why}); pass --overwrite to replace it, or choose another "
                                "output folder")
    if opt.strict and meta.bad_files:
        raise OutputExistsError(f"{final} was written without --strict and skipped "
                                f"{len(meta.bad_files)} bad file(s), listed in "
                                f"{report_path(final)}; pass --overwrite to write it again with "
                                "--strict (it stops at the first bad file), or run without "
                                "--strict to accept it")
    return ShardResult(final, meta.num_records, meta.image_bytes, meta.bad_files, 0.0, skipped=True,
                       warned_files=meta.warned_files)


#: Prepared records of order positions, in order: ``(position, value, digest, warning or
#: None)`` or ``(position, None, reason, None)`` for a bad source (what
#: ``ShardWriter._prepare`` gives).
Feed = Callable[[range], Iterator[tuple[int, "bytes | None", "bytes | str", "str | None"]]]
