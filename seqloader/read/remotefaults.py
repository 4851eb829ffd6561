"""The fault policy of remote reading: time budgets, retries, and errors that name the cause.

NOTE [ remote time budget ]
Every remote request -- data GETs, HEADs, listings, ``exists`` -- runs under one policy
(:func:`retrying`), so no call can wait forever and the same faults get the same answer:

* each attempt connects within ``connect_timeout`` and completes within ``timeout``
  seconds (a GET as a whole, not per socket read; fsspec calls are cancelled then);
* attempts that fail on a transient fault (timeout, refused or reset connection, 5xx,
  throttling, a cut body) are retried with exponential backoff (0.1 s doubling, at most
  ``_BACKOFF_MAX`` s, jittered) until ``deadline`` seconds have passed since the first
  attempt or ``retries`` attempts were made: the default 60 s rides out a server or
  proxy restart of ~30-45 s, and a dead or silent server is reported in at most
  ``deadline`` (+ one ``connect_timeout``) seconds;
* permanent faults are raised at once: 401/403 and missing or partial credentials
  (:class:`RemoteAccessError`), 404 (:class:`RemoteNotFoundError`), 412, 416 (a range
  inside the size seen at opening) or a changed size (:class:`RemoteChangedError`); a
  ``FileNotFoundError`` that only wraps another
  failure (fsspec's HTTP ``info`` turns a refused connection into one) is classified
  by that failure, so a dead server is never "not found";
  an exhausted budget raises :class:`RemoteTimeoutError` when the last attempt timed out,
  else :class:`RemoteUnreachableError`;
* a refused connection is said once per server and process, at its first retry (a
  ``RuntimeWarning``: "URL: connection refused; retrying until HH:MM:SS"), so a
  restart that is being waited for is not a minute of silence;
* an ``abort`` event (set by the stream when one block has failed, or closed) stops
  every other block's retries at once: the first error is raised, nothing keeps
  retrying behind it, and the process exits promptly.

Every message passes through :func:`redact`: URLs lose their user info and query
(presigned signatures live there), storage options their secrets.
"""
from __future__ import annotations

import os
import random
import re
import threading
import time
import warnings
from typing import Any, Callable, TypeVar

from ..errors import (RemoteAccessError, RemoteChangedError, RemoteError, RemoteNotFoundError,
                      RemoteTimeoutError, RemoteUnreachableError)

__all__ = ["BACKOFF_MAX", "Aborted", "safe_url", "redact", "redact_options", "status_of",
           "classify", "describe", "error_for", "retrying", "call_with_timeout"]

BACKOFF_MAX = 5.0
T = TypeVar("T")

_SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|key|auth|signature|session",
                         re.I)


class Aborted(Exception):
    """Raised in a read thread when its stream gave up (another block failed)."""


