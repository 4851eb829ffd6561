"""No command writes over what it reads: :func:`refuse_overlap`, the one check every
writer of the package and every dataset tool makes before it writes.

NOTE [ outputs apart from inputs ]
An output must not be an input, lie inside one, or hold one, however either is spelled
(relative, ``..``, a symbolic link, a hard link or a bind mount of the same folder, a
file given instead of its folder): with ``--overwrite`` a command replaces its output
(an export removes the whole folder; the copy tools remove a split's files of another
layout), so an overlap loses the data being read, and without it the output is mixed
into the input (a class folder more, a second layout of a split).  Both sides are
resolved (symbolic links, ``..``) and compared, and where both exist, compared by
device and inode as well.  URLs are not checked (a remote input is never written).
preprocess writes only its own ``ILSVRC-<split>.lmdb`` files into its output folder and
never removes the folder, so for it a folder that *holds* an input is fine (``preprocess
ILSVRC2012_img_train.tar .``, the usual spelling); it checks those file names instead.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from ..read.remote import is_url

__all__ = ["refuse_overlap"]


def _chain(p: Path) -> list[Path]:
    """``p`` and its parents, resolved."""
    r = Path(os.path.realpath(p))
    return [r, *r.parents]


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # (one of them does not exist: the resolved names decide)
        return False


def refuse_overlap(inputs: Iterable[str | Path], output: str | Path, *,
                   fix: str = "write to a folder outside it", holding_ok: bool = False) -> None:
    """Raise ValueError if ``output`` is one of ``inputs`` (the files or folders a command
    reads), lies inside one, or holds one (NOTE [ outputs apart from inputs ]); ``fix``
    ends the message.  ``holding_ok``: an output folder that holds an input is allowed
    (for a command that writes only named files of its own into the folder)."""
    if is_url(output):
        return
    out_chain = _chain(Path(output))
    for given in inputs:
        if is_url(given):
            continue
        in_chain = _chain(Path(given))
        if _same(out_chain[0], in_chain[0]):
            how = "is"
        elif not holding_ok and any(_same(out_chain[0], p) for p in in_chain[1:]):
            how = "holds"
        elif any(_same(in_chain[0], p) for p in out_chain[1:]):
            how = "lies inside"
        else:
            continue
        raise ValueError(f"the output {output} {how} {given}, which this command reads: "
                         f"writing there would destroy or mix into its input; {fix}")
