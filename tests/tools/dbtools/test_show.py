"""show: the contact sheet's tiles and captions are the records'; the listing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import read_records
from seqloader.cli import main as cli
from seqloader.read.database import open_database
from seqloader.tools.dbtools.show import TEXT_KEY, fit_tile, record_view, show


@pytest.mark.parametrize("transform", ["none", "train", "eval"])
def test_sheet_tiles_and_labels_match_the_records(lmdb_dir, tmp_path, transform):
    from PIL import Image

    out = tmp_path / "sheet.png"
    show(lmdb_dir, split="train", count=7, pick="random", seed=3, transform=transform, size=64,
         out=out, tile=96, listing=False)
    db = open_database(lmdb_dir, "train")
    records = dict(read_records(db.paths[0]))
    with Image.open(out) as im:
        tiles = json.loads(im.text[TEXT_KEY])
        sheet = np.asarray(im.convert("RGB"))
    assert len(tiles) == 7 and len({t["index"] for t in tiles}) == 7
    for t in tiles:
        rec = records[t["index"]]
        assert t["label"] == rec.label and t["class_name"] == db.classes[rec.label]
        assert t["path"] == rec.path
        x0, y0, x1, y1 = t["box"]
        want = fit_tile(record_view(rec, transform=transform, size=64, seed=3, index=t["index"]), 96)
        assert np.array_equal(sheet[y0:y1, x0:x1], want)  # the tile is this record
        if transform != "none":
            assert max(want.shape[:2]) == 96 and want.shape[0] == want.shape[1]


def test_train_view_is_seeded_per_record_and_differs_from_eval(lmdb_dir):
    rec = read_records(open_database(lmdb_dir, "train").paths[0])[0][1]
    a = record_view(rec, transform="train", size=32, seed=1, index=5)
    assert np.array_equal(a, record_view(rec, transform="train", size=32, seed=1, index=5))
    assert a.shape == (32, 32, 3)
    assert not np.array_equal(a, record_view(rec, transform="train", size=32, seed=1, index=6))


def test_show_lists_records_of_classes_and_refuses_mistakes(lmdb_dir, tmp_path, capsys):
    db = open_database(lmdb_dir, "train")
    assert cli(["show", str(lmdb_dir), "-n", "3", "--classes", db.classes[2]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["index", "source", "label", "class"] and len(lines) == 4
    assert all(line.split()[2] == "2" and line.split()[3] == db.classes[2] for line in lines[1:])
    out = tmp_path / "s.png"
    out.write_bytes(b"")
    for bad in (["--classes", "nope"], ["-n", "0"], ["--out", str(out)]):
        assert cli(["show", str(lmdb_dir), *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("seqloader show: error: "), err


def test_show_refuses_a_wrong_out_or_columns(lmdb_dir, tmp_path, capsys):
    for bad in (["--out", str(tmp_path / "x.jpg")],
                ["--out", str(tmp_path / "nonexistent" / "dir" / "x.png")],
                ["--out", str(tmp_path / "c.png"), "--columns", "0"]):
        assert cli(["show", str(lmdb_dir), "--no-list", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("seqloader show: error: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder made, no file


def test_sheet_text_is_drawable_and_the_title_fits(tmp_path):
    from PIL import Image, ImageDraw

    from seqloader.tools.dbtools.show import _font, drawable, title_lines

    assert drawable("Café ñandú – 東京") == "Cafe nandu ? ??"
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    font = _font(12)
    title = "ILSVRC-train.lmdb | split train | 6 of 6 records | transform: none"
    lines = title_lines(draw, title, font, 150)
    assert len(lines) > 1 and " | ".join(lines) == title  # wrapped, nothing cut
    assert all(draw.textlength(line, font=font) <= 150 for line in lines)


def test_sheet_of_any_targets_shows_targets(tmp_path):
    from PIL import Image

    from seqloader.write.dataset import write_dataset

    rng = np.random.default_rng(0)
    write_dataset([(rng.integers(0, 255, (20, 24, 3), np.uint8), {"box": [1, 2]})
                   for _ in range(3)], tmp_path / "any", image_format="pixels", progress=False,
                  workers=1)
    out = tmp_path / "s.png"
    infos = show(tmp_path / "any", count=3, out=out, tile=64, listing=False)
    assert all(i.label == -1 and "'box'" in i.class_name for i in infos)
    with Image.open(out) as im:
        assert len(json.loads(im.text[TEXT_KEY])) == 3
