"""Write a split's shard files from record values as stored: the one writer of the
dataset tools (``subset``, ``reshard``, ``merge``).

NOTE [ copies ]
The tools never decode an image: a record's value is copied byte for byte (rewritten
only to renumber its label, which keeps its layout, NOTE [ record layout ]), so the
output's checksum chain is computed over the very bytes the source holds and
``seqloader verify`` passes on it.  Each output shard is written as the preprocess
writer writes one (NOTE [ crash-safe, resumable writes ] in ``seqloader/write/writer.py``):
to ``<file>.partial``, committed every ``commit_bytes`` with its progress (records
written, checksum so far) in the metadata, completed in the last transaction, then
renamed.  A crash leaves only ``.partial`` files, which nothing opens as a database;
re-running the same command (same sources, same options: the fingerprint) resumes
each unfinished shard after its last commit and skips finished ones.  A file of the
split written by anything else is replaced only with ``overwrite``.  Record extents,
labels and digests (NOTE [ record digests ]) are written on completion, as the writer
writes them; a resumed shard's digests of the records an earlier run committed are
recomputed from them (NOTE [ resumed digests ] in ``seqloader/write/committed.py``).
"""
from __future__ import annotations

import dataclasses
import datetime
import fcntl
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import lmdb
import msgpack
import numpy as np
from tqdm import tqdm

from ...progress import progress_bar

from ... import __version__
from ...errors import OutputExistsError
from ...format.checksum import CHECKSUM_ALGORITHM, EMPTY_CHECKSUM, chain_checksum, record_digest
from ...format.files import db_name, shard_files, shard_path
from ...format.keys import META_KEY, encode_key
from ...format.meta import EXTENT_DTYPE, Meta, digest_entry, file_version, pack_meta
from ...read.database import file_meta
from ...read.pages import PAGE, address, map_base, unmap, value_extents
from ...write.committed import committed_records

__all__ = ["CopyPlan", "write_copy", "relabel", "output_file", "split_outputs"]

#: ``values(start, stop)``: the record values of output positions ``[start, stop)``, in order.
Values = Callable[[int, int], Iterator["bytes | memoryview"]]


@dataclass
class CopyPlan:
    """What one output split gets: ``n`` records, their labels (None for targets that
    are not classes), the metadata every shard starts from (``template``: classes, kind,
    format, writer options of the source), and the plan's ``fingerprint``."""

    split: str
    n: int
    labels: np.ndarray | None
    template: Meta
    fingerprint: str
    shards: int = 1
    shard_ids: Sequence[int] | None = None
    shuffled: bool = False
    seed: int | None = None
    #: how the split was made, recorded in the metadata's ``writer["tool"]``
    provenance: dict | None = None


def output_file(folder: str | Path, split: str) -> Path:
    """The output ``X.lmdb`` of ``split`` in ``folder`` (its shards sit beside it)."""
    return Path(folder) / f"{db_name(split)}.lmdb"


def split_outputs(folder: str | Path, split: str) -> list[Path]:
    """The files of ``split`` in ``folder`` that exist, any layout, unfinished ones too."""
    out = output_file(folder, split)
    found = [p for p in (out, *shard_files(out)) if p.exists()]
    found += sorted(Path(folder).glob(f"{db_name(split)}*.lmdb.partial")) if Path(folder).is_dir() else []
    return found


def relabel(value: bytes | memoryview, label: int) -> bytes:
    """``value`` with its label replaced: the map is repacked in its own key order, so
    it keeps the layout readers rely on (NOTE [ record layout ])."""
    d = msgpack.unpackb(value, raw=False)
    d["label"] = int(label)
    return msgpack.packb(d, use_bin_type=True)


def _check_layout(plan: CopyPlan, folder: Path, overwrite: bool) -> None:
    """Refuse (or, with ``overwrite``, remove) files of the split that this plan would
    not write or resume: another layout, or complete files of another command."""
    ours = {shard_path(output_file(folder, plan.split), k, plan.shards) for k in range(plan.shards)}
    for p in split_outputs(folder, plan.split):
        final = p.with_name(p.name[:-len(".partial")]) if p.name.endswith(".partial") else p
        meta = file_meta(p) if p.stat().st_size else None
        if final != p and meta is None:
            # NOTE [ unclaimed partial files ]: a ``.partial`` without committed metadata
            # (created, then killed before its first commit: its pages may be written,
            # its meta page not) holds nothing of anyone's -- ours to restart, unless a
            # process is writing it right now (it holds the file's lock).
            if not _busy(p):
                p.unlink()
                p.with_name(p.name + "-lock").unlink(missing_ok=True)
            continue
        if final in ours and meta is not None and meta.fingerprint == plan.fingerprint:
            continue  # this command's (finished, or to resume)
        if not overwrite:
            raise OutputExistsError(f"{p} already exists and was not written by this command; "
                                  "pass --overwrite to replace it, or choose another output folder")
        p.unlink()
        p.with_name(p.name + "-lock").unlink(missing_ok=True)


