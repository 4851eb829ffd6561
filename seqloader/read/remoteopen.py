"""Open a database at a URL: find its shards and read their metadata with few round trips.

NOTE [ opening over ranged reads ]
Opening a remote database costs round trips, not bytes, so it is planned around them
(a shard's metadata lookup is NOTE [ metadata over ranged reads ] in
:mod:`seqloader.read.lmdbpages`: two meta pages, one page per B-tree level, the value):

* One listing of the folder gives every shard's size and ETag (S3 and its compatibles,
  GCS, Azure list both), instead of one HEAD per shard.  Where the store gives no
  listing (an HTTP server without an index, a key without ListBucket permission) or a
  listed entry lacks either, that file gets its HEAD as before.
* The lookup's pages are fetched together up front: the file's first 8 KiB (the meta
  pages) and its last ``_TAIL`` bytes, as two GETs in flight at once.  The writer
  commits the metadata last, so LMDB's copy-on-write puts the root, the leftmost
  leaf's new copy and the metadata value in the file's last pages: for shards of
  ImageNet's size every later read of the lookup falls in those two ranges.  A read
  outside them is fetched as before, so a file laid out otherwise is read correctly,
  only with more round trips.
* Every shard's requests run at once (up to ``_THREADS``; they wait on the network,
  not the CPU).

So a sharded database opens in about three round trips (listing, then both ranges of
every shard at once), whatever its number of shards up to ``_THREADS / 2``.
"""
from __future__ import annotations

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor

from ..errors import (FormatError, NotFoundError, RemoteAccessError, RemoteError,
                      RemoteNotFoundError)
from ..format.files import db_name
from ..format.keys import META_KEY
from ..format.meta import Meta, unpack_meta
from .remote import RemoteFile, RemoteOptions, RemoteSource, filesystem, safe_url, stat_remote
from .remotefaults import call_with_timeout, retrying

__all__ = ["locate_remote", "open_remote", "remote_splits"]

_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.lmdb$")
_HEAD = 8192  # the two meta pages at LMDB's usual 4 KiB page size
_TAIL = 256 << 10
_THREADS = 64


def _exists(url: str, options: RemoteOptions) -> bool:
    """Whether the file at ``url`` exists: only a 404 says no; any other failure (403,
    timeout, refused) is raised as the :class:`RemoteError` naming it."""
    try:
        stat_remote(url, options)
        return True
    except RemoteNotFoundError:
        return False


def _listing(folder: str, options: RemoteOptions, failed: list[str] | None = None
             ) -> dict[str, RemoteFile | None] | None:
    """The files directly in ``folder`` (a URL) by name, each a :class:`RemoteFile` when
    the listing gave its size and ETag, else None; None when there is no listing (403 or
    404 on the listing itself: a key without ListBucket permission, an HTTP server that
    does not list; the HEADs that follow name a real problem), its error appended to
    ``failed`` for the messages that follow.  Timeouts, refused connections and missing
    credentials are raised (NOTE [ remote time budget ]): no request could succeed."""
    fs, path = filesystem(folder, options)

    def ls(timeout: float) -> list:
        fs.invalidate_cache(path)  # (a listing cached by fsspec may predate a rewrite)
        return call_with_timeout(fs, "ls", path, timeout, detail=True)
    try:
        entries = retrying(ls, f"listing {safe_url(folder)}", folder, options)
    except RemoteError as e:
        if isinstance(e, (TimeoutError, ConnectionError)) or e.reason == "no credentials":
            raise
        if failed is not None:  # (403, 404, or a listing this protocol does not implement)
            failed.append(f"{type(e).__name__}: {e}")
        return None
    out: dict[str, RemoteFile | None] = {}
    for e in entries:
        if not isinstance(e, dict) or e.get("type") == "directory":
            continue
        name = str(e.get("name", "")).rstrip("/").rpartition("/")[2]
        size = e.get("size")
        etag = next((e[k] for k in ("ETag", "etag", "e_tag") if e.get(k)), None)
        url = f"{folder.rstrip('/')}/{name}"
        out[name] = (RemoteFile(url, size, str(etag), options)
                     if isinstance(size, int) and etag else None)
    return out


def _located(urls: list[str], listed: dict[str, RemoteFile | None] | None
             ) -> tuple[list[str], dict[str, RemoteFile]]:
    known = {u: f for u in urls if listed and (f := listed.get(u.rpartition("/")[2]))}
    return urls, known


