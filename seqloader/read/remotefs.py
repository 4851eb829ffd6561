"""How a URL is reached: :class:`RemoteOptions`, the process-wide defaults, the fsspec
filesystem they make, and the protocol-specific GETs through it.

:mod:`seqloader.read.remote` reads files with these (NOTE [ remote reading ]); this
module knows fsspec and the stores behind it (s3fs's own retries turned off, S3's
``GetObject`` with ``IfMatch``, which protocols honour ``If-Match``, the plain URL of
NOTE [ plain ranged GETs ] in :mod:`seqloader.read.httprange`), and nothing of records.
fsspec is imported only when a URL is opened (the ``remote`` extra).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import MissingExtraError
from .httprange import direct_url
from .remotefaults import redact_options, safe_url

__all__ = ["RemoteOptions", "default_options", "filesystem", "plain_url", "protocols",
           "s3_get", "set_default_budget", "set_default_storage_options", "with_timeout",
           "REMOTE_EXTRA", "remote_extra_missing"]


@dataclass(frozen=True)
class RemoteOptions:
    """How to reach and read remote databases (picklable; sent to reader processes).

    ``storage_options`` go to fsspec (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``,
    ``{"anon": True}``); ``cache_dir`` (None: no cache) keeps fetched blocks on local
    disk, at most ``cache_bytes`` (NOTE [ block cache ] in :mod:`seqloader.read.remotecache`);
    ``connect_timeout`` bounds connecting, ``timeout`` one request as a whole,
    ``deadline`` all attempts at one block or call, ``retries`` their number (NOTE
    [ remote time budget ] in :mod:`seqloader.read.remotefaults`); ``block`` is the GET
    size and ``depth`` how many run at once; ``verify`` checks every record as it
    arrives (NOTE [ records checked on arrival ] in :mod:`seqloader.read.remotecheck`)."""

    storage_options: dict = field(default_factory=dict)
    cache_dir: str | None = None
    cache_bytes: int = 0
    timeout: float = 20.0
    retries: int = 30
    block: int = 8 << 20
    depth: int = 4
    connect_timeout: float = 5.0
    deadline: float = 60.0
    verify: bool = True

    def __repr__(self) -> str:  # (storage_options may hold secrets)
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                           if f.name != "storage_options")
        return (f"RemoteOptions(storage_options={redact_options(self.storage_options)!r}, "
                f"{fields})")

    def __post_init__(self) -> None:
        if self.cache_dir is not None and self.cache_bytes <= 0:
            raise ValueError(f"cache_dir={self.cache_dir!r} needs a size limit: pass "
                             "cache_bytes > 0 (e.g. 200 << 30 for 200 GiB)")
        if self.block <= 0 or self.block % 4096:
            raise ValueError(f"block must be a positive multiple of 4096, got {self.block}")
        if not (self.timeout > 0 and self.connect_timeout > 0 and self.deadline > 0) \
                or self.retries < 1 or self.depth < 1:
            raise ValueError(f"timeout ({self.timeout!r}), connect_timeout "
                             f"({self.connect_timeout!r}) and deadline ({self.deadline!r}) must "
                             f"be > 0, retries ({self.retries!r}) and depth ({self.depth!r}) >= 1")


_DEFAULT_BUDGET: dict[str, float] = {}


def set_default_budget(timeout: float | None = None, deadline: float | None = None) -> None:
    """Set the time budget of :func:`default_options` (what a URL is opened with when
    no ``RemoteOptions`` is given): ``timeout`` per request (connecting too), ``deadline``
    per block or call.  For the whole process: the command line's ``--remote-timeout``
    and ``--remote-deadline``; code passes ``RemoteOptions`` instead."""
    for name, value in (("timeout", timeout), ("deadline", deadline)):
        if value is not None:
            if not value > 0:
                raise ValueError(f"the remote {name} must be > 0 seconds, got {value!r}")
            _DEFAULT_BUDGET[name] = float(value)


_DEFAULT_STORAGE: dict = {}


def set_default_storage_options(storage_options: dict) -> None:
    """Set (replace) the ``storage_options`` of :func:`default_options`: for the whole
    process, the command line's ``--anon`` and ``--endpoint-url``; code passes
    ``RemoteOptions(storage_options=...)`` instead."""
    _DEFAULT_STORAGE.clear()
    _DEFAULT_STORAGE.update(storage_options)


def default_options() -> RemoteOptions:
    """``RemoteOptions()`` with the budget :func:`set_default_budget` and the storage
    options :func:`set_default_storage_options` set, if any."""
    t, d = _DEFAULT_BUDGET.get("timeout"), _DEFAULT_BUDGET.get("deadline")
    o = RemoteOptions(storage_options=dict(_DEFAULT_STORAGE))
    return dataclasses.replace(
        o, timeout=o.timeout if t is None else t,
        connect_timeout=o.connect_timeout if t is None else min(o.connect_timeout, t),
        deadline=o.deadline if d is None else d)


def with_timeout(options: RemoteOptions | None, timeout: float) -> RemoteOptions | None:
    """``options`` with every request and block bounded by ``timeout`` s too (a Loader's
    ``timeout``, which then is the longest wait for any remote answer; 0: no change)."""
    if not timeout:
        return options
    options = options or default_options()
    t = float(timeout)
    return dataclasses.replace(options, timeout=min(options.timeout, t),
                               connect_timeout=min(options.connect_timeout, t),
                               deadline=min(options.deadline, t))


_FS: dict[tuple, tuple[Any, str]] = {}  # (pid, url, options) -> (filesystem, path)


#: How to install what URLs need (fsspec; aiohttp for http(s)://, s3fs for s3://).
REMOTE_EXTRA = "pip install 'seqloader[remote]'"


def remote_extra_missing(doing: str, e: ImportError) -> MissingExtraError:
    """The one-line error for ``doing`` (``"reading URL"``) without the remote extra:
    what is missing and :data:`REMOTE_EXTRA`.  (fsspec's own message for a missing
    protocol package names packages it does not need, such as requests.)"""
    missing = getattr(e, "name", None) or getattr(e.__cause__, "name", None)
    what = f"{missing} is not installed" if missing else "a package of it is not installed"
    return MissingExtraError(f"{doing} needs seqloader's remote extra ({what}): {REMOTE_EXTRA} "
                             "(in a clone: pip install -c constraints.txt -e '.[remote]')")


def filesystem(url: str, options: RemoteOptions) -> tuple[Any, str]:
    """The fsspec filesystem and in-filesystem path of ``url``, made once per process."""
    key = (os.getpid(), url, repr(sorted(options.storage_options.items())))
    if key not in _FS:
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(url, **options.storage_options)
        except ImportError as e:
            raise remote_extra_missing(f"reading {safe_url(url)}", e) from None
        _FS[key] = (_without_own_retries(fs, options), path)
    return _FS[key]


_OWN: dict[tuple, Any] = {}  # (pid, filesystem class, options) -> s3fs without its retries


def _without_own_retries(fs: Any, options: RemoteOptions) -> Any:
    """For s3fs, an instance of our own that makes one attempt per call (s3fs and
    botocore otherwise retry inside it): NOTE [ remote time budget ] retries, and an
    attempt's error then names its cause (a refused connection, not a timeout after
    minutes of inner retries).  Other filesystems as they are."""
    if not hasattr(fs, "_call_s3") or "config_kwargs" in options.storage_options:
        return fs
    key = (os.getpid(), type(fs), repr(sorted(options.storage_options.items())),
           options.connect_timeout, options.timeout)
    if key not in _OWN:
        # (botocore's own socket timeouts, 60 s by default, at most the budget's: a silent
        # server then fails an attempt, uploads included, within `timeout`)
        own = type(fs)(**options.storage_options, skip_instance_cache=True,
                       config_kwargs={"retries": {"mode": "standard", "max_attempts": 1},
                                      "connect_timeout": options.connect_timeout,
                                      "read_timeout": options.timeout})
        own.retries = 1
        _OWN[key] = own
    return _OWN[key]


_PLAIN: dict[tuple, Any] = {}  # (pid, url, options) -> what direct_url gave


def plain_url(url: str, options: RemoteOptions) -> str | None:
    """The plain URL to GET ``url``'s bytes from now, or None for fsspec (NOTE [ plain
    ranged GETs ] in :mod:`seqloader.read.httprange`)."""
    key = (os.getpid(), url, repr(sorted(options.storage_options.items())))
    if key not in _PLAIN:
        fs, path = filesystem(url, options)
        version = fs.split_path(path)[2] if hasattr(fs, "split_path") else None
        _PLAIN[key] = None if version else direct_url(url, fs, path,
                                                      bool(options.storage_options))
    make = _PLAIN[key]
    return None if make is None else make()


def protocols(fs: Any) -> tuple[str, ...]:
    """The protocol names of fsspec filesystem ``fs`` (``("s3", "s3a")``, ``("http",)``)."""
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


async def s3_get(fs: Any, path: str, start: int, end: int, etag: str | None) -> bytes:
    """Bytes ``[start, end)`` of ``path`` on s3fs filesystem ``fs``: one ``GetObject``,
    with ``IfMatch`` when ``etag`` is given and the path's version when it names one."""
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
