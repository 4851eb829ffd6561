"""``show``: a listing of N records and a contact sheet (PNG) of them -- as stored, or as
the model sees them after the ImageNet train or eval transform.

NOTE [ contact sheet ]
Tiles sit in a grid on a dark background, each image scaled to fit a ``tile`` x
``tile`` square (aspect kept, centred), with a caption bar under it: ``#index``, the
label and the class name (cut to fit).  A title line names the database, the split
and the transform.  The PNG carries the layout in a text chunk ``seqloader-show``
(JSON: each tile's record index, label, class name and the box of its image), so a
program can read back which record each tile shows (the tests do, and compare the
tile's pixels with the record's).  Records are read in database order (one pass over
the chosen ones); the train transform draws each record's crop and flip from
``(seed, index)``, so a sheet is reproducible.
"""
from __future__ import annotations

import json
import math
import os
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np

from ...errors import NotFoundError, OutputExistsError
from ...format.jpeg import jpeg_info
from ...format.records import Record, unpack_record
from ...read.database import Database, open_database
from ...write.overlap import refuse_overlap
from ...read.reader import RangeReader
from .stream import runs
from .subset import class_ids

__all__ = ["show", "pick_records", "record_view", "fit_tile", "contact_sheet", "drawable", "title_lines",
           "TileInfo", "TEXT_KEY"]

#: The PNG text chunk that holds the sheet's layout (NOTE [ contact sheet ]).
TEXT_KEY = "seqloader-show"
_BG, _TILE_BG, _CAPTION_BG = (24, 24, 27), (44, 44, 50), (14, 14, 16)
_TEXT, _ACCENT, _DIM = (240, 240, 240), (255, 196, 64), (170, 170, 180)


@dataclass
class TileInfo:
    """One record on the sheet and in the listing."""

    index: int
    label: int
    class_name: str
    path: str | None
    nbytes: int
    height: int
    width: int
    box: tuple[int, int, int, int] = (0, 0, 0, 0)  # x0, y0, x1, y1 of its image on the sheet


def pick_records(db: Database, count: int, *, pick: str = "first", seed: int = 0,
                 classes: Sequence[str | int] | None = None) -> np.ndarray:
    """``count`` record indices (ascending): the first, or drawn with ``seed``, of the
    whole split or of ``classes`` (names or label numbers)."""
    if count < 1:
        raise ValueError(f"--count {count}: show at least 1 record")
    if pick not in ("first", "random"):
        raise ValueError(f"--pick {pick!r}: use first or random")
    pool = np.arange(db.num_records)
    if classes:
        if db.metas[0].target_kind != "class":
            raise ValueError("--classes: this database's targets are not classes")
        pool = np.flatnonzero(np.isin(db.labels(), class_ids(classes, db.classes)))
    if pick == "first" or count >= len(pool):
        return pool[:count]
    rng = np.random.default_rng(np.random.SeedSequence([seed]))
    return np.sort(rng.choice(pool, count, replace=False))


def record_view(rec: Record, *, transform: str = "none", size: int = 224, seed: int = 0,
                index: int = 0) -> np.ndarray:
    """The record's image as HWC uint8 RGB: as stored, or after the ImageNet ``train``
    transform (RandomResizedCrop(size) + flip, drawn from ``(seed, index)``) or ``eval``
    transform (Resize(size * 256 / 224) + CenterCrop(size))."""
    from ...transforms import (CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop,
                               Resize, decode_rgb)

    rgb = (np.frombuffer(rec.image, np.uint8).reshape(rec.shape) if rec.shape is not None
           else decode_rgb(rec.image))
    if transform == "none":
        return np.ascontiguousarray(rgb)
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    if transform == "train":
        t = Compose([RandomResizedCrop(size), RandomHorizontalFlip()])
    elif transform == "eval":
        t = Compose([Resize(round(size * 256 / 224)), CenterCrop(size)])
    else:
        raise ValueError(f"--transform {transform!r}: use none, train or eval")
    return np.ascontiguousarray(t(rgb, rng=rng))


