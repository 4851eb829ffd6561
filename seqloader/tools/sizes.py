"""A size on the command line: ``4G``, ``512M``, ``100000`` -- the one parser of
``--memory-budget``, ``--shard-size`` and every other SIZE argument."""
from __future__ import annotations

import argparse
import math

__all__ = ["size_arg"]

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size_arg(text: str) -> int:
    """``text`` as a number of bytes (binary units K, M, G, T; a trailing ``B`` or ``iB``
    is allowed): an argparse ``type``.  Raises :class:`argparse.ArgumentTypeError` for
    anything that is not a finite positive size (``inf``, ``nan``, ``-1G``, ``0``)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        n = float(t[:-1]) * _UNITS[t[-1]] if t and t[-1] in _UNITS else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: give a number of bytes such as 4G, 512M or 1000000") from None
    if not math.isfinite(n):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite size: give a number of bytes such as 4G or 512M")
    if not n >= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a size must be at least 1 byte (such as 4G or 512M)")
    return int(n)
