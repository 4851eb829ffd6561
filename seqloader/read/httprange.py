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
``If-Match`` with the (strong) ETag seen at opening (a 412 is a changed file), and a
reply's own ETag must match the one seen at opening (weakly: so a weak ETag, never sent
in ``If-Match``, still catches a file replaced during a pass).  A GET connects within
``connect_timeout`` and is bounded by ``timeout`` as a whole, body included, not per
socket read: a watchdog thread shuts down the socket of a GET past its deadline
(NOTE [ whole-request deadline ]).  A reply's Content-Length must be the range's length,
and redirects (301, 302, 303, 307, 308) are followed up to :data:`MAX_REDIRECTS` times
within the same deadline.  :func:`interrupt` shuts down the sockets of every GET started
with one ``abort`` event (a stream giving up), so no thread stays blocked in a read.

NOTE [ whole-request deadline ]
A socket timeout bounds one ``recv``: a server that sends its body at 1 KB/s answers
every ``recv`` in time and a 8 MiB GET then takes two hours.  Checking the clock between
pieces of the body does not help either (a ``readinto`` of a piece loops over ``recv``
s).  So each GET registers its socket and deadline with one watchdog thread per process,
which shuts the socket down once the deadline has passed; the blocked read then fails
at once and the GET raises ``TimeoutError``.  The data path is unchanged (one
``readinto`` per MiB); registering costs a lock and a heap push per GET.
"""
from __future__ import annotations

import heapq
import http.client
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from typing import Callable

__all__ = ["MAX_REDIRECTS", "ChangedReplyError", "HTTPStatusError", "RangeIgnoredError",
           "RedirectError", "direct_url", "get_into", "interrupt"]

_CHUNK = 1 << 20  # read a body in pieces this large
_SIGN_SECONDS = 6 * 3600
#: Redirects followed per GET (a loop or a longer chain is a permanent error).
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


class HTTPStatusError(OSError):
    """A ranged GET answered with ``status`` (:func:`~seqloader.read.remotefaults.classify` sorts it)."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status} {reason}")
        self.status = status


class RangeIgnoredError(ValueError):
    """The server answered a ranged GET with the whole file (a permanent error)."""

    text = ("the server ignores Range requests (answered a ranged GET with the whole "
            "file); serve it from a server that supports them")


class RedirectError(ValueError):
    """A GET was redirected more than :data:`MAX_REDIRECTS` times, or nowhere (permanent)."""


class ChangedReplyError(OSError):
    """A reply's ETag differs from the one the file had when opened (a changed file)."""

    status = 412  # (sorted as a changed file by remotefaults.classify)


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


class _Watchdog:
    """Shuts down the sockets of GETs past their deadline (NOTE [ whole-request deadline ]).
    One daemon thread per process, started on first use, asleep until the nearest
    deadline."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int, socket.socket]] = []
        self.live: set[int] = set()  # tokens of GETs still running
        self.token = 0
        self.pid = -1

    def watch(self, sock: socket.socket, deadline: float) -> int:
        with self.cond:
            if self.pid != os.getpid():  # (first use: no thread yet)
                self.heap, self.live, self.pid = [], set(), os.getpid()
                threading.Thread(target=self._run, name="seqloader-http-deadline",
                                 daemon=True).start()
            self.token += 1
            heapq.heappush(self.heap, (deadline, self.token, sock))
            self.live.add(self.token)
            if self.heap[0][1] == self.token:
                self.cond.notify()
            return self.token

    def done(self, token: int) -> bool:
        """The GET of ``token`` ended; False when its socket was shut down (not reusable)."""
        with self.cond:
            if token in self.live:
                self.live.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self.cond:
            while True:
                while self.heap and self.heap[0][1] not in self.live:
                    heapq.heappop(self.heap)  # (finished GETs)
                if not self.heap:
                    self.cond.wait()
                    continue
                left = self.heap[0][0] - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                _, token, sock = heapq.heappop(self.heap)
                self.live.discard(token)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


_watchdog = _Watchdog()


def _after_fork() -> None:
    """A forked child gets a watchdog of its own (its parent's lock may be held and its
    thread is not there)."""
    global _watchdog
    _watchdog = _Watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


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
             abort: threading.Event | None = None, expect_etag: str | None = None) -> int:
    """GET bytes ``[start, start + len(buf))`` of ``url`` (a file of ``size`` bytes) into
    ``buf``; returns ``len(buf)``.  ``etag`` (strong) is sent as ``If-Match``;
    ``expect_etag`` (weak or strong) is compared with the reply's.  Raises
    :class:`HTTPStatusError` for a status other than 206 (200 for a whole-file range),
    :class:`ChangedReplyError` for another ETag, :class:`RedirectError`, ``TimeoutError``
    past ``timeout`` seconds (the whole request, redirects and body included: NOTE
    [ whole-request deadline ]), and the connection's own errors; the caller retries.
    Reentrant across threads (one keep-alive connection per thread and server)."""
    deadline = time.monotonic() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        moved = _get_once(url, start, buf, etag, timeout, deadline, size, connect_timeout,
                          abort, expect_etag)
        if moved is None:
            return len(buf)
        url = urllib.parse.urljoin(url, moved)
    raise RedirectError(f"redirected more than {MAX_REDIRECTS} times (last to "
                        f"{url.split('?', 1)[0]}); point the URL at the file itself")


def _same_etag(a: str, b: str) -> bool:
    """RFC 9110's weak comparison (``W/"x"`` equals ``"x"``)."""
    return a.removeprefix("W/").removeprefix("w/") == b.removeprefix("W/").removeprefix("w/")