def locate_remote(url: str, split: str | None, options: RemoteOptions
                  ) -> tuple[list[str], dict[str, RemoteFile]]:
    """The shard URLs of a remote database (as :func:`~seqloader.format.files.find_database`):
    a file URL, one shard's URL (its siblings are named from it), or a folder URL and a
    split (the folder's listing, where there is one, names the shards); and those of
    their files that the listing described (size and ETag), by URL."""
    base, _, name = url.rstrip("/").rpartition("/")
    if name.endswith(".lmdb"):
        m = _SHARD.match(name)
        if not m:
            return [url], {}
        n = int(m["n"])
        urls = [f"{base}/{m['stem']}-{i:05d}-of-{n:05d}.lmdb" for i in range(n)]
        return _located(urls, _listing(base, options) if n > 1 else None)
    failed: list[str] = []
    if split is None:
        found = remote_splits(url, options, failed)
        raise NotFoundError(f"{safe_url(url)} is a folder; name the split too "
                            f"({', '.join(map(repr, found)) or 'e.g. train'}), "
                            "or pass the .lmdb file's URL" + _why_unlisted(failed))
    folder = url.rstrip("/")
    single = f"{db_name(split)}.lmdb"
    listed = _listing(folder, options, failed)
    names = sorted(listed or ())
    shards = [x for x in names if (m := _SHARD.match(x)) and m["stem"] == db_name(split)]
    if single in names or (not shards and _exists_in(folder, single, split, listed, failed,
                                                     options)):
        return _located([f"{folder}/{single}"], listed)
    if not shards:
        raise RemoteNotFoundError(
            f"no database for split {split!r} at {safe_url(folder)}: looked for "
            f"{single} or a listing with {db_name(split)}-NNNNN-of-NNNNN.lmdb "
            "(an HTTP server may not list folders: pass the URL of the .lmdb file or of "
            "one shard)" + _why_unlisted(failed))
    m = _SHARD.match(shards[0])
    n = int(m["n"])
    urls = [f"{folder}/{m['stem']}-{i:05d}-of-{n:05d}.lmdb" for i in range(n)]
    return _located(urls, listed)


def _exists_in(folder: str, single: str, split: str, listed: dict | None, failed: list[str],
               options: RemoteOptions) -> bool:
    """:func:`_exists` of the single-file database ``single`` in ``folder``; when the
    folder's listing was refused too, the access error names the folder and the split,
    not a file name that was only a guess."""
    try:
        return _exists(f"{folder}/{single}", options)
    except RemoteAccessError as e:
        if listed is not None or e.reason == "no credentials":
            raise
        err = RemoteAccessError(
            f"split {split!r} at {safe_url(folder)}: the folder's listing and the look-up "
            f"of a single-file database were both refused ({failed[0] if failed else e}); "
            "check the credentials (storage_options, AWS_* variables, ~/.aws) and the "
            "permissions on the bucket or path")
        err.reason = e.reason
        raise err from None


def _why_unlisted(failed: list[str]) -> str:
    return f"; the folder's listing failed: {failed[0]}" if failed else ""


def remote_splits(folder: str, options: RemoteOptions, failed: list[str] | None = None
                  ) -> list[str]:
    """The splits whose databases the listing of ``folder`` (a URL) shows, in the order
    :func:`~seqloader.format.files.database_splits` gives locally; [] when the store
    gives no listing (why appended to ``failed``)."""
    prefix = db_name("")
    found = set()
    for name in _listing(folder.rstrip("/"), options, failed) or {}:
        m = _SHARD.match(name)
        stem = m["stem"] if m else (name[:-len(".lmdb")] if name.endswith(".lmdb") else "")
        if stem.startswith(prefix) and len(stem) > len(prefix):
            found.add(stem[len(prefix):])
    return ([s for s in ("train", "val") if s in found]
            + sorted(s for s in found if s not in ("train", "val")))


class _Ranges:
    """Reads of one remote file served from ranges fetched ahead; others are fetched."""

    def __init__(self, f: RemoteFile):
        self.f = f
        self.held: list[tuple[int, bytes]] = []

    def ahead(self) -> list[tuple[int, int]]:
        """The ranges worth fetching before the lookup (NOTE [ opening over ranged reads ])."""
        size = self.f.size
        if size <= _HEAD + _TAIL:
            return [(0, size)]
        return [(0, _HEAD), (size - _TAIL, size)]

    def fetch(self, start: int, end: int) -> None:
        self.held.append((start, self.f.fetch(start, end)))

    def read(self, offset: int, n: int) -> bytes:
        for start, data in self.held:
            if start <= offset and offset + n <= start + len(data):
                return data[offset - start:offset - start + n]
        return self.f.fetch(offset, offset + n)


def open_remote(url: str, split: str | None, options: RemoteOptions, *,
                require_complete: bool = True) -> tuple[list[str], list[Meta], RemoteSource]:
    """Find a remote database's shards and read their metadata with ranged reads, all
    shards at once (NOTE [ opening over ranged reads ]); the checks across shards are
    the caller's."""
    from .lmdbpages import lookup_first_leaf

    urls, known = locate_remote(url, split, options)
    with ThreadPoolExecutor(min(_THREADS, 2 * len(urls)),
                            thread_name_prefix="seqloader-open") as pool:
        files = list(pool.map(lambda u: known.get(u) or stat_remote(u, options), urls))
        ranges = [_Ranges(f) for f in files]
        for job in [pool.submit(r.fetch, a, b) for r in ranges for a, b in r.ahead()]:
            job.result()

        def meta(r: _Ranges) -> Meta:
            where = safe_url(r.f.url)
            value = lookup_first_leaf(r.read, r.f.size, META_KEY, where=where)
            return unpack_meta(value, where=where, require_complete=require_complete)

        metas = list(pool.map(meta, ranges))
    for f, m in zip(files, metas):
        if m.num_records and not m.extents:
            raise FormatError(f"{safe_url(f.url)} has no record extents (written by an older "
                              "seqloader); remote reading needs them: re-write it with this "
                              "version, or read a local copy")
    # the database's own identity keys the block cache (NOTE [ block cache ]), so another
    # database of the same size under the same URL never reuses its blocks
    files = [dataclasses.replace(f, identity=f"{m.fingerprint}:{m.checksum}")
             for f, m in zip(files, metas)]
    return urls, metas, RemoteSource(tuple(files), options)