def fit_tile(rgb: np.ndarray, tile: int) -> np.ndarray:
    """``rgb`` scaled to fit a ``tile`` x ``tile`` square, aspect kept (never enlarged
    more than the square needs); what the sheet draws."""
    h, w = rgb.shape[:2]
    s = tile / max(h, w)
    nh, nw = max(1, round(h * s)), max(1, round(w * s))
    if (nh, nw) == (h, w):
        return rgb
    return cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_LINEAR)


def _font(px: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=px)
    except TypeError:  # Pillow < 10.1: the bitmap font
        return ImageFont.load_default()


def drawable(text: str) -> str:
    """``text`` in the characters the sheet's font surely has (ASCII): accents dropped
    where Unicode decomposes a letter (é -> e), anything else shown as '?' rather than
    as an empty box."""
    out = []
    for ch in unicodedata.normalize("NFKD", text):
        if ch.isascii() and (ch.isprintable() or ch == " "):
            out.append(ch)
        elif not unicodedata.combining(ch):
            out.append("?")
    return "".join(out)


def _cut(draw, text: str, font, width: int) -> str:
    text = drawable(text)
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def title_lines(draw, title: str, font, width: int) -> list[str]:
    """``title`` (parts joined by " | ") in as many lines as it needs to fit ``width``."""
    lines: list[str] = []
    for part in drawable(title).split(" | "):
        if lines and draw.textlength(lines[-1] + " | " + part, font=font) <= width:
            lines[-1] += " | " + part
        else:
            lines.append(_cut(draw, part, font, width))
    return lines


