"""Open seqloader database files for reading, and describe a split's shard set.

:class:`Database` is plain, picklable data (paths and metadata): build it in the
parent, send it to worker processes, and let each worker open its own LMDB
environment with :func:`open_env` *after* it starts (LMDB environments must not
cross a fork).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import os

import lmdb
import numpy as np

from ..format.keys import META_KEY, encode_key
from ..format.meta import EmptyDatabaseError, Meta, unpack_meta
from ..format.records import Record, unpack_record
from ..format.files import bad_files_path, db_name, find_database
from ..errors import FormatError

if TYPE_CHECKING:  # (imported when a URL is opened)
    from .remote import RemoteOptions, RemoteSource

__all__ = ["Database", "open_env", "close_env", "read_meta", "file_meta", "open_database",
           "path_splits", "empty_reason"]


# NOTE [ one environment per file and process ]
# LMDB refuses to open a file twice in one process, and a forked child inherits the
# parent's "already open" record.  So readers share one environment per file and
# process (reference-counted), and a fork hook closes inherited ones in the child,
# which then opens its own.
_ENVS: dict[tuple, list] = {}  # (realpath, device, inode) -> [env, references]


def _forget_inherited_envs() -> None:
    for env, _ in _ENVS.values():
        try:
            env.close()
        except lmdb.Error:
            pass
    _ENVS.clear()


os.register_at_fork(after_in_child=_forget_inherited_envs)


def open_env(path: str | Path, *, readahead: bool = True) -> lmdb.Environment:
    """Open one database file read-only, without a lock file; release with :func:`close_env`.

    ``lock=False`` means no reader slots and no ``-lock`` file, so read-only and
    network filesystems work and any number of processes can read; it is safe
    because nothing writes a complete database.  The environment is shared within
    the process (see NOTE [ one environment per file and process ]) and must only be
    used in the process that opened it.
    """
    # keyed by the file itself, not its name: a database re-created under the same name
    # (preprocess --overwrite) while an environment on the old file is open gets its own
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_dev, st.st_ino)
    except OSError:  # lmdb.open below names the problem
        key = (os.path.realpath(path), -1, -1)
    if key in _ENVS:
        _ENVS[key][1] += 1
        return _ENVS[key][0]
    try:
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False,
                        readahead=readahead, max_spare_txns=1, max_dbs=0)
    except lmdb.Error as e:
        raise FormatError(f"{path}: cannot be opened as an LMDB database ({e}); is it a "
                          "seqloader .lmdb file, and was it copied completely?") from None
    # a cut-short copy: LMDB maps the file, and touching a page past its end is SIGBUS
    # (a crash with no message), so compare the size its meta page records first
    need, have = (env.info()["last_pgno"] + 1) * env.stat()["psize"], os.path.getsize(path)
    if need > have:
        env.close()
        raise FormatError(f"{path}: truncated ({have:,} of {need:,} bytes); copy it again "
                          "(or write it again: preprocess_sequential.py ... --overwrite)")
    _ENVS[key] = [env, 1]
    return env


def close_env(env: lmdb.Environment) -> None:
    """Drop one reference from :func:`open_env`; the last one closes the environment."""
    for key, entry in list(_ENVS.items()):
        if entry[0] is env:
            entry[1] -= 1
            if entry[1] == 0:
                del _ENVS[key]
                env.close()
            return
    env.close()


def read_meta(env: lmdb.Environment, where: str | Path, *, require_complete: bool = True) -> Meta:
    with env.begin(buffers=False) as txn:
        return unpack_meta(txn.get(META_KEY), where=str(where), require_complete=require_complete)


def file_meta(path: str | Path) -> Meta | None:
    """The metadata of the file at ``path``, complete or not; None when it holds no
    seqloader metadata (for writers deciding whether a file is theirs)."""
    env = open_env(path)
    try:
        return read_meta(env, path, require_complete=False)
    except FormatError:
        return None
    finally:
        close_env(env)


@dataclass(frozen=True)
class Database:
    """A split stored as one or more shard files, read as one record range.

    Global record ``i`` lives in shard ``s`` where ``offsets[s] <= i < offsets[s+1]``,
    under local key ``i - offsets[s]``.
    """

    paths: tuple[Path, ...]
    metas: tuple[Meta, ...]
    #: each file's (device, inode, size, mtime in ns) when its metadata was read: readers
    #: that open the files later check them (:func:`check_identity`); None: unchecked
    identities: tuple[tuple[int, int, int, int], ...] | None = None
    #: set for a database at URLs (``paths`` then holds the URLs): the files as opened
    #: and how to read them (:mod:`seqloader.read.remote`)
    remote: "RemoteSource | None" = None

    @property
    def num_records(self) -> int:
        return sum(m.num_records for m in self.metas)

    @property
    def offsets(self) -> tuple[int, ...]:
        out = [0]
        for m in self.metas:
            out.append(out[-1] + m.num_records)
        return tuple(out)

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        return tuple(m.num_records for m in self.metas)

    @property
    def classes(self) -> list[str]:
        return self.metas[0].classes

    @property
    def split(self) -> str:
        return self.metas[0].split

    def labels(self) -> "np.ndarray":
        """Every record's label in global order (from the metadata; no data pass)."""
        return np.concatenate([np.frombuffer(m.labels, "<i4") for m in self.metas]).astype(np.int64)

    @property
    def image_bytes(self) -> int:
        return sum(m.image_bytes for m in self.metas)

    @property
    def file_bytes(self) -> int:
        if self.remote is not None:
            return sum(f.size for f in self.remote.files)
        return sum(p.stat().st_size for p in self.paths)

    def __len__(self) -> int:
        return self.num_records

    def __repr__(self) -> str:  # (no metadata dump; URLs without credentials)
        from .remotefaults import safe_url

        paths = [safe_url(str(p)) if self.remote is not None else str(p) for p in self.paths]
        return (f"Database(paths={paths!r}, split={self.split!r}, num_records="
                f"{self.num_records}, remote={self.remote!r})")

    def first_record(self) -> Record:
        """Record 0 of the first shard (opened and closed for this call); FormatError
        naming the file if it is missing or damaged."""
        if self.remote is not None:
            return self._first_remote_record()
        env = open_env(self.paths[0])
        try:
            with env.begin() as txn:
                return unpack_record(txn.get(encode_key(0)), where=f"{self.paths[0]} record 0")
        finally:
            close_env(env)


    def _first_remote_record(self) -> Record:
        from ..format.meta import meta_extents
        from .remote import safe_url

        f = self.remote.files[0]
        ext = meta_extents(self.metas[0], f.size, where=safe_url(f.url))
        if ext is None or not len(ext):
            raise FormatError(f"{safe_url(f.url)} holds no records")
        off, n = int(ext["offset"][0]), int(ext["length"][0])
        return unpack_record(f.fetch(off, off + n), where=f"{safe_url(f.url)} record 0")