def _busy(path: Path) -> bool:
    """Whether a writer holds ``path``'s lock (:meth:`_ShardCopy.run` takes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_copy(plan: CopyPlan, values: Values, folder: str | Path, *, overwrite: bool = False,
               progress: bool = True, commit_bytes: int = 64 << 20) -> list[Path]:
    """Write ``plan`` to ``folder`` (NOTE [ copies ]) from ``values``; the paths of the
    shards this call was asked for (``plan.shard_ids``, default all)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if plan.shards < 1 or plan.shards > max(plan.n, 1):
        raise ValueError(f"--shards {plan.shards}: give 1 to {plan.n} (the split's record count)")
    _check_layout(plan, folder, overwrite)
    bounds = [round(k * plan.n / plan.shards) for k in range(plan.shards + 1)]
    done = []
    ids = plan.shard_ids if plan.shard_ids is not None else range(plan.shards)
    bar = progress_bar(total=sum(bounds[k + 1] - bounds[k] for k in ids), unit="rec",
                       desc=plan.split, progress=progress, dynamic_ncols=True, smoothing=0.05)
    try:
        for k in ids:
            final = shard_path(output_file(folder, plan.split), k, plan.shards)
            if not final.exists():
                _ShardCopy(plan, final, k, commit_bytes, bar).run(values, bounds[k], bounds[k + 1])
            else:
                bar.update(bounds[k + 1] - bounds[k])
            done.append(final)
    finally:
        bar.close()
    return done


