"""File names: a split's database file or its shards, finding them, the bad-files report."""
from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Sequence

import lmdb

from .imagetree import image_tree_hint
from .keys import META_KEY
from .meta import unpack_meta
from ..errors import FormatError, NotFoundError

__all__ = ["db_name", "bad_files_path", "shard_path", "shard_files", "is_shard_name",
           "database_splits", "find_database"]


def db_name(split: str) -> str:
    """The file stem the original loader used: ``ILSVRC-<split>``."""
    return f"ILSVRC-{split}"


def bad_files_path(path: str | Path) -> Path:
    """The bad-files report of database file ``path``: ``<file>.bad-files.tsv`` beside it
    (one line per skipped source: path, tab, reason)."""
    path = Path(path)
    return path.with_name(path.name + ".bad-files.tsv")


def shard_path(out: str | Path, shard: int, num_shards: int) -> Path:
    """Path of shard ``shard`` of ``num_shards`` for the output ``out`` (``X.lmdb``).

    A single-shard database is just ``out``; shards are ``X-00001-of-00004.lmdb``.
    """
    out = Path(out)
    if num_shards == 1:
        return out
    return out.with_name(f"{_stem(out)}-{shard:05d}-of-{num_shards:05d}.lmdb")


def shard_files(out: str | Path) -> list[Path]:
    """The shard files of the output ``out`` (``X.lmdb``) that exist: every
    ``X-NNNNN-of-NNNNN.lmdb`` beside it (any shard count), sorted."""
    out = Path(out)
    return sorted(q for q in out.parent.glob(f"{glob.escape(_stem(out))}-?????-of-?????.lmdb")
                  if is_shard_name(q.name, out))  # (a split name may hold [, *, ?)


def _stem(out: Path) -> str:
    return out.name[:-5] if out.name.endswith(".lmdb") else out.name


_SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.lmdb$")


def is_shard_name(name: str, out: str | Path) -> bool:
    """Whether the file name ``name`` is one of output ``out``'s (``X.lmdb``) shard files
    (``X-NNNNN-of-NNNNN.lmdb``, any shard count)."""
    m = _SHARD_RE.match(name)
    return m is not None and m["stem"] == _stem(Path(out))


def database_splits(folder: str | Path) -> list[str]:
    """The splits with a database in ``folder`` (``ILSVRC-<split>.lmdb`` or its shards):
    ``train`` and ``val`` first, then the others sorted; unfinished writes not counted."""
    found = set()
    prefix = db_name("")
    for q in Path(folder).glob(f"{prefix}?*.lmdb"):
        m = _SHARD_RE.match(q.name)
        stem = m["stem"] if m else q.name[:-len(".lmdb")]
        if len(stem) > len(prefix) and q.is_file():
            found.add(stem[len(prefix):])
    return ([s for s in ("train", "val") if s in found]
            + sorted(s for s in found if s not in ("train", "val")))


def _not_found(p: Path, split: str | None) -> str:
    """Why there is no database for ``split`` (None: for any split) in folder ``p``."""
    hint = image_tree_hint(p)
    if hint is not None:
        return hint
    found = sorted(x.name for x in p.glob("*.lmdb"))
    pattern = ("ILSVRC-<split>.lmdb" if split is None
               else f"{db_name(split)}.lmdb or {db_name(split)}-NNNNN-of-NNNNN.lmdb")
    return (f"no database {'' if split is None else f'for split {split!r} '}in {p}: looked for "
            f"{pattern}; found {found or 'no .lmdb files'}. Create it from the image folder "
            f"with `seqloader preprocess <imagenet dir> {p}` (or preprocess_sequential.py)")


def find_database(path: str | Path, split: str | None = None) -> list[Path]:
    """Resolve ``path`` (and optionally a split name) to the ordered list of shard files.

    Accepts a database file (``ILSVRC-train.lmdb``), one of its shards, or a folder
    holding ``ILSVRC-<split>.lmdb`` or its shards (then ``split`` is required).  Raises
    :class:`FileNotFoundError` listing what was looked for (or saying that the folder is
    an image tree to preprocess), or :class:`FormatError` if shards are missing.
    """
    p = Path(path)
    if p.is_dir() and split is not None:
        stem = db_name(split)
        single = p / f"{stem}.lmdb"
        shards = shard_files(single)
        if single.is_file():
            return [single]
        if not shards:
            unfinished = sorted(x.name for x in p.glob(f"{glob.escape(stem)}*.lmdb.partial"))
            if unfinished:
                raise NotFoundError(
                    f"split {split!r} in {p} is still being written or was interrupted: "
                    f"{unfinished[0]}{' ...' if len(unfinished) > 1 else ''}; re-run the same "
                    f"{unfinished_writer(p / unfinished[0])} command to finish it")
            raise NotFoundError(_not_found(p, split))
        return _check_shard_set(shards)
    if p.is_dir():
        splits = database_splits(p)
        unfinished = sorted(x.name for x in p.glob(f"{db_name('')}?*.lmdb.partial"))
        if not splits and unfinished:
            raise NotFoundError(
                f"{p} holds no complete database, only unfinished writes: {unfinished[0]}"
                f"{' ...' if len(unfinished) > 1 else ''}; re-run the same "
                f"{unfinished_writer(p / unfinished[0])} command to finish them")
        if not splits:
            raise NotFoundError(_not_found(p, None))
        raise NotFoundError(f"{p} is a folder holding the split(s) {', '.join(splits)}; "
                            "name the split too (e.g. 'train'), or pass the .lmdb file itself")
    if not p.exists():
        raise NotFoundError(f"database {p} does not exist. Create it with "
                            "`seqloader preprocess <imagenet dir> <lmdb dir>` "
                            "(or preprocess_sequential.py)")
    m = _SHARD_RE.match(p.name)
    if m:
        return _check_shard_set(sorted(p.parent.glob(f"{glob.escape(m['stem'])}-?????-of-{m['n']}.lmdb")))
    return [p]


def _check_shard_set(shards: Sequence[Path]) -> list[Path]:
    ns = {int(_SHARD_RE.match(s.name)["n"]) for s in shards}
    if len(ns) != 1:
        raise FormatError(f"shard files from different shard counts side by side: "
                          f"{[s.name for s in shards]}; remove the stale ones")
    n = ns.pop()
    have = {int(_SHARD_RE.match(s.name)["i"]) for s in shards}
    missing = sorted(set(range(n)) - have)
    if missing:
        raise FormatError(f"{shards[0].parent}: shard(s) {missing} of {n} are missing "
                          f"(found {sorted(have)}); copy or (re)write them before reading")
    return list(shards)


def unfinished_writer(partial: Path) -> str:
    """The command that writes the unfinished file ``partial``, for messages: a dataset
    tool's (``seqloader reshard`` ...) from its committed metadata (``writer["tool"]``),
    else the preprocessing command."""
    default = "preprocess_sequential.py"
    try:
        env = lmdb.open(str(partial), subdir=False, readonly=True, lock=False, max_dbs=0)
        try:
            with env.begin() as txn:
                value = txn.get(META_KEY)
        finally:
            env.close()
        tool = (unpack_meta(value, where=str(partial), require_complete=False).writer or {}).get("tool")
    except Exception:  # (no metadata committed yet, or not ours: the default names it)
        return default
    return f"seqloader {tool['command']}" if isinstance(tool, dict) and tool.get("command") else default
