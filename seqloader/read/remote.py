"""Read databases at URLs (``s3://``, ``https://``, any fsspec protocol) with ranged GETs.

NOTE [ remote reading ]
Object stores serve large ranged GETs well and small ones badly (each costs a round
trip and a request), and a reader's records are already known as byte spans (NOTE
[ record extents ]).  So a remote database is read exactly like direct I/O (NOTE
[ direct I/O ]): :class:`RemoteStream` is a :class:`~seqloader.read.direct.DirectStream`
whose blocks are ranged GETs (``block`` bytes, 8 MiB, ``depth`` of them in flight,
``window`` bytes at most held), copied into the same ring and yielded record by
record.  Every rank fetches only its own chunks' spans.  The metadata comes from a
few ranged reads too (NOTE [ opening over ranged reads ] in
:mod:`seqloader.read.remoteopen`), so nothing is copied to open a database.

Faults: every request runs under NOTE [ remote time budget ] in
:mod:`seqloader.read.remotefaults` (connect and request timeouts, retries with backoff
within a per-block ``deadline``, the first failed block stopping the others); the
errors are :class:`RemoteError` subclasses that name the cause, the URL (without
credentials or query) and the byte range.  A GET carries ``If-Match: <ETag>`` where the
protocol supports it and the ETag is strong (RFC 9110: a weak ``W/`` tag never matches
there), and every block's length is checked.  A retried block is fetched whole again,
so no record is lost or repeated.

How a URL is reached (:class:`RemoteOptions`, the fsspec filesystem, the S3 and
plain-URL GETs) is :mod:`seqloader.read.remotefs`; its public names are re-exported here.
fsspec (and the protocol's package, e.g. s3fs) is an optional dependency, imported
only when a URL is opened: ``pip install -c constraints.txt -e '.[remote]'`` in a clone.  Credentials come from
fsspec's usual places (environment, config files) or ``storage_options``.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from ..errors import RemoteChangedError, RemoteError, RemoteTimeoutError
from .bytesource import Part
from .direct import DirectStream
from .httprange import RangeIgnoredError, get_into, interrupt
from .remotefaults import Aborted, call_with_timeout, error_for, retrying, safe_url
from .remotefs import (REMOTE_EXTRA, RemoteOptions, default_options, filesystem, plain_url,
                       protocols, remote_extra_missing, s3_get, set_default_budget,
                       set_default_storage_options, with_timeout)

__all__ = ["RemoteError", "RemoteChangedError", "RemoteOptions", "RemoteFile", "RemoteSource",
           "RemoteStream", "default_options", "filesystem", "is_url", "safe_url",
           "set_default_budget", "stat_remote", "strong_etag", "with_timeout",
           "REMOTE_EXTRA", "remote_extra_missing", "set_default_storage_options"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def strong_etag(etag: str | None) -> str | None:
    """``etag`` if it is a strong entity tag, None for a weak one (``W/"..."``): RFC
    9110 compares ``If-Match`` strongly, so a weak tag there never matches (412)."""
    return None if etag is None or etag.startswith(("W/", "w/")) else etag


@dataclass(frozen=True)
class RemoteFile:
    """One remote file as it was when opened: its ``size`` and ``etag`` (None when the
    store gives none: then only the size is checked), and ``identity``, the database's
    own (its metadata's fingerprint and checksum, once read: the block cache's key)."""

    url: str
    size: int
    etag: str | None
    options: RemoteOptions
    identity: str = ""

    def __repr__(self) -> str:
        return (f"RemoteFile(url={safe_url(self.url)!r}, size={self.size}, etag={self.etag!r}, "
                f"identity={self.identity!r})")

    def fetch(self, start: int, end: int, abort: threading.Event | None = None) -> bytes:
        """Bytes ``[start, end)`` of the file as opened, retried on transient errors
        (NOTE [ remote time budget ]); a :class:`RemoteError` naming the cause when they
        cannot be had."""
        return self._fetch(start, end, None, abort)

    def fetch_into(self, start: int, buf: memoryview, abort: threading.Event | None = None) -> None:
        """:meth:`fetch` of ``len(buf)`` bytes from ``start``, written into ``buf``."""
        self._fetch(start, start + len(buf), buf, abort)

    def _fetch(self, start: int, end: int, buf: memoryview | None,
               abort: threading.Event | None) -> bytes | None:
        """The bytes (``buf`` None), or None once written into ``buf``."""
        if not 0 <= start <= end <= self.size:
            raise ValueError(f"range [{start}, {end}) outside {safe_url(self.url)} "
                             f"({self.size} bytes)")
        if start == end:
            return None if buf is not None else b""
        where = f"{safe_url(self.url)} bytes {start}-{end - 1}"
        try:
            return retrying(lambda t: self._attempt(start, end, buf, t, abort), where, self.url,
                            self.options, abort=abort)
        except RemoteChangedError:
            raise self._changed(start, end) from None

    def _attempt(self, start: int, end: int, buf: memoryview | None, timeout: float,
                 abort: threading.Event | None) -> bytes | None:
        opts = self.options
        plain = plain_url(self.url, self.options)
        if plain is not None:  # NOTE [ plain ranged GETs ]
            out = buf if buf is not None else memoryview(bytearray(end - start))
            get_into(plain, start, out, strong_etag(self.etag), timeout, self.size,
                     connect_timeout=min(opts.connect_timeout, timeout), abort=abort,
                     expect_etag=self.etag if _if_match_capable(self) else None)
            return None if buf is not None else bytes(out)
        data = self._get(start, end, timeout)
        if len(data) == self.size and end - start != self.size:
            raise RemoteError(f"{safe_url(self.url)}: {RangeIgnoredError.text}")
        if len(data) != end - start:
            raise EOFError(f"got {len(data)} of {end - start} bytes")
        if buf is None:
            return data
        buf[:] = data
        return None

    def _changed(self, start: int, end: int) -> RemoteChangedError:
        return RemoteChangedError(
            f"{safe_url(self.url)} bytes {start}-{end - 1}: the file changed on the server "
            f"since it was opened (ETag {self.etag}, {self.size} bytes); open it again: "
            "create a new Loader")

    def _get(self, start: int, end: int, timeout: float) -> bytes:
        """One GET through fsspec, cancelled after ``timeout`` seconds."""
        fs, path = filesystem(self.url, self.options)
        etag = strong_etag(self.etag)
        if not getattr(fs, "async_impl", False):
            return call_with_timeout(fs, "cat_file", path, timeout, start=start, end=end)
        from fsspec.asyn import sync

        if hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):
            return sync(fs.loop, s3_get, fs, path, start, end, etag, timeout=timeout)
        kwargs = {}
        if etag and "http" in protocols(fs):
            kwargs["headers"] = {"If-Match": etag}
        return sync(fs.loop, fs._cat_file, path, start=start, end=end, timeout=timeout, **kwargs)

    def check_unchanged(self) -> None:
        """Compare the file's size and ETag now with those at opening (one HEAD; weak
        ETags compared weakly: RFC 9110 allows that for this use)."""
        current = stat_remote(self.url, self.options)
        if current.size != self.size or (self.etag and current.etag and current.etag != self.etag):
            raise self._changed(0, self.size)


# ------------------------------------------------------------------ opening


@dataclass(frozen=True)
class RemoteSource:
    """The remote shard files of a :class:`~seqloader.read.database.Database`, as opened."""

    files: tuple[RemoteFile, ...]
    options: RemoteOptions


def stat_remote(url: str, options: RemoteOptions) -> RemoteFile:
    """The file at ``url`` as it is now (one HEAD under NOTE [ remote time budget ])."""
    fs, path = filesystem(url, options)

    def head(timeout: float) -> dict:
        fs.invalidate_cache(path)  # (fsspec may answer from a listing it cached earlier)
        return call_with_timeout(fs, "info", path, timeout)
    info = retrying(head, safe_url(url), url, options)
    size = info.get("size")
    if not isinstance(size, int):
        raise RemoteError(f"{safe_url(url)}: the server does not report the file's size; "
                          "serve it with a Content-Length")
    etag = next((info[k] for k in ("ETag", "etag", "e_tag") if info.get(k)), None)
    return RemoteFile(url, size, str(etag) if etag else None, options)


# ------------------------------------------------------------------ the stream


class RemoteStream(DirectStream):
    """:class:`~seqloader.read.direct.DirectStream`'s contract over remote files: ``read(parts)``
    yields each record of :class:`~seqloader.read.direct.Part` s (``path`` = the URL) as a
    memoryview of its own bytes, fetched as ranged GETs of ``block`` bytes, ``depth``
    in flight, ``window`` bytes at most held (NOTE [ remote reading ]); through the
    block cache when ``options.cache_dir`` is set.  The first block that fails stops
    the others' retries (NOTE [ remote time budget ]).  The ``remote``
    :class:`~seqloader.read.bytesource.ByteSource`."""

    name = "remote"

    def __init__(self, source: RemoteSource, window: int = 128 << 20):
        opts = source.options
        super().__init__(window=max(window, 2 * opts.block), block=opts.block, depth=opts.depth)
        self.files = {f.url: f for f in source.files}
        # a block's attempts end by its deadline (+ one connect and one request at most)
        self.read_timeout = opts.deadline + opts.connect_timeout + opts.timeout + 10
        self.abort = threading.Event()
        self.first_error: RemoteError | None = None
        self.cache = None
        if opts.cache_dir is not None:
            from .remotecache import open_cache

            self.cache = open_cache(opts.cache_dir, opts.cache_bytes, opts.block)
        self.checked: set[str] = set()

    def read(self, parts: Any) -> Iterator[memoryview]:
        self.abort = threading.Event()  # (a pass after a failed one starts afresh)
        self.first_error: RemoteError | None = None
        self.checked = set()  # (files without a strong If-Match: checked once per pass)
        return super().read(parts)

    def _stop(self) -> None:
        """Stop every block's retries and interrupt the GETs in flight."""
        self.abort.set()
        interrupt(self.abort)

    def _file(self, part: Part) -> RemoteFile:
        f = self.files[part.path]
        if part.path not in self.checked and not _if_match_capable(f):
            f.check_unchanged()  # (stores without a strong If-Match: once per pass)
            self.checked.add(part.path)
        return f

    def _blocks(self, part: Part, start: int, end: int) -> Iterator[tuple[int, int]]:
        if self.cache is None:
            yield from super()._blocks(part, start, end)
            return
        size = self.files[part.path].size  # cached blocks lie on a fixed grid of the file
        for off in range(start - start % self.block, end, self.block):
            yield off, min(self.block, size - off)

    def _fill(self, part: Part, buf: Any, off: int, n: int) -> int:
        abort = self.abort
        try:
            f = self._file(part)
            if self.cache is not None and self.cache.read_into(f, off, buf[:n]):
                return n
            f.fetch_into(off, buf[:n], abort)
        except Aborted:  # another block failed first: its error is the pass's (a copy:
            first = self.first_error  # one object raised in many threads mixes tracebacks)
            raise (type(first)(*first.args) if first is not None else RemoteError(
                f"{safe_url(part.path)} bytes {off}-{off + n - 1}: the read was stopped")) from None
        except RemoteError as e:
            if abort is self.abort:
                self.first_error = self.first_error or e
                self._stop()
            raise
        if self.cache is not None and self._agrees(part, off, buf[:n]):
            self.cache.put(f, off, buf[:n])
        return n

    def _agrees(self, part: Part, off: int, block: memoryview) -> bool:
        """Whether the part's records wholly inside the block agree with the digest
        table: a block damaged in transit is not cached (NOTE [ block cache ])."""
        from .remotecheck import block_agrees

        sh, first = part.shard, part.first
        if sh is None or part.offsets is None:
            return True
        return block_agrees(block, off, part.offsets, part.lengths, first, sh.digests,
                            sh.algorithm)

    def reread(self, url: str, off: int, n: int) -> bytes:
        """Bytes ``[off, off + n)`` of the file at ``url`` from the origin, the cached
        blocks that hold them dropped (a record that failed its check)."""
        f = self.files[url]
        if self.cache is not None:
            self.cache.forget(f, off, n)
        return f.fetch(off, off + n, self.abort)

    def _read_alone(self, part: Part, off: int, n: int) -> bytes:
        return self._file(part).fetch(off, off + n)

    def _failure(self, e: OSError, part: Part, off: int, n: int) -> BaseException:
        self._stop()
        return error_for(e, f"{safe_url(part.path)} bytes {off}-{off + n - 1}", part.path)

    def _stalled(self, part: Part, off: int, n: int, timeout: float) -> BaseException:
        self._stop()
        return RemoteTimeoutError(
            f"{safe_url(part.path)} bytes {off}-{off + n - 1}: no answer in {timeout:.0f} s; "
            "the server accepts connections but does not answer in time")

    def close(self) -> None:
        self._stop()
        super().close()


def _if_match_capable(f: RemoteFile) -> bool:
    fs, _ = filesystem(f.url, f.options)
    return f.etag is not None and (hasattr(fs, "_call_s3") or "http" in protocols(fs))