def safe_url(url: str) -> str:
    """``url`` without user info and query (presigned URLs carry their signature there)."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*://)(?:[^/@]*@)?([^?#]*)", url)
    return (m.group(1) + m.group(2)) if m else url.split("?", 1)[0]


def redact(text: str, url: str | None = None) -> str:
    """``text`` with ``url`` shown as :func:`safe_url`, any URL's user info removed and
    signature-like query parameters elided."""
    if url:
        text = text.replace(url, safe_url(url))
    text = re.sub(r"([?&](?:X-Amz-[A-Za-z-]+|Signature|sig|token|Expires|AWSAccessKeyId)=)"
                  r"[^&\s'\"]*", r"\1...", text, flags=re.I)
    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"]*@", r"\1", text)


def redact_options(options: Any) -> Any:
    """A copy of ``storage_options`` with every secret-looking value replaced by ``'***'``
    (keys named like key, secret, token, password, credentials; recursively)."""
    if isinstance(options, dict):
        return {k: ("***" if isinstance(k, str) and _SECRET_KEY.search(k)
                    and not isinstance(v, (dict, bool)) and v is not None
                    else redact_options(v)) for k, v in options.items()}
    if isinstance(options, (list, tuple)):
        return type(options)(redact_options(v) for v in options)
    if isinstance(options, str):
        return redact(options)
    return options


def _chain(e: BaseException | None) -> list[BaseException]:
    out = []
    while e is not None and len(out) < 8:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def status_of(e: BaseException) -> int | None:
    """The HTTP status behind ``e`` (aiohttp's, botocore's), following its causes."""
    for x in _chain(e):
        status = getattr(x, "status", None)  # (not `code`: aiohttp's payload errors carry 400)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        resp = getattr(x, "response", None)
        if isinstance(resp, dict):
            code = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
    return None


def _timed_out(e: BaseException) -> bool:
    return any(isinstance(x, TimeoutError) or "Timeout" in type(x).__name__ for x in _chain(e))


# botocore's errors for credentials that are missing or unusable: nothing a retry changes
# (matched by name: botocore is optional)
_NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError",
                             "ProfileNotFound", "CredentialRetrievalError",
                             "UnknownCredentialError", "NoAuthTokenError"})
_CONFIG_ERRORS = frozenset({"NoRegionError", "InvalidRegionError", "InvalidEndpointConfigurationError",
                            "InvalidS3AddressingStyleError", "ParamValidationError",
                            "UnknownServiceError", "InvalidConfigError"})


def _no_credentials(e: BaseException) -> bool:
    return any(type(x).__name__ in _NO_CREDENTIALS for x in _chain(e))


def _wrapped(e: BaseException) -> BaseException | None:
    """The failure a bare ``FileNotFoundError`` wraps (fsspec's HTTP ``info`` raises
    one ``from`` any error, a refused connection included), else None."""
    cause = e.__cause__
    if (isinstance(e, FileNotFoundError) and not isinstance(e, RemoteError)
            and cause is not None and not isinstance(cause, FileNotFoundError)
            and status_of(e) != 404):
        return cause
    return None


def classify(e: BaseException) -> str:
    """``"changed"``, ``"access"``, ``"missing"``, ``"permanent"`` or ``"transient"``
    (retried) for an attempt's exception."""
    if isinstance(e, Aborted):
        return "permanent"
    cause = _wrapped(e)
    if cause is not None:
        return classify(cause)
    if _no_credentials(e):
        return "access"
    if type(e).__name__ in _CONFIG_ERRORS:
        return "permanent"
    if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__:
        return "transient"  # (whatever status an earlier exception in its context had)
    status = status_of(e)
    if status in (412, 416) or isinstance(e, RemoteChangedError):
        return "changed"  # (416: a range within the size seen at opening is past the end now)
    if status in (401, 403) or isinstance(e, PermissionError):
        return "access"
    if status == 404 or isinstance(e, FileNotFoundError):
        return "missing"
    if isinstance(e, RemoteError):
        return "permanent"
    if isinstance(e, (IsADirectoryError, NotImplementedError, ValueError)):
        return "permanent"
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return "permanent"
    if status is not None or _network(e):
        return "transient"
    return "permanent"  # (a bug, e.g. TypeError: raised at once, not retried)


_NETWORK_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "http.client", "ssl",
                    "socket", "fsspec", "requests", "s3fs", "gcsfs", "adlfs")


def _network(e: BaseException) -> bool:
    """Whether ``e`` is a network or server fault (worth another attempt)."""
    if isinstance(e, (OSError, EOFError, TimeoutError)):
        return True
    return any(c.__module__.split(".")[0] in _NETWORK_MODULES or c.__module__ in _NETWORK_MODULES
               for c in type(e).__mro__)


def describe(e: BaseException | None, url: str = "") -> str:
    """A one-line description of ``e``, credentials and query removed."""
    if e is None:
        return "no error recorded"
    e = _wrapped(e) or e
    status = status_of(e)
    text = f"{type(e).__name__}" + (f" (HTTP {status})" if status else "")
    detail = redact(str(e), url or None)
    return f"{text}: {detail[:300]}" if detail else text


_BUDGET = ("RemoteOptions(timeout=..., deadline=...) in Python, --remote-timeout / "
           "--remote-deadline on the command line set the budget")
_HINT = {
    RemoteAccessError: "check the credentials (storage_options, AWS_* variables, ~/.aws) and "
                       "the permissions on the bucket or path",
    RemoteNotFoundError: "check the URL (bucket, path, split)",
    RemoteTimeoutError: "the server accepts connections but does not answer in time; is it "
                        f"overloaded or hung? ({_BUDGET})",
    RemoteUnreachableError: "is the server reachable? (how long an outage is ridden out: "
                            f"{_BUDGET})",
}
_REFUSED_HINT = ("connection refused: is the server running, and are the URL's host and port "
                 f"right? (how long a restart is waited for: {_BUDGET})")
_NO_CREDENTIALS_HINT = (
    "no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
    "AWS_PROFILE) in the environment, write them to ~/.aws/credentials, or pass "
    "RemoteOptions(storage_options={'key': ..., 'secret': ...}); for a public bucket "
    "storage_options={'anon': True}")


