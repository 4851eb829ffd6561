"""A node-local disk cache of blocks of remote files.

NOTE [ block cache ]
Remote reads with a ``cache_dir`` fetch blocks on a fixed grid of each file (block
``k`` is bytes ``[k * block, (k + 1) * block)``), so every epoch, rank and process
asks for the same blocks whatever its chunks' spans, and keeps each block in its own
file ``<dir>/<file key>/<offset>-<length>.blk``: the bytes, then a trailer (CRC-32 of
the bytes, magic).  The file key hashes the URL with the ETag and size the file had
when opened *and the database's own identity* (its metadata's fingerprint and
checksum, read at opening): a changed file never reuses old blocks, even from a
server that sends no ETag and a replacement of the same size.

* Safe for the ranks of a node: a block is written to a temporary name and renamed
  into place (readers see all of it or nothing; two ranks fetching the same block
  both rename, the last wins, same bytes); the size accounting and eviction run under
  an exclusive ``flock`` on ``<dir>/lock``.
* Checked before it is stored: the records wholly inside a fetched block must agree
  with the metadata's digest table (NOTE [ records checked on arrival ]), else it is
  not cached (damaged in transit); and a record read from the cache that fails its
  check drops the cached blocks holding it and is read again from the origin, so a
  bad block never outlives one read.  The record checks cost one SHA-256 over the
  fetched bytes (~0.5 s per GB), on the pass that fills the cache only.
* Checked before use: the file's size must be the block's plus the trailer, and the
  CRC must match (~0.7 ms per MiB: cheap next to a GET); a bad block is removed and
  fetched again.
* Bounded: ``<dir>/usage`` holds the cache's size at the last scan plus the bytes
  each store added (a block replacing one already there adds only the difference);
  when it passes
  the limit, the writer scans the cache and removes the least recently used blocks
  (a hit touches its file's mtime) down to 90 % of it.  Survives restarts: the files
  are the state; temporary files of a killed writer are removed by a later scan.
* Never fatal: a cache that cannot be created, read or written (no space, read-only,
  no permission, a cache_dir whose parent is not writable) warns once and the stream
  reads on without it (:func:`open_cache`, :attr:`BlockCache.broken`).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import struct
import time
import warnings
import zlib
from typing import Any

__all__ = ["BlockCache", "open_cache"]

_TRAILER = struct.Struct("<I4s")
_MAGIC = b"SLC1"
_LOCK_TIMEOUT = 60.0
#: A temporary file older than this belongs to a writer that died.
_STALE = 600.0


class BlockCache:
    """Blocks of remote files under ``root``, at most ``limit`` bytes; see NOTE
    [ block cache ].  Any number of processes may share one ``root``."""

    def __init__(self, root: str | os.PathLike, limit: int, block: int):
        if limit <= 0:
            raise ValueError(f"the cache limit must be > 0 bytes, got {limit}")
        self.root, self.limit, self.block = os.fspath(root), int(limit), block
        os.makedirs(self.root, exist_ok=True)
        self.hits = self.misses = self.bad = 0
        self.broken = False  # set on the first disk error: the cache is bypassed from then

    def _give_up(self, e: BaseException) -> None:
        if not self.broken:
            self.broken = True
            warnings.warn(f"the block cache at {self.root} failed ({type(e).__name__}: {e}); "
                          "reading on without it", RuntimeWarning, stacklevel=3)

    def _dir(self, f: Any) -> str:
        key = (f"{f.url}\0{f.size}\0{f.etag}\0{getattr(f, 'identity', '')}\0"
               f"{self.block}").encode()
        return os.path.join(self.root, hashlib.sha256(key).hexdigest()[:32])

    def _path(self, f: Any, off: int, n: int) -> str:
        return os.path.join(self._dir(f), f"{off:012x}-{n:x}.blk")

    def read_into(self, f: Any, off: int, buf: memoryview) -> bool:
        """Fill ``buf`` with the cached block of ``f`` at ``off`` (``len(buf)`` bytes);
        False when it is not cached or fails its checks (then it is removed)."""
        if self.broken:
            return False
        path = self._path(f, off, len(buf))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self.misses += 1
            return False
        except OSError as e:
            self._give_up(e)
            return False
        try:
            n = len(buf)
            ok = os.fstat(fd).st_size == n + _TRAILER.size and os.preadv(fd, [buf], 0) == n
            if ok:
                crc, magic = _TRAILER.unpack(os.pread(fd, _TRAILER.size, n))
                ok = magic == _MAGIC and zlib.crc32(buf) == crc
        except OSError as e:
            self._give_up(e)
            return False
        finally:
            os.close(fd)
        if not ok:
            self.bad += 1
            self._forget(path)
            return False
        self.hits += 1
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return True

    def put(self, f: Any, off: int, data: bytes) -> None:
        """Store a fetched block (atomically), then evict if the cache is over its limit.
        A full or failing disk only costs the caching, not the read."""
        if self.broken:
            return
        d = self._dir(f)
        tmp = os.path.join(d, f".tmp-{os.getpid()}-{time.monotonic_ns()}")
        path = self._path(f, off, len(data))
        try:
            os.makedirs(d, exist_ok=True)
            with open(tmp, "wb") as out:
                out.write(data)
                out.write(_TRAILER.pack(zlib.crc32(data), _MAGIC))
            self._store(tmp, path, len(data) + _TRAILER.size)
        except (OSError, TimeoutError) as e:
            _remove(tmp)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                self._give_up(e)

    def forget(self, f: Any, off: int, n: int) -> None:
        """Remove the cached blocks of ``f`` that hold bytes ``[off, off + n)`` (a record
        in them failed its check: NOTE [ records checked on arrival ])."""
        for start in range(off - off % self.block, off + n, self.block):
            self._forget(self._path(f, start, min(self.block, f.size - start)))

    def _forget(self, path: str) -> None:
        """Remove a bad block and take its bytes off the usage."""
        try:
            size = os.stat(path).st_size
            _remove(path)
            self._account(-size)
        except (OSError, TimeoutError):
            pass

    def _store(self, tmp: str, path: str, n: int) -> None:
        """Rename ``tmp`` (``n`` bytes) to ``path`` and count it, under the lock: a block
        another rank stored meanwhile is replaced, not counted twice."""
        with _Locked(os.path.join(self.root, "lock")):
            try:
                replaced = os.stat(path).st_size
            except FileNotFoundError:
                replaced = 0
            os.replace(tmp, path)
            self._update(n - replaced)

    def _account(self, added: int) -> None:
        with _Locked(os.path.join(self.root, "lock")):
            self._update(added)

    def _update(self, added: int) -> None:
        """Add ``added`` bytes to the usage (evicting when over the limit); under the lock."""
        path = os.path.join(self.root, "usage")
        try:
            with open(path) as fh:
                used = int(fh.read().strip() or 0)
        except (OSError, ValueError):
            used = self.limit  # unknown: scan now
        used = max(0, used + added)
        if used > self.limit:
            used = self._evict()
        tmp = path + f".tmp-{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(str(used))
        os.replace(tmp, path)

    def _evict(self) -> int:
        """Remove least recently used blocks until the cache holds at most 90 % of its
        limit (and stale temporary files); the bytes left.  Called under the lock."""
        blocks, now = [], time.time()
        for sub in os.scandir(self.root):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for e in os.scandir(sub.path):
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if e.name.startswith(".tmp-"):
                    if now - st.st_mtime > _STALE:
                        _remove(e.path)
                elif e.name.endswith(".blk"):
                    blocks.append((st.st_mtime, st.st_size, e.path))
        used = sum(b[1] for b in blocks)
        blocks.sort()
        target = self.limit * 9 // 10
        for _, size, path in blocks:
            if used <= target:
                break
            _remove(path)
            used -= size
        return used

    def cached_bytes(self) -> int:
        """Bytes of blocks in the cache now (a scan)."""
        total = 0
        for dirpath, _, names in os.walk(self.root):
            total += sum(os.path.getsize(os.path.join(dirpath, x)) for x in names
                         if x.endswith(".blk"))
        return total


def open_cache(root: str | os.PathLike, limit: int, block: int) -> BlockCache | None:
    """A :class:`BlockCache`, or None (with a warning) when its folder cannot be made."""
    try:
        return BlockCache(root, limit, block)
    except OSError as e:
        warnings.warn(f"the block cache at {os.fspath(root)} cannot be used ({type(e).__name__}: "
                      f"{e}); reading without it", RuntimeWarning, stacklevel=2)
        return None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Locked:
    """An exclusive ``flock`` on ``path``, waited for at most ``_LOCK_TIMEOUT`` s."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self) -> "_Locked":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + _LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise TimeoutError(f"{self.path}: another process has held the cache lock "
                                       f"for {_LOCK_TIMEOUT:.0f} s; is it hung?") from None
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
