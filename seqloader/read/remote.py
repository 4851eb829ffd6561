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

Faults: each GET is retried (``retries`` attempts, exponential backoff with jitter up
to ``_BACKOFF_MAX`` s) on resets, timeouts, 5xx and throttling; a GET that takes longer
than ``timeout`` is cancelled and retried.  Permanent errors (403, 404, and a file
changed since it was opened: a GET carries ``If-Match: <ETag>`` where the protocol
supports it, and every block's length is checked) raise :class:`RemoteError` naming
the URL (without credentials or query) and the byte range.  A retried block is
fetched whole again, so no record is lost or repeated.

fsspec (and the protocol's package, e.g. s3fs) is an optional dependency, imported
only when a URL is opened: ``pip install seqloader[remote]``.  Credentials come from
fsspec's usual places (environment, config files) or ``storage_options``.
"""
from __future__ import annotations

import dataclasses
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import NotFoundError, RemoteError
from .httprange import RangeIgnoredError, direct_url, get_into
from .direct import DirectStream
from .bytesource import Part

__all__ = ["RemoteError", "RemoteChangedError", "RemoteOptions", "RemoteFile", "RemoteSource",
           "RemoteStream", "filesystem", "is_url", "safe_url", "stat_remote", "with_timeout"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_BACKOFF_MAX = 5.0


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def safe_url(url: str) -> str:
    """``url`` without user info and query (presigned URLs carry their signature there)."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*://)(?:[^/@]*@)?([^?#]*)", url)
    return (m.group(1) + m.group(2)) if m else url.split("?", 1)[0]



class RemoteChangedError(RemoteError):
    """A remote file differs from the one whose metadata was read (ETag or size)."""


@dataclass(frozen=True)
class RemoteOptions:
    """How to reach and read remote databases (picklable; sent to reader processes).

    ``storage_options`` go to fsspec (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``,
    ``{"anon": True}``); ``cache_dir`` (None: no cache) keeps fetched blocks on local
    disk, at most ``cache_bytes`` (NOTE [ block cache ] in :mod:`seqloader.read.remotecache`);
    ``timeout`` bounds one GET (seconds), ``retries`` the attempts per GET; ``block``
    is the GET size and ``depth`` how many run at once."""

    storage_options: dict = field(default_factory=dict)
    cache_dir: str | None = None
    cache_bytes: int = 0
    timeout: float = 60.0
    retries: int = 8
    block: int = 8 << 20
    depth: int = 4

    def __post_init__(self) -> None:
        if self.cache_dir is not None and self.cache_bytes <= 0:
            raise ValueError(f"cache_dir={self.cache_dir!r} needs a size limit: pass "
                             "cache_bytes > 0 (e.g. 200 << 30 for 200 GiB)")
        if self.block <= 0 or self.block % 4096:
            raise ValueError(f"block must be a positive multiple of 4096, got {self.block}")
        if not self.timeout > 0 or self.retries < 1 or self.depth < 1:
            raise ValueError(f"timeout ({self.timeout!r}) must be > 0, retries ({self.retries!r}) "
                             f"and depth ({self.depth!r}) >= 1")


def with_timeout(options: RemoteOptions | None, timeout: float) -> RemoteOptions | None:
    """``options`` with each GET bounded by ``timeout`` s too (a Loader's ``timeout``;
    0: no change)."""
    if not timeout:
        return options
    options = options or RemoteOptions()
    if options.timeout <= timeout:
        return options
    return dataclasses.replace(options, timeout=float(timeout))


_FS: dict[tuple, tuple[Any, str]] = {}  # (pid, url, options) -> (filesystem, path)


def filesystem(url: str, options: RemoteOptions) -> tuple[Any, str]:
    """The fsspec filesystem and in-filesystem path of ``url``, made once per process."""
    key = (os.getpid(), url, repr(sorted(options.storage_options.items())))
    if key not in _FS:
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"reading {safe_url(url)} needs fsspec (and the package of its "
                              "protocol, e.g. s3fs): pip install 'seqloader[remote]'") from None
        try:
            _FS[key] = fsspec.core.url_to_fs(url, **options.storage_options)
        except ImportError as e:
            raise ImportError(f"reading {safe_url(url)}: {e}") from None
    return _FS[key]


_PLAIN: dict[tuple, Any] = {}  # (pid, url, options) -> what direct_url gave


