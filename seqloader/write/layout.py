"""Where the class folders of an archive of a folder tree are: the archive's layout, told
from its first images' paths, then applied to every member -- the split and class each
image has in the tree that extracting the archive makes.

NOTE [ archive layouts ]
People archive a tree at different levels, and the archive says nothing about which:
* the split folder's contents (``tar -C data/train .``): ``<class>/<image>``;
* the split folder itself (``train.tar`` holding ``train/<class>/<image>``), or a
  folder named like the archive (``mydata.tar`` holding ``mydata/<class>/...``);
* a whole dataset folder: ``<split>/<class>/<image>`` (``tar -C data train val``),
  or one folder down (``imagenet.tar.gz`` holding ``imagenet/{train,val}/...``).
The layout is read off the first images' paths (up to :data:`SAMPLE` of them, not the
first one only): a dataset folder when every one of them lies under a split folder
(``train``, ``val``, ``test`` or the split asked for) -- at the top, or in one folder
that holds them all; else a top folder named like the split or the archive that holds
them all is dropped; else the first folder is the class.  Then every image is placed
by that layout, never by guesses of its own: an image of another split is skipped, so
a split read from a dataset folder is exactly the extracted ``<root>/<split>`` -- never
a merge of splits, never the split names taken for classes; an image outside the
layout's top folder stops the run with a line that says so; an image that is not in a
class folder (one at the archive's or the split folder's top) is skipped, as
preprocessing the extracted folder skips it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["SAMPLE", "SPLIT_FOLDERS", "TreeLayout", "tree_layout"]

#: How many of an archive's first images its layout is read from.
SAMPLE = 32
#: Folder names taken for split folders at a dataset folder's top.
SPLIT_FOLDERS = ("train", "val", "test")


@dataclass(frozen=True)
class TreeLayout:
    """``top``: the folder every image lies in (dropped), or None; ``splits``: under it,
    split folders hold the class folders (a dataset folder)."""

    top: str | None = None
    splits: bool = False

    def describe(self) -> str:
        top = f"{self.top}/" if self.top is not None else ""
        return f"{top}<split>/<class>/<image>" if self.splits else f"{top}<class>/<image>"

    def place(self, parts: Sequence[str], split: str, *, folder: bool = False
              ) -> tuple[str | None, list[str]]:
        """``(where, rest)`` of a member's path ``parts`` for split ``split``: ``where`` is
        None when the member belongs to the split, and ``rest`` is its path from the class
        folder on; else why it is not ("outside", "other split", "no class folder").
        ``folder``: the member is a folder (it is a class when ``rest`` is one name)."""
        parts = list(parts)
        if self.top is not None:
            if parts[0] != self.top:
                return ("no class folder" if len(parts) == 1 and not folder else "outside"), []
            parts = parts[1:]
        if self.splits:
            if not parts or (len(parts) == 1 and not folder):
                return "no class folder", []
            if parts[0] != split:
                return "other split", []
            parts = parts[1:]
        if not folder and len(parts) < 2:
            return "no class folder", []
        return None, parts


def tree_layout(paths: Sequence[str], *, split: str, stem: str) -> TreeLayout:
    """The layout (NOTE [ archive layouts ]) of an archive whose first images are at
    ``paths`` (clean member paths, in order); ``split`` is the split asked for, ``stem``
    the archive's name without its suffixes."""
    names = {*SPLIT_FOLDERS, split} - {""}
    found = [p.split("/") for p in paths[:SAMPLE] if "/" in p]
    if not found:
        return TreeLayout()

    def under_split(parts: list[str], k: int) -> bool:
        return len(parts) >= k + 3 and parts[k] in names

    # (an image right in a split folder is in no class folder: it does not decide)
    if any(under_split(p, 0) for p in found) and all(
            under_split(p, 0) or (len(p) == 2 and p[0] in names) for p in found):
        return TreeLayout(None, True)
    tops = {p[0] for p in found}
    if len(tops) == 1:
        top = tops.pop()
        deeper = [p for p in found if len(p) > 2]  # (the rest: images right in ``top``)
        if deeper and all(under_split(p, 1) for p in deeper):
            return TreeLayout(top, True)
        if deeper and top in (split, stem):
            return TreeLayout(top, False)
    return TreeLayout()
