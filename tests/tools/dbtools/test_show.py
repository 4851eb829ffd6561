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