def contact_sheet(images: Sequence[np.ndarray], infos: Sequence[TileInfo], *, tile: int = 224,
                  columns: int | None = None, title: str = ""):
    """A PIL image of ``images`` in a grid with their captions (NOTE [ contact sheet ]);
    fills each info's ``box``."""
    from PIL import Image, ImageDraw

    n = len(images)
    if columns is not None and columns < 1:
        raise ValueError(f"--columns {columns}: give at least 1 tile per row")
    cols = columns or max(1, math.ceil(math.sqrt(n * 1.0)))
    rows = math.ceil(n / cols)
    fs = max(11, tile // 14)
    font, small = _font(fs), _font(max(10, fs - 2))
    margin, gap, pad = max(12, tile // 16), max(8, tile // 24), max(4, tile // 40)
    cap = 2 * (fs + pad) + pad
    width = 2 * margin + cols * tile + (cols - 1) * gap
    titles = title_lines(ImageDraw.Draw(Image.new("RGB", (1, 1))), title, font,
                          width - 2 * margin) if title else []
    title_h = len(titles) * (fs + pad) + pad + margin // 2 if titles else 0
    height = 2 * margin + title_h + rows * (tile + cap) + (rows - 1) * gap
    sheet = Image.new("RGB", (width, height), _BG)
    draw = ImageDraw.Draw(sheet)
    for j, line in enumerate(titles):
        draw.text((margin, margin + j * (fs + pad)), line, font=font, fill=_TEXT)
    for k, (img, info) in enumerate(zip(images, infos)):
        r, c = divmod(k, cols)
        x = margin + c * (tile + gap)
        y = margin + title_h + r * (tile + cap + gap)
        draw.rectangle([x, y, x + tile - 1, y + tile + cap - 1], fill=_TILE_BG)
        fitted = fit_tile(img, tile)
        h, w = fitted.shape[:2]
        x0, y0 = x + (tile - w) // 2, y + (tile - h) // 2
        sheet.paste(Image.fromarray(fitted), (x0, y0))
        info.box = (x0, y0, x0 + w, y0 + h)
        draw.rectangle([x, y + tile, x + tile - 1, y + tile + cap - 1], fill=_CAPTION_BG)
        head = f"#{info.index}"
        draw.text((x + pad, y + tile + pad), head, font=font, fill=_ACCENT)
        lab = f"label {info.label}" if info.label >= 0 else "target"  # (its text below)
        draw.text((x + tile - pad - draw.textlength(lab, font=small), y + tile + pad + 1), lab,
                  font=small, fill=_DIM)
        draw.text((x + pad, y + tile + 2 * pad + fs), _cut(draw, info.class_name, font,
                                                           tile - 2 * pad),
                  font=font, fill=_TEXT)
    return sheet


def _listing(infos: Sequence[TileInfo]) -> str:
    w = max([len(i.path or "-") for i in infos] + [6])
    rows = [f"{'index':>8}  {'source':<{w}}  {'label':>5}  {'class':<16} {'bytes':>9}  dims"]
    for i in infos:
        rows.append(f"{i.index:>8}  {i.path or '-':<{w}}  {i.label:>5}  {i.class_name:<16} "
                    f"{i.nbytes:>9}  {i.width}x{i.height}")
    return "\n".join(rows)


def show(path: str | Path, *, split: str | None = None, count: int = 16, pick: str = "first",
         seed: int = 0, classes: Sequence[str | int] | None = None, transform: str = "none",
         size: int = 224, out: str | Path | None = None, tile: int = 224,
         columns: int | None = None, overwrite: bool = False, listing: bool = True
         ) -> list[TileInfo]:
    """List ``count`` records of a split (:func:`pick_records`) and, with ``out``, write
    their contact sheet there (NOTE [ contact sheet ]); their :class:`TileInfo` s."""
    from ...format.files import database_splits

    if tile < 16 or size < 8:
        raise ValueError(f"--tile {tile} / --size {size}: give at least 16 / 8 pixels")
    if split is None and Path(path).is_dir():
        found = database_splits(path)
        split = "train" if "train" in found else (found[0] if found else None)
    if columns is not None and columns < 1:
        raise ValueError(f"--columns {columns}: give at least 1 tile per row")
    out = Path(out) if out is not None else None
    if out is not None:
        if out.suffix.lower() != ".png":
            raise ValueError(f"--out {out}: the contact sheet is a PNG; name a .png file")
        if not out.parent.is_dir():
            raise NotFoundError(f"--out {out}: the folder {out.parent} does not exist; "
                                "create it first or name a file in an existing folder")
        if out.exists() and not overwrite:
            raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it")
    db = open_database(path, split)
    if out is not None:
        refuse_overlap(db.paths, out, fix="name another PNG file")
    indices = pick_records(db, count, pick=pick, seed=seed, classes=classes)
    infos, images = [], []
    reader = RangeReader(db)
    try:
        for index, value in reader.read(runs(indices)):
            rec = unpack_record(value, where=f"{db.paths[0]} record {index}")
            hw = rec.shape[:2] if rec.shape is not None else (jpeg_info(rec.image) or (0, 0))[:2]
            name = db.classes[rec.label] if 0 <= rec.label < len(db.classes) else (
                repr(rec.target)[:40] if rec.target is not None else "?")
            infos.append(TileInfo(int(index), rec.label, name, rec.path, len(rec.image),
                                  int(hw[0]), int(hw[1])))
            if out is not None:
                images.append(record_view(rec, transform=transform, size=size, seed=seed,
                                          index=int(index)))
    finally:
        reader.close()
    if listing:
        print(_listing(infos), flush=True)
    if out is not None:
        _save(out, contact_sheet(images, infos, tile=tile, columns=columns,
                                 title=f"{Path(db.paths[0]).name} | split {db.split} | "
                                       f"{len(infos)} of {db.num_records} records | "
                                       f"transform: {transform}"), infos)
    return infos


def _save(out: Path, sheet, infos: Sequence[TileInfo]) -> None:
    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    meta.add_text(TEXT_KEY, json.dumps([asdict(i) for i in infos]))
    tmp = out.with_name(out.name + ".partial")
    sheet.save(tmp, format="PNG", pnginfo=meta, optimize=True)
    os.replace(tmp, out)
