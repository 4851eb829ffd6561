"""Progress bars: the one place that decides whether a bar is drawn.

NOTE [ bars on terminals only ]
A bar is drawn only where someone watches it: when it is asked for (``progress=True``,
no ``--no-progress``) and stderr is a terminal.  Redirected to a log file or a pipe
(``seqloader verify DIR 2>log``, a batch job, ``... | head``), a tqdm bar is hundreds
of carriage-return redraws that bury the messages; there it is not drawn at all.
"""
from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

__all__ = ["progress_bar", "draws_bars"]


def draws_bars(progress: bool) -> bool:
    """Whether a bar asked for with ``progress`` is drawn (NOTE [ bars on terminals only ])."""
    if not progress:
        return False
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # (a replaced or closed stderr)
        return False


def progress_bar(*, progress: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr (``kwargs`` are tqdm's), disabled unless :func:`draws_bars`."""
    return tqdm(disable=not draws_bars(progress), file=sys.stderr, **kwargs)
