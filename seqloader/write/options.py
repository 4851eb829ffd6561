"""What a write is asked to do and what it did: options, reports, the write order and
the plan's fingerprint (NOTE [ crash-safe, resumable writes ] in :mod:`.writer`)."""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..format.imagesize import DEFAULT_MAX_PIXELS, check_max_pixels
from ..format.meta import IMAGE_FORMATS, PLAIN_VERSION, Meta
from .prepare import JPEGTRAN_HELP
from .scan import Scan

__all__ = ["WriteOptions", "ShardResult", "WriteReport", "stored_pixels", "write_order", "stored_name",
           "scan_fingerprint", "what_differs"]


@dataclass
class WriteOptions:
    """How to write a split.  Every field but ``workers``, ``overwrite``,
    ``shard_ids``, ``commit_bytes`` and ``progress`` changes the bytes written and is
    part of the resume fingerprint."""

    seed: int = 0
    shuffle: bool = True
    verify: bool = True
    strict: bool = False
    max_size: int | None = None
    quality: int = 95
    restart_markers: bool = False
    store_paths: bool = True
    shards: int = 1
    shard_ids: list[int] | None = None
    workers: int = max(4, 2 * (os.cpu_count() or 1))
    overwrite: bool = False
    commit_bytes: int = 64 << 20
    initial_map_size: int = 1 << 30
    progress: bool = True
    #: "jpeg", or "pixels": decoded uint8 RGB, shrunk to ``short_side`` (NOTE [ stored pixels ])
    image_format: str = "jpeg"
    short_side: int | None = None
    #: images whose header claims more pixels are bad files (NOTE [ pixel limit ]); None: no limit
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if self.shard_ids is not None:
            bad = [s for s in self.shard_ids if not 0 <= s < self.shards]
            if bad:
                raise ValueError(f"shard ids {bad} are not in [0, {self.shards}); "
                                 f"with --shards {self.shards} use 0..{self.shards - 1}")
            twice = sorted({s for s in self.shard_ids if self.shard_ids.count(s) > 1})
            if twice:
                raise ValueError(f"shard ids {twice} are listed more than once in {self.shard_ids}")
        check_max_pixels(self.max_pixels, "max_pixels (--max-pixels)")
        if self.max_size is not None and self.max_size < 1:
            raise ValueError(f"max_size must be a positive number of pixels, got {self.max_size}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.image_format not in IMAGE_FORMATS:
            raise ValueError(f"image format {self.image_format!r}: use one of "
                             f"{', '.join(IMAGE_FORMATS)}")
        if self.short_side is not None and (self.image_format != "pixels" or self.short_side < 1):
            raise ValueError(f"short side {self.short_side}: it sizes stored pixels, so it needs "
                             "the 'pixels' image format (--format pixels) and must be >= 1")
        if self.restart_markers and shutil.which("jpegtran") is None:
            raise ValueError(JPEGTRAN_HELP)


@dataclass
class ShardResult:
    path: Path
    num_records: int
    image_bytes: int
    bad_files: list[list[str]]
    seconds: float
    skipped: bool = False  # already complete from an earlier run
    #: ``[path, warning]``: stored although a decoder warned (NOTE [ damaged JPEGs ])
    warned_files: list[list[str]] = field(default_factory=list)


@dataclass
class WriteReport:
    split: str
    shards: list[ShardResult] = field(default_factory=list)

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def bad_files(self) -> list[list[str]]:
        return [b for s in self.shards for b in s.bad_files]

    @property
    def warned_files(self) -> list[list[str]]:
        return [b for s in self.shards for b in s.warned_files]

    @property
    def image_bytes(self) -> int:
        return sum(s.image_bytes for s in self.shards)


def stored_pixels(data: bytes, short_side: int | None) -> tuple[bytes, tuple[int, int, int]]:
    """The record image of a stored-pixels database for the encoded image ``data`` (as
    it would be stored as a JPEG): its RGB pixels as the Loader decodes them, shrunk to
    ``short_side`` (NOTE [ stored pixels ]), and their shape."""
    from ..format.pixels import shrink_to
    from ..transforms import decode_rgb

    rgb = shrink_to(decode_rgb(data), short_side)
    return np.ascontiguousarray(rgb).tobytes(), rgb.shape


def write_order(n: int, *, seed: int, shuffle: bool) -> np.ndarray:
    """The order in which sources are written: a permutation drawn from ``seed``
    (so every run and every resume agrees), or ``arange(n)``."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(np.random.SeedSequence([seed])).permutation(n)



def scan_fingerprint(scan: Scan, split: str, order: np.ndarray, opt: WriteOptions) -> str:
    h = hashlib.blake2b(digest_size=16)
    # quality shapes every re-encoded record (CMYK, PNG-as-JPEG, ... even without
    # max_size); outside max_size it is added only where it is not the default, so the
    # fingerprints of earlier databases written with the default still match
    reencode_quality = opt.quality if opt.max_size or opt.quality != WriteOptions.quality else None
    h.update(repr((PLAIN_VERSION, split, scan.classes, opt.verify, opt.max_size,
                   reencode_quality, opt.store_paths, opt.shards)
                  + ((True,) if opt.restart_markers else ())
                  + (("pixels", opt.short_side) if opt.image_format == "pixels" else ())
                  # (the default limit adds nothing: earlier fingerprints still match)
                  + ((("max_pixels", opt.max_pixels),)
                     if opt.max_pixels != DEFAULT_MAX_PIXELS else ())).encode())
    for i in order.tolist():  # (names that are not UTF-8 come back as their own bytes)
        h.update(f"{scan.paths[i]}\0{int(scan.labels[i])}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def what_differs(meta: Meta, scan: Scan, opt: WriteOptions) -> str:
    """In words, how the command that wrote ``meta`` differs from this one, as far as the
    metadata records it; else that the source images differ."""
    w = meta.writer or {}

    def say(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)

    then_now = [("--seed", meta.seed if meta.shuffled else None, opt.seed if opt.shuffle else None),
                ("--no-shuffle", not meta.shuffled, not opt.shuffle),
                ("--no-verify", w.get("verify") is False, not opt.verify),
                ("--max-size", w.get("max_size"), opt.max_size),
                ("--restart-markers", bool(w.get("restart_markers")), opt.restart_markers),
                ("--shards", meta.num_shards, opt.shards),
                ("--format", meta.image_format, opt.image_format),
                ("--short-side", w.get("short_side"), opt.short_side),
                ("--max-pixels", w.get("max_pixels", DEFAULT_MAX_PIXELS), opt.max_pixels)]
    if opt.max_size or w.get("max_size") or w.get("quality", opt.quality) != opt.quality:
        then_now.append(("--quality", w.get("quality"), opt.quality))
    diffs = [f"{flag} {say(a)} then, {say(b)} now" for flag, a, b in then_now if a != b]
    if diffs:
        return "it was written with other options: " + "; ".join(diffs)
    if meta.classes != [stored_name(c) for c in scan.classes]:
        return (f"the class folders differ ({len(meta.classes)} then, {len(scan.classes)} "
                "now, or renamed)")
    return ("the source images or their labels differ: files were added, removed or "
            "renamed, or labels changed (e.g. another --val-labels file) -- or --no-paths "
            "differs")


def stored_name(name: str) -> str:
    """A file or folder name as records and metadata store it (msgpack strings are UTF-8):
    itself, or -- for a name that is not valid UTF-8 (e.g. Latin-1 ``caf\\xe9.JPEG``, which
    Python holds with surrogate escapes) -- its bytes with the invalid ones written as
    ``\\xNN``.  Such a name stopped the whole split with an encoding error."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