def open_database(path: str | Path, split: str | None = None, *,
                  require_complete: bool = True, require_records: bool = True,
                  remote: "RemoteOptions | None" = None) -> Database:
    """Find and check the shard files of a database (see :func:`~seqloader.format.files.find_database`).

    ``path`` may be a URL (``s3://bucket/imagenet``, ``https://...``, any fsspec
    protocol; NOTE [ remote reading ] in :mod:`seqloader.read.remote`), read as ``remote``
    says (default :class:`~seqloader.read.remote.RemoteOptions`).  Raises
    :class:`FormatError` if shards disagree (different writer runs, classes or
    shard counts), :class:`~seqloader.errors.IncompleteError` for unfinished files and,
    when ``require_records``, :class:`~seqloader.format.meta.EmptyDatabaseError` for a
    complete database without records (:func:`empty_reason`).
    """
    from .remote import default_options, is_url, safe_url
    from .remoteopen import open_remote

    if is_url(path):
        urls, metas, source = open_remote(str(path), split, remote or default_options(),
                                          require_complete=require_complete)
        _check_set([safe_url(u) for u in urls], metas, split)
        return _nonempty(Database(tuple(urls), tuple(metas), None, source), require_records)
    paths = find_database(path, split)
    metas = []
    identities = []
    for p in paths:
        identities.append(file_identity(os.stat(p)))
        # (readahead on: looking the metadata up reads every page of it, and under
        # MADV_RANDOM each would be a 4 KiB read -- ImageNet's labels and extents are
        # ~20 MB, 5,000 reads on a disk that serves 100/s; read-arounds make it a few)
        env = open_env(p)
        try:
            metas.append(read_meta(env, p, require_complete=require_complete))
        finally:
            close_env(env)
    _check_set(paths, metas, split)
    return _nonempty(Database(tuple(paths), tuple(metas), tuple(identities)), require_records)


