"""The command line's remote options: the time budget (``--remote-timeout``,
``--remote-deadline``: NOTE [ remote time budget ] in :mod:`seqloader.read.remotefaults`)
and how to reach S3 (``--endpoint-url``, ``--anon``, spelled as the aws and s3fs tools
spell them), for every command that opens a URL."""
from __future__ import annotations

import argparse

from ..read.remote import (RemoteOptions, is_url, safe_url, set_default_budget,
                           set_default_storage_options)

__all__ = ["add_remote_arguments", "apply_remote_arguments", "S3_SCHEMES"]

#: The URL schemes that ``--endpoint-url`` and ``--anon`` apply to (s3fs's).
S3_SCHEMES = ("s3", "s3a")
#: The arguments of the commands that may hold URLs.
_PATH_ARGS = ("path", "sources", "lmdb_dir", "out")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def _endpoint(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL (e.g. "
                                         f"https://s3.example.com), got {text!r}")
    return text


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """Add the remote options to the parser of a command that opens URLs."""
    d = RemoteOptions()
    g = p.add_argument_group("remote (s3://, https://... paths)")
    g.add_argument("--remote-timeout", type=_seconds, metavar="SECONDS",
                   help="longest wait for one request to a URL, connecting included "
                        f"(RemoteOptions.timeout; default {d.timeout:g})")
    g.add_argument("--remote-deadline", type=_seconds, metavar="SECONDS",
                   help="longest time retrying one request or block before the error, "
                        "so also how long an outage or restart is ridden out "
                        f"(RemoteOptions.deadline; default {d.deadline:g})")
    g.add_argument("--endpoint-url", type=_endpoint, metavar="URL",
                   help="s3:// URLs: the endpoint of an S3-compatible store (MinIO, Ceph, "
                        "R2, ...), as aws --endpoint-url (default: AWS, or the "
                        "AWS_ENDPOINT_URL environment variable)")
    g.add_argument("--anon", "--no-sign-request", action="store_true",
                   help="s3:// URLs: send no credentials (a public bucket), as s3fs's "
                        "anon=True and aws --no-sign-request")


def _urls(args: argparse.Namespace) -> list[str]:
    found = []
    for name in _PATH_ARGS:
        value = getattr(args, name, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and is_url(v):
                found.append(v)
    return found


def apply_remote_arguments(args: argparse.Namespace) -> None:
    """Make the budget and S3 options given on the command line the ones URLs are opened
    with (``storage_options`` of :func:`~seqloader.read.remote.default_options`);
    ValueError for S3 options given to a command without an s3:// URL."""
    set_default_budget(timeout=getattr(args, "remote_timeout", None),
                       deadline=getattr(args, "remote_deadline", None))
    storage: dict = {}
    if getattr(args, "endpoint_url", None):
        storage["endpoint_url"] = args.endpoint_url
    if getattr(args, "anon", False):
        storage["anon"] = True
    if storage:
        flags = " and ".join(f for f, k in (("--endpoint-url", "endpoint_url"),
                                            ("--anon", "anon")) if k in storage)
        urls = _urls(args)
        if not urls:
            raise ValueError(f"{flags}: for s3:// URLs, and this command is given none; drop it")
        other = [u for u in urls if u.split("://", 1)[0].lower() not in S3_SCHEMES]
        if other:
            raise ValueError(f"{flags}: for s3:// URLs, not {safe_url(other[0])}; drop it (other "
                             "stores take fsspec's storage_options in Python: RemoteOptions)")
    set_default_storage_options(storage)