def _get_once(url: str, start: int, buf: memoryview, etag: str | None, timeout: float,
              deadline: float, size: int, connect_timeout: float | None,
              abort: threading.Event | None, expect_etag: str | None) -> str | None:
    """One GET of :func:`get_into`: None once ``buf`` is filled, or where it redirects."""
    n = len(buf)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RedirectError(f"redirected to {url.split('?', 1)[0]!r}, not an http(s) URL")
    conn = _connection(parts, timeout)
    target = parts.path + ("?" + parts.query if parts.query else "")
    headers = {"Range": f"bytes={start}-{start + n - 1}", "Accept-Encoding": "identity"}
    if etag:
        headers["If-Match"] = etag
    done, resp, token = False, None, None
    me = threading.get_ident()
    try:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"GET took longer than {timeout:g} s")
        if conn.sock is None:
            conn.timeout = min(left, connect_timeout or left)
            conn.connect()
        sock = conn.sock  # (a response that closes the connection takes it over)
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        wd = _watchdog
        token = wd.watch(sock, deadline)
        if abort is not None:
            with _lock:
                _active[me] = (abort, sock)
            if abort.is_set():
                raise ConnectionAbortedError("the read was stopped")
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        if resp.status in _REDIRECTS:
            location = resp.getheader("Location")
            resp.read(64 << 10)
            if not location:
                raise RedirectError(f"HTTP {resp.status} {resp.reason} without a Location")
            done = not resp.will_close
            return location
        whole = resp.status == 200 and start == 0 and n == size
        if resp.status != 206 and not whole:
            resp.read(64 << 10)
            if resp.status == 200:
                raise RangeIgnoredError(RangeIgnoredError.text)
            raise HTTPStatusError(resp.status, resp.reason)
        got_etag = resp.getheader("ETag")
        if expect_etag and got_etag and not _same_etag(got_etag, expect_etag):
            raise ChangedReplyError(f"the reply's ETag {got_etag} differs from {expect_etag}")
        if resp.length is not None and resp.length != n:
            raise EOFError(f"the reply's Content-Length ({resp.length} bytes) differs from "
                           f"the range asked for ({n} bytes)")
        got = 0
        while got < n:
            k = resp.readinto(buf[got:got + min(_CHUNK, n - got)])
            if not k:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"GET took longer than {timeout:g} s")
                raise EOFError(f"connection closed after {got} of {n} bytes")
            got += k
        done = not resp.will_close and resp.length == 0  # (chunked: not reused)
        return None
    except OSError as e:
        if (token is not None and time.monotonic() >= deadline
                and not isinstance(e, (HTTPStatusError, ChangedReplyError))):
            raise TimeoutError(f"GET took longer than {timeout:g} s") from None  # (watchdog)
        raise
    finally:
        if token is not None and not wd.done(token):
            done = False
        if abort is not None:
            with _lock:
                _active.pop(me, None)
        if not done:
            if resp is not None:
                resp.close()
            _drop(parts)
