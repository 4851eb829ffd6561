"""subset: which records (a pure function of labels and options) and the copy."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_digests_match, read_records
from seqloader.cli import main as cli
from seqloader.read.database import open_database
from seqloader.tools.dbtools.subset import select, subset
from seqloader.read.verify import verify_database

LABELS = np.repeat(np.arange(5), [10, 7, 3, 10, 0])
NAMES = ["a", "b", "c", "d", "e"]


def test_select_invariants():
    idx, kept = select(LABELS, NAMES, class_list=["b", "3"])
    assert kept == [1, 3] and set(LABELS[idx]) == {1, 3} and len(idx) == 17
    idx, kept = select(LABELS, NAMES, first_classes=2, per_class=4, seed=1)
    assert kept == [0, 1] and np.bincount(LABELS[idx]).tolist() == [4, 4]
    assert np.all(np.diff(idx) > 0)  # ascending: read in database order
    again, _ = select(LABELS, NAMES, first_classes=2, per_class=4, seed=1)
    other, _ = select(LABELS, NAMES, first_classes=2, per_class=4, seed=2)
    assert np.array_equal(idx, again) and not np.array_equal(idx, other)
    idx, kept = select(LABELS, NAMES, random_classes=3, seed=0)
    assert len(kept) == 3 and set(LABELS[idx]) <= set(kept)
    idx, _ = select(LABELS, NAMES, fraction=0.5, seed=0)
    assert np.bincount(LABELS[idx], minlength=5).tolist() == [5, 4, 2, 5, 0]  # per class
    rest, _ = select(LABELS, NAMES, fraction=0.5, seed=0, complement=True)
    assert sorted(np.concatenate([idx, rest]).tolist()) == list(range(len(LABELS)))
    idx, _ = select(None, [], fraction=0.25, n=40, seed=0)
    assert len(idx) == 10


@pytest.mark.parametrize("kw, match", [
    (dict(class_list=["zebra"]), "neither a class name"),
    (dict(first_classes=9), "has 5 classes"),
    (dict(fraction=1.5), r"\(0, 1\]"),
    (dict(per_class=0), ">= 1"),
    (dict(first_classes=1, random_classes=1), "one way"),
])
def test_select_refuses_mistakes(kw, match):
    with pytest.raises(ValueError, match=match):
        select(LABELS, NAMES, **kw)


def test_subset_renumbers_and_writes_the_class_map(lmdb_dir, tmp_path):
    full = open_database(lmdb_dir, "train")
    subset(lmdb_dir, tmp_path / "s", classes=[full.classes[3], "1"], per_class=2, renumber=True,
           seed=7, progress=False)
    for split in ("train", "val"):
        db = open_database(tmp_path / "s", split)
        assert db.classes == [full.classes[1], full.classes[3]]
        recs = [r for _, r in read_records(db.paths[0])]
        assert [r.label for r in recs] == db.labels().tolist() and set(db.labels()) == {0, 1}
        src = {r.image: r.label for _, r in read_records(open_database(lmdb_dir, split).paths[0])}
        assert all({0: 1, 1: 3}[r.label] == src[r.image] for r in recs)
        assert verify_database(tmp_path / "s", split, workers=1, progress=False).ok
        assert_digests_match(db.paths[0])  # (of the relabelled records)
    assert (tmp_path / "s" / "ILSVRC-train.classes.tsv").read_text().splitlines() == [
        "label\tsource_label\tclass", f"0\t1\t{full.classes[1]}", f"1\t3\t{full.classes[3]}"]


def test_subset_cli_keeps_labels_by_default_and_errors_in_one_line(lmdb_dir, tmp_path, capsys):
    assert cli(["subset", str(lmdb_dir), str(tmp_path / "s"), "--split", "val", "--classes",
                "2", "--no-progress"]) == 0
    db = open_database(tmp_path / "s", "val")
    assert db.classes == open_database(lmdb_dir, "val").classes and set(db.labels()) == {2}
    assert (tmp_path / "s" / "ILSVRC-val.classes.tsv").read_text().splitlines()[1].startswith("2\t2\t")
    capsys.readouterr()
    for bad in (["--classes", "nope"], ["--fraction", "2"], ["--first-classes", "99"]):
        assert cli(["subset", str(lmdb_dir), str(tmp_path / "t"), *bad, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("seqloader subset: error: "), err


def test_every_split_is_planned_before_anything_is_written(lmdb_dir, tmp_path, capsys):
    # val has 12 records: 10 % of each class's 3 is none, so the whole command is refused
    out = tmp_path / "out"
    assert cli(["subset", str(lmdb_dir), str(out), "--fraction", "0.1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "split 'val': no records chosen" in err and err.count("\n") == 1
    assert not out.exists() or not any(out.iterdir())  # not even train