def _nonempty(db: Database, require_records: bool) -> Database:
    if require_records and db.num_records == 0 and all(m.complete for m in db.metas):
        raise EmptyDatabaseError(empty_reason(db))
    return db


def _check_set(paths: list, metas: list[Meta], split: str | None) -> None:
    first = metas[0]
    if split is not None and first.split != split:  # e.g. the train file passed for 'val'
        raise FormatError(f"{paths[0]} holds split {first.split!r}, not {split!r}: pass the "
                          f"{split} database (or the folder holding {db_name(split)}.lmdb)")
    for p, m, i in zip(paths, metas, range(len(paths))):
        if (m.fingerprint, m.num_shards, m.classes, m.split) != \
                (first.fingerprint, first.num_shards, first.classes, first.split):
            raise FormatError(f"{p} does not belong with {paths[0]} (different writer run, "
                              "classes, split or shard count); re-copy the shard set")
        if m.shard != i or m.num_shards != len(paths):
            raise FormatError(f"{p} says it is shard {m.shard} of {m.num_shards}, but it is "
                              f"file {i} of {len(paths)}; was it renamed?")


def empty_reason(db: Database) -> str:
    """Why ``db``, which has no records, is unusable, and the fix: in words for errors
    and ``seqloader info``/``verify``."""
    bad = [b for m in db.metas for b in m.bad_files]
    reports = [str(bad_files_path(p)) for p, m in zip(db.paths, db.metas) if m.bad_files]
    where = f"{db.paths[0]}" + (f" (and {len(db.paths) - 1} other shard(s))" if len(db.paths) > 1 else "")
    why = (f"every source image of split {db.split!r} was skipped: {len(bad)} undecodable or "
           f"unreadable file(s), listed in {', '.join(reports[:3])}"
           f"{' ...' if len(reports) > 3 else ''} (e.g. {bad[0][0]}: {bad[0][1]})" if bad
           else f"its split {db.split!r} had no images")
    return (f"{where}: the database has 0 records ({why}); nothing can be read from it. Fix "
            "or replace the images, then write it again: `seqloader preprocess <imagenet dir> "
            "<lmdb dir> --overwrite`")


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def check_identity(path: str | Path, fd: int, expected: tuple[int, int, int, int] | None) -> None:
    """Raise FormatError if the file open as ``fd`` is not the one whose metadata was read
    (re-written or replaced since: its records would not be where the metadata says)."""
    if expected is not None and file_identity(os.fstat(fd)) != expected:
        raise FormatError(f"{path} changed since its metadata was read (re-written or "
                          "replaced); open it again: create a new Loader/reader")


def path_splits(path: str | Path, split: str | None) -> list[str | None]:
    """The splits ``info``, ``verify``, the dataset tools (and ``bench``, which takes the
    first) read at ``path``: ``[split]`` for a file (None: its own) or with ``--split``; for
    a folder without it, every split with a database there, train and val first (a URL
    folder's by listing it).  Raises FileNotFoundError naming what is there instead (e.g.
    an image tree to preprocess)."""
    from ..format.files import database_splits
    from .remote import is_url

    if split is None and is_url(str(path)) and not str(path).rstrip("/").endswith(".lmdb"):
        from .remote import default_options
        from .remoteopen import remote_splits

        return list(remote_splits(str(path), default_options())) or [None]
    p = Path(path)
    if split is not None or not p.is_dir():
        return [split]
    splits = database_splits(p)
    if not splits:
        find_database(p)  # raises, saying what the folder holds instead
    return list(splits)