def _refused(e: BaseException) -> bool:
    return any(isinstance(x, ConnectionRefusedError)
               or isinstance(getattr(x, "os_error", None), ConnectionRefusedError)
               for x in _chain(e))


def error_for(e: BaseException, where: str, url: str = "", *, attempts: int = 1,
              elapsed: float = 0.0) -> RemoteError:
    """The :class:`RemoteError` subclass naming ``e``'s cause, for a request described
    by ``where`` (already free of credentials)."""
    if isinstance(e, RemoteError):
        return e
    kind = classify(e)
    cls: type[RemoteError]
    if kind == "access":
        cls = RemoteAccessError
    elif kind == "missing":
        cls = RemoteNotFoundError
    elif kind == "changed":
        cls = RemoteChangedError
    elif kind == "transient":
        cls = RemoteTimeoutError if _timed_out(e) else RemoteUnreachableError
    else:
        cls = RemoteError
    tried = (f"failed {attempts} times in {elapsed:.1f} s, last: " if attempts > 1 else "")
    hint, reason = _HINT.get(cls), None
    if cls is RemoteUnreachableError and _refused(e):
        hint, reason = _REFUSED_HINT, "refused"
    elif cls is RemoteAccessError and _no_credentials(e):
        hint, reason = _NO_CREDENTIALS_HINT, "no credentials"
    err = cls(f"{where}: {tried}{describe(e, url)}" + (f"; {hint}" if hint else ""))
    err.reason = reason
    return err


_WARNED: set[tuple[int, str]] = set()  # (pid, server) told of a refused connection


def _say_retrying(e: BaseException, url: str, end: float) -> None:
    """Warn once per server and process that a refused connection is being retried."""
    host = re.sub(r"^[A-Za-z][A-Za-z0-9+.-]*://", "", safe_url(url)).split("/", 1)[0]
    key = (os.getpid(), host)
    if not _refused(e) or key in _WARNED:
        return
    _WARNED.add(key)
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + end - time.monotonic()))
    warnings.warn(f"{safe_url(url)}: connection refused; retrying until {until} (the "
                  f"remote deadline; {_BUDGET})", RuntimeWarning, stacklevel=3)


def retrying(call: Callable[[float], T], where: str, url: str, options: Any, *,
             abort: threading.Event | None = None) -> T:
    """``call(attempt_timeout)`` under NOTE [ remote time budget ]: retried on transient
    faults until ``options.deadline`` or ``options.retries``; a :class:`RemoteError`
    naming the cause otherwise."""
    start = time.monotonic()
    end = start + options.deadline
    last: BaseException | None = None
    attempt = 0
    while True:
        if abort is not None and abort.is_set():
            raise Aborted(where)
        left = end - time.monotonic()
        budget = max(0.05, min(options.timeout, left))
        try:
            return call(budget)
        except Aborted:
            raise
        except Exception as e:  # noqa: BLE001 - classified
            if abort is not None and abort.is_set():
                raise Aborted(where) from None
            attempt += 1
            if classify(e) != "transient":
                raise error_for(e, where, url) from None
            # (an attempt cut short by the deadline's remainder says less than the
            # failure before it, e.g. a refused connection)
            if not (last is not None and _timed_out(e) and not _timed_out(last)
                    and budget < options.timeout):
                last = e
        delay = min(BACKOFF_MAX, 0.1 * 2 ** attempt) * random.uniform(0.5, 1.0)
        left = end - time.monotonic()
        if attempt >= options.retries or left <= 0.05:
            raise error_for(last, where, url, attempts=attempt,
                            elapsed=time.monotonic() - start) from None
        delay = min(delay, left - 0.05)
        _say_retrying(last, url, end)
        if abort is not None:
            if abort.wait(delay):
                raise Aborted(where)
        else:
            time.sleep(delay)


def call_with_timeout(fs: Any, name: str, path: str, timeout: float, *args: Any,
                      **kwargs: Any) -> Any:
    """``fs.<name>(path, *args, **kwargs)`` (an fsspec method: ``info``, ``ls``...)
    cancelled after ``timeout`` seconds: through the event loop for async filesystems,
    else in a daemon thread that is abandoned on timeout."""
    if getattr(fs, "async_impl", False) and hasattr(fs, "_" + name):
        from fsspec.asyn import sync

        return sync(fs.loop, getattr(fs, "_" + name), path, *args, timeout=timeout, **kwargs)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = getattr(fs, name)(path, *args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box["error"] = e
    t = threading.Thread(target=run, name="seqloader-remote-call", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{name} took longer than {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
