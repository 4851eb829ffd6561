"""The command line's remote time budget: ``--remote-timeout`` and ``--remote-deadline``
(NOTE [ remote time budget ] in :mod:`seqloader.read.remotefaults`)."""
from __future__ import annotations

import argparse

from ..read.remote import RemoteOptions, set_default_budget

__all__ = ["add_remote_arguments", "apply_remote_arguments"]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """Add the remote time budget's options to the parser of a command that opens URLs."""
    d = RemoteOptions()
    g = p.add_argument_group("remote (s3://, https://... paths)")
    g.add_argument("--remote-timeout", type=_seconds, metavar="SECONDS",
                   help="longest wait for one request to a URL, connecting included "
                        f"(RemoteOptions.timeout; default {d.timeout:g})")
    g.add_argument("--remote-deadline", type=_seconds, metavar="SECONDS",
                   help="longest time retrying one request or block before the error, "
                        "so also how long an outage or restart is ridden out "
                        f"(RemoteOptions.deadline; default {d.deadline:g})")


def apply_remote_arguments(args: argparse.Namespace) -> None:
    """Make the budget given on the command line the one URLs are opened with."""
    set_default_budget(timeout=getattr(args, "remote_timeout", None),
                       deadline=getattr(args, "remote_deadline", None))