class _ShardCopy:
    """One output shard: positions ``[start, stop)`` of the plan."""

    def __init__(self, plan: CopyPlan, final: Path, shard: int, commit_bytes: int, bar: tqdm):
        self.plan, self.final, self.shard, self.commit_bytes, self.bar = (
            plan, final, shard, commit_bytes, bar)
        self.partial = final.with_name(final.name + ".partial")

    def _start_meta(self) -> Meta:
        p, t = self.plan, self.plan.template
        writer = dict(t.writer or {})
        writer["seqloader"] = __version__
        writer["tool"] = p.provenance or {}
        return dataclasses.replace(
            t, split=p.split, num_records=0, complete=False, checksum=EMPTY_CHECKSUM,
            checksum_algorithm=CHECKSUM_ALGORITHM, fingerprint=p.fingerprint, shard=self.shard,
            num_shards=p.shards, image_bytes=0, shuffled=p.shuffled, seed=p.seed,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(), writer=writer,
            labels=b"", extents=b"", digests=b"", next_source=0,
            # the source's skipped files, counted once per split (in its first shard)
            bad_files=list(t.bad_files) if self.shard == 0 else [],
            warned_files=list(t.warned_files) if self.shard == 0 else [],
            version=file_version(t.target_kind, t.image_format))

    def run(self, values: Values, start: int, stop: int) -> None:
        meta = None
        if self.partial.exists() and self.partial.stat().st_size:
            meta = file_meta(self.partial)
            if meta is None or meta.fingerprint != self.plan.fingerprint:
                meta = None  # (_check_layout removed any that is not ours)
        if meta is None:
            self.partial.unlink(missing_ok=True)
            meta = self._start_meta()
            self.digests = bytearray()
        else:  # (before this process opens the file for writing)
            self.digests = committed_records(self.partial, self.plan.fingerprint,
                                             progress=False).digests
        env = lmdb.open(str(self.partial), subdir=False, map_size=1 << 30, readahead=False,
                        meminit=False, max_dbs=0, lock=True)
        # extents as records are committed (a resumed file: by a walk at the end)
        self.ext: list[np.ndarray] | None = [] if meta.num_records == 0 else None
        self.fd = os.open(self.partial, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            env.close()
            os.close(self.fd)
            raise RuntimeError(f"another process is writing {self.partial}; wait for it or stop "
                               "it before re-running") from None
        try:
            self.bar.update(meta.num_records)
            self._write(env, meta, values(start + meta.num_records, stop))
            if meta.num_records != stop - start:  # pragma: no cover - invariant
                raise AssertionError(f"{meta.num_records} records for {stop - start} positions")
            if self.plan.labels is not None:
                meta.labels = self.plan.labels[start:stop].astype("<i4").tobytes()
            meta.extents = self._final_extents(env, meta.num_records)
            meta.digests = bytes(self.digests)
            meta.complete = True
            self._commit(env, [], meta)
        finally:
            env.close()
            os.close(self.fd)
        os.replace(self.partial, self.final)
        self.partial.with_name(self.partial.name + "-lock").unlink(missing_ok=True)
        dirfd = os.open(self.final.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)

    def _write(self, env: lmdb.Environment, meta: Meta, values: Iterator) -> None:
        """Append ``values``, committing every ``commit_bytes`` in a background thread
        (one commit in flight: its copy into LMDB and its fsync overlap the reading and
        hashing of the next batch; memory ~2 x ``commit_bytes``)."""
        pending: list[tuple[bytes, bytes | memoryview]] = []
        size = 0
        inflight: Future | None = None
        committer = ThreadPoolExecutor(1, thread_name_prefix="seqloader-copy-commit")

        def commit() -> None:
            nonlocal inflight, pending, size
            if inflight is not None:
                inflight.result()
            snapshot = dataclasses.replace(meta)
            inflight = committer.submit(self._commit, env, pending, snapshot)
            inflight.add_done_callback(lambda f, n=len(pending): f.exception() or self.bar.update(n))
            pending, size = [], 0

        try:
            for value in values:
                key = encode_key(meta.num_records)
                digest = record_digest(value)
                meta.checksum = chain_checksum(meta.checksum, key, digest)
                self.digests += digest_entry(digest)
                meta.num_records += 1
                meta.image_bytes += len(value)
                pending.append((key, value))
                size += len(value)
                if size >= self.commit_bytes:
                    commit()
            commit()
        finally:
            if inflight is not None:
                inflight.result()  # (a commit in progress completes, atomically, even on Ctrl-C)
            committer.shutdown()

    def _commit(self, env: lmdb.Environment, pending: list, meta: Meta) -> None:
        meta.next_source = meta.num_records
        while True:
            try:
                with env.begin(write=True) as txn:
                    for key, value in pending:
                        txn.put(key, value, append=True)
                    txn.put(META_KEY, pack_meta(meta))
                break
            except lmdb.MapFullError:
                env.set_mapsize(env.info()["map_size"] * 2)
        if pending and self.ext is not None:
            self._committed(env, [key for key, _ in pending])

    def _locate(self, env: lmdb.Environment, keys) -> np.ndarray | None:
        """Extents of just-committed records (:func:`~seqloader.read.pages.value_extents`)."""
        return value_extents(str(self.partial), env, keys)

    def _committed(self, env: lmdb.Environment, keys: list[bytes]) -> None:
        """After a commit: the new records' extents, then their pages dropped from the
        page cache -- whole pages inside their span only (NOTE [ drop-behind ] in
        ``seqloader/write/writer.py``: a copy would otherwise fill the cache with output
        nobody reads soon, and the kernel's work to reclaim it costs CPU here)."""
        ext = self._locate(env, keys)
        if ext is None:
            self.ext = None
            return
        self.ext.append(ext)
        lo = -(-int(ext["offset"].min()) // PAGE) * PAGE
        hi = int((ext["offset"] + ext["length"]).max()) // PAGE * PAGE
        if hi > lo and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)

    def _final_extents(self, env: lmdb.Environment, n: int) -> bytes:
        """Every record's extent: those taken at each commit, with values small enough to
        live in B-tree leaves (which later commits copy elsewhere) looked up again; or,
        for a resumed file, from a walk of the B-tree."""
        if self.ext is None:
            return self._extents(env, n)
        ext = np.concatenate(self.ext) if self.ext else np.zeros(0, EXTENT_DTYPE)
        small = np.flatnonzero(ext["length"] <= env.stat()["psize"] // 2)
        if len(small):
            again = self._locate(env, [encode_key(int(i)) for i in small])
            if again is None:  # pragma: no cover - /proc vanished
                return b""
            ext[small] = again
        return ext.tobytes()

    def _extents(self, env: lmdb.Environment, n: int) -> bytes:
        """Every record's extent (:data:`~seqloader.format.meta.EXTENT_DTYPE`), from a walk
        of the B-tree's leaves (a value's address comes from its leaf: its own pages are
        not read); b"" where the file's map cannot be located (no /proc)."""
        base = map_base(str(self.partial))
        if base is None:
            return b""
        out = np.empty(n, EXTENT_DTYPE)
        with env.begin(buffers=True) as txn:
            cur = txn.cursor()
            j = 0
            if cur.set_key(encode_key(0)):
                for value in cur.iternext(keys=False, values=True):
                    out[j] = (address(value) - base, len(value))
                    j += 1
        unmap(base, env.info()["map_size"])
        if j != n:  # pragma: no cover - invariant
            raise AssertionError(f"{j} records found in {self.partial}, {n} written")
        return out.tobytes()