def _plain(f: "RemoteFile") -> str | None:
    """The plain URL to GET ``f``'s bytes from now, or None for fsspec (NOTE [ plain
    ranged GETs ] in :mod:`seqloader.read.httprange`)."""
    key = (os.getpid(), f.url, repr(sorted(f.options.storage_options.items())))
    if key not in _PLAIN:
        fs, path = filesystem(f.url, f.options)
        version = fs.split_path(path)[2] if hasattr(fs, "split_path") else None
        _PLAIN[key] = None if version else direct_url(f.url, fs, path,
                                                      bool(f.options.storage_options))
    make = _PLAIN[key]
    return None if make is None else make()


@dataclass(frozen=True)
class RemoteFile:
    """One remote file as it was when opened: its ``size`` and ``etag`` (None when the
    store gives none: then only the size is checked)."""

    url: str
    size: int
    etag: str | None
    options: RemoteOptions

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the file as opened, retried on transient errors
        (NOTE [ remote reading ]); :class:`RemoteError` when they cannot be had."""
        return self._fetch(start, end, None)

    def fetch_into(self, start: int, buf: memoryview) -> None:
        """:meth:`fetch` of ``len(buf)`` bytes from ``start``, written into ``buf``."""
        self._fetch(start, start + len(buf), buf)

    def _fetch(self, start: int, end: int, buf: memoryview | None) -> bytes | None:
        """The bytes (``buf`` None), or None once written into ``buf``."""
        if not 0 <= start <= end <= self.size:
            raise ValueError(f"range [{start}, {end}) outside {safe_url(self.url)} "
                             f"({self.size} bytes)")
        if start == end:
            return None if buf is not None else b""
        opts = self.options
        last: BaseException | None = None
        for attempt in range(opts.retries):
            if attempt:
                time.sleep(min(_BACKOFF_MAX, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.0))
            try:
                plain = _plain(self)
                if plain is not None:  # NOTE [ plain ranged GETs ]
                    out = buf if buf is not None else memoryview(bytearray(end - start))
                    get_into(plain, start, out, self.etag, opts.timeout, self.size)
                    return None if buf is not None else bytes(out)
                data = self._get(start, end)
            except Exception as e:  # noqa: BLE001 - classified below
                kind = _classify(e)
                if kind == "changed":
                    raise self._changed(start, end) from None
                if kind == "permanent":
                    raise RemoteError(f"{safe_url(self.url)} bytes {start}-{end - 1}: "
                                      f"{_describe(e, self.url)}") from None
                last = e
                continue
            if len(data) == end - start:
                if buf is None:
                    return data
                buf[:] = data
                return None
            if len(data) == self.size and end - start != self.size:
                raise RemoteError(f"{safe_url(self.url)}: {RangeIgnoredError.text}")
            last = EOFError(f"got {len(data)} of {end - start} bytes")
        raise RemoteError(f"{safe_url(self.url)} bytes {start}-{end - 1}: failed {opts.retries} "
                          f"times, last: {_describe(last, self.url)}; is the server reachable?")

    def _changed(self, start: int, end: int) -> RemoteChangedError:
        return RemoteChangedError(
            f"{safe_url(self.url)} bytes {start}-{end - 1}: the file changed on the server "
            f"since it was opened (ETag {self.etag}, {self.size} bytes); open it again: "
            "create a new Loader")

    def _get(self, start: int, end: int) -> bytes:
        """One GET, cancelled after ``timeout`` seconds."""
        fs, path = filesystem(self.url, self.options)
        timeout = self.options.timeout
        if not getattr(fs, "async_impl", False):
            return fs.cat_file(path, start=start, end=end)
        from fsspec.asyn import sync

        if hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):
            return sync(fs.loop, _s3_get, fs, path, start, end, self.etag, timeout=timeout)
        kwargs = {}
        if self.etag and "http" in _protocols(fs):
            kwargs["headers"] = {"If-Match": self.etag}
        return sync(fs.loop, fs._cat_file, path, start=start, end=end, timeout=timeout, **kwargs)

    def check_unchanged(self) -> None:
        """Compare the file's size and ETag now with those at opening (one HEAD)."""
        current = stat_remote(self.url, self.options)
        if current.size != self.size or (self.etag and current.etag and current.etag != self.etag):
            raise self._changed(0, self.size)


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


