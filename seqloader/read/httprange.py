"""Ranged GETs over plain HTTP(S) straight into a caller's buffer (the remote reader's data path).

NOTE [ plain ranged GETs ]
fsspec's async clients (aiohttp, aiobotocore) hand a body to the caller through an event
loop that wakes for every few TCP segments: over a 1 Gbit/s link that cost ~2.8 ms of
CPU per MB read, on the core that also decodes.  A blocking ``http.client`` connection
per reader thread reads the body with ``readinto`` into the ring buffer itself: ~1.1
ms/MB, and one copy fewer (figures: benchmarks/RESULTS.md, "Remote reading").  So the
data GETs of a remote database take this path where it serves the same bytes:

* ``http://`` / ``https://`` URLs read with no ``storage_options`` (which could carry
  headers or auth that only fsspec applies) and no user info;
* object stores whose fsspec filesystem can ``sign`` a URL (s3fs; gcsfs and adlfs
  with the right credentials): the GET goes to the presigned URL, made again before
  half its lifetime has passed.  Credentials never leave fsspec's client, and the
  presigned URL (its signature is in the query) is never printed: errors name the
  file's own URL (``safe_url``).

Everything else -- listings, HEADs, metadata reads, a proxy from the environment
(``http_proxy`` ...), a store that cannot sign -- stays on fsspec.  Each GET carries
``If-Match`` with the (strong) ETag seen at opening (a 412 is a changed file), connects
within ``connect_timeout`` and is bounded by ``timeout`` as a whole, not per socket
read; :func:`interrupt` shuts down the sockets of every GET started with one ``abort``
event (a stream giving up), so no thread stays blocked in a read.
"""
from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from typing import Callable

__all__ = ["HTTPStatusError", "RangeIgnoredError", "direct_url", "get_into", "interrupt"]

_CHUNK = 1 << 20  # read a body in pieces this large, checking the deadline between them
_SIGN_SECONDS = 6 * 3600


class HTTPStatusError(OSError):
    """A ranged GET answered with ``status`` (:func:`~seqloader.read.remotefaults.classify` sorts it)."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


class RangeIgnoredError(ValueError):
    """The server answered a ranged GET with the whole file (a permanent error)."""

    text = ("the server ignores Range requests (answered a ranged GET with the whole "
            "file); serve it from a server that supports them")


_local = threading.local()
_signed: dict[tuple, tuple[float, str]] = {}
_lock = threading.Lock()
_active: dict[int, tuple[threading.Event, socket.socket]] = {}  # thread id -> its GET


def interrupt(abort: threading.Event) -> None:
    """Shut down the sockets of the GETs in flight that were started with ``abort``
    (their reads then fail at once)."""
    with _lock:
        socks = [s for a, s in _active.values() if a is abort]
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _no_proxy_for(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    return parts.scheme not in proxies or bool(urllib.request.proxy_bypass(parts.hostname or ""))


def direct_url(url: str, fs, path: str, has_options: bool) -> Callable[[], str | None]:
    """A function giving the plain URL to GET for ``url`` now (None: use fsspec), or None
    when this file cannot take the plain path at all (NOTE [ plain ranged GETs ])."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        if has_options or "@" in urllib.parse.urlsplit(url).netloc or not _no_proxy_for(url):
            return None
        return lambda: url
    if not callable(getattr(fs, "sign", None)):
        return None
    key = (os.getpid(), id(fs), path)

    def signed() -> str | None:
        with _lock:
            made = _signed.get(key)
            if made is None or time.monotonic() - made[0] > _SIGN_SECONDS / 2:
                try:
                    u = str(fs.sign(path, expiration=_SIGN_SECONDS))
                except Exception:  # noqa: BLE001 - e.g. NotImplementedError, no credentials
                    u = ""
                usable = u.startswith(("http://", "https://")) and _no_proxy_for(u)
                made = _signed[key] = (time.monotonic(), u if usable else "")
        return made[1] or None

    return signed


def _connection(parts: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    conns = getattr(_local, "conns", None)
    if conns is None or getattr(_local, "pid", None) != os.getpid():
        conns = _local.conns = {}  # (a forked child must not share its parent's sockets)
        _local.pid = os.getpid()
    key = (parts.scheme, parts.hostname, parts.port)
    conn = conns.get(key)
    if conn is None:
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        conns[key] = conn
    return conn


def _drop(parts: urllib.parse.SplitResult) -> None:
    conn = getattr(_local, "conns", {}).pop((parts.scheme, parts.hostname, parts.port), None)
    if conn is not None:
        conn.close()


def get_into(url: str, start: int, buf: memoryview, etag: str | None, timeout: float,
             size: int, *, connect_timeout: float | None = None,
             abort: threading.Event | None = None) -> int:
    """GET bytes ``[start, start + len(buf))`` of ``url`` (a file of ``size`` bytes) into
    ``buf``; returns ``len(buf)``.  Raises :class:`HTTPStatusError` for a status other
    than 206 (200 for a whole-file range), ``TimeoutError`` past ``timeout`` seconds, and
    the connection's own errors; the caller retries.  Reentrant across threads (one
    keep-alive connection per thread and server)."""
    n = len(buf)
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout
    conn = _connection(parts, timeout)
    target = parts.path + ("?" + parts.query if parts.query else "")
    headers = {"Range": f"bytes={start}-{start + n - 1}", "Accept-Encoding": "identity"}
    if etag:
        headers["If-Match"] = etag
    done, resp = False, None
    me = threading.get_ident()
    try:
        if conn.sock is None:
            conn.timeout = min(timeout, connect_timeout or timeout)
            conn.connect()
        sock = conn.sock  # (a response that closes the connection takes it over)
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        if abort is not None:
            with _lock:
                _active[me] = (abort, sock)
            if abort.is_set():
                raise ConnectionAbortedError("the read was stopped")
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        whole = resp.status == 200 and start == 0 and n == size
        if resp.status != 206 and not whole:
            resp.read(64 << 10)
            if resp.status == 200:
                raise RangeIgnoredError(RangeIgnoredError.text)
            raise HTTPStatusError(resp.status, resp.reason)
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"GET took longer than {timeout:g} s")
            sock.settimeout(left)
            k = resp.readinto(buf[got:got + min(_CHUNK, n - got)])
            if not k:
                raise EOFError(f"connection closed after {got} of {n} bytes")
            got += k
        if resp.length:  # (more than asked for: do not reuse the connection)
            raise EOFError(f"the server sent {resp.length} bytes more than the range")
        done = not resp.will_close
        return got
    finally:
        if abort is not None:
            with _lock:
                _active.pop(me, None)
        if not done:
            if resp is not None:
                resp.close()
            _drop(parts)