async def _s3_get(fs: Any, path: str, start: int, end: int, etag: str | None) -> bytes:
    bucket, key, version = fs.split_path(path)
    kwargs = {"Range": f"bytes={start}-{end - 1}"}
    if etag:
        kwargs["IfMatch"] = etag
    if version:
        kwargs["VersionId"] = version
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kwargs)
    try:
        return await resp["Body"].read()
    finally:
        resp["Body"].close()


def _status(e: BaseException) -> int | None:
    """The HTTP status behind ``e`` (aiohttp's, botocore's), following its causes."""
    seen = 0
    while e is not None and seen < 8:
        status = getattr(e, "status", None)  # (not `code`: aiohttp's payload errors carry 400)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            code = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def _classify(e: BaseException) -> str:
    """``"changed"``, ``"permanent"`` or ``"transient"`` (retried)."""
    status = _status(e)
    if status == 412:
        return "changed"
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotImplementedError,
                      ValueError)):
        return "permanent"
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return "permanent"
    return "transient"


def _describe(e: BaseException | None, url: str) -> str:
    """A one-line description of ``e`` with the URL's credentials and query removed."""
    if e is None:
        return "no error recorded"
    status = _status(e)
    text = f"{type(e).__name__}" + (f" (HTTP {status})" if status else "")
    detail = str(e).replace(url, safe_url(url))
    detail = re.sub(r"([?&](?:X-Amz-[A-Za-z-]+|Signature|sig|token)=)[^&\s'\"]*", r"\1...",
                    detail, flags=re.I)
    detail = re.sub(r"://[^/@\s]*@", "://", detail)
    return f"{text}: {detail[:300]}" if detail else text


# ------------------------------------------------------------------ opening


@dataclass(frozen=True)
class RemoteSource:
    """The remote shard files of a :class:`~seqloader.read.database.Database`, as opened."""

    files: tuple[RemoteFile, ...]
    options: RemoteOptions


def stat_remote(url: str, options: RemoteOptions) -> RemoteFile:
    fs, path = filesystem(url, options)
    try:
        fs.invalidate_cache(path)  # (fsspec may answer from a listing it cached earlier)
        info = fs.info(path)
    except FileNotFoundError:
        raise NotFoundError(f"database {safe_url(url)} does not exist") from None
    except Exception as e:  # noqa: BLE001 - named, credentials removed
        if _classify(e) == "permanent":
            raise RemoteError(f"{safe_url(url)}: {_describe(e, url)}") from None
        raise RemoteError(f"{safe_url(url)}: cannot be reached: {_describe(e, url)}") from None
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
    block cache when ``options.cache_dir`` is set.  The ``remote``
    :class:`~seqloader.read.bytesource.ByteSource`."""

    name = "remote"

    def __init__(self, source: RemoteSource, window: int = 128 << 20):
        opts = source.options
        super().__init__(window=max(window, 2 * opts.block), block=opts.block, depth=opts.depth)
        self.files = {f.url: f for f in source.files}
        # one block may take every attempt, each up to the timeout, plus the backoffs
        self.read_timeout = opts.retries * (opts.timeout + _BACKOFF_MAX) + 10
        self.cache = None
        if opts.cache_dir is not None:
            from .remotecache import BlockCache

            self.cache = BlockCache(opts.cache_dir, opts.cache_bytes, opts.block)
        self.checked: set[str] = set()

    def _file(self, part: Part) -> RemoteFile:
        f = self.files[part.path]
        if part.path not in self.checked and not _if_match_capable(f):
            f.check_unchanged()  # (stores without If-Match: once per stream)
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
        f = self._file(part)
        if self.cache is not None and self.cache.read_into(f, off, buf[:n]):
            return n
        f.fetch_into(off, buf[:n])
        if self.cache is not None:
            self.cache.put(f, off, buf[:n])
        return n

    def _read_alone(self, part: Part, off: int, n: int) -> bytes:
        return self._file(part).fetch(off, off + n)

    def _failure(self, e: OSError, part: Part, off: int, n: int) -> BaseException:
        if isinstance(e, RemoteError):
            return e
        return RemoteError(f"{safe_url(part.path)} bytes {off}-{off + n - 1}: "
                           f"{_describe(e, part.path)}")


def _if_match_capable(f: RemoteFile) -> bool:
    fs, _ = filesystem(f.url, f.options)
    return f.etag is not None and (hasattr(fs, "_call_s3") or "http" in _protocols(fs))

