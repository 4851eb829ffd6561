"""Kaggle's ImageNet zip, zips of class folders and Hugging Face's parquet files give the
records, labels and class names of the equivalent extracted tree; dict samples (what a
Hugging Face ``datasets.Dataset`` yields) go through ``write_dataset``."""
from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import read_records
from kaggle_hf import KAGGLE_NAME, extracted_kaggle, hf_parquet, kaggle_zip
from seqloader import WriteOptions, preprocess
from seqloader.cli import main
from seqloader.read.database import open_database


def _run(argv, capsys) -> tuple[int, str]:
    """(exit status, stderr with the warnings the command printed)."""
    with warnings.catch_warnings(record=True) as seen:
        rc = main([*argv, "--no-progress", "--workers", "2"])
    shown = "".join(f"warning: {w.message}\n" for w in seen)
    return rc, shown + capsys.readouterr().err


def _content(db_path: Path) -> tuple[list[str], list[tuple[str, int, bytes]], list[str]]:
    """What a fingerprint-level comparison compares: class names, every record's
    (path, label, image bytes), the bad files' names."""
    db = open_database(db_path)
    recs = sorted((r.path, r.label, r.image) for _, r in read_records(db_path))
    return db.classes, recs, sorted(p for m in db.metas for p, _ in m.bad_files)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_kaggle_zip_gives_train_and_val_of_the_extracted_tree(synth_tree, tmp_path, capsys,
                                                              compression):
    z = kaggle_zip(synth_tree.root, tmp_path / KAGGLE_NAME, compression=compression)
    rc, err = _run(["preprocess", str(z), str(tmp_path / "out")], capsys)
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if "test/" in ln]
    assert len(lines) == 1 and "annotations" in lines[0], err
    root, csv = extracted_kaggle(z, tmp_path / "x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(root, tmp_path / "ref", val_labels=csv,
                   options=WriteOptions(progress=False, workers=2))
    for split in ("train", "val"):
        got = _content(tmp_path / "out" / f"ILSVRC-{split}.lmdb")
        ref = _content(tmp_path / "ref" / f"ILSVRC-{split}.lmdb")
        assert got == ref and len(got[1]) > 10
    assert got[0] == sorted(p.name for p in (synth_tree.root / "train").iterdir())


@pytest.mark.needs("pyarrow")
def test_hf_parquet_gives_the_trees_records_labels_and_class_names(synth_tree, lmdb_dir,
                                                                   tmp_path, capsys):
    files = hf_parquet(synth_tree.root, tmp_path / "imagenet-1k")
    rc, err = _run(["preprocess", *map(str, files), str(tmp_path / "out")], capsys)
    assert rc == 0, err
    assert [ln for ln in err.splitlines() if "test split" in ln] == [
        "warning: test-00000-of-00001.parquet: skipped: the test split's labels are hidden "
        "(-1); train and validation are written"]
    for split in ("train", "val"):
        assert _content(tmp_path / "out" / f"ILSVRC-{split}.lmdb") == _content(
            lmdb_dir / f"ILSVRC-{split}.lmdb")


def _zip(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members:
            zf.writestr(name, data)
    return path


def _tree_members(tree: Path, split: str, top: str = "") -> list[tuple[str, bytes]]:
    return [(f"{top}{f.relative_to(tree).as_posix()}", f.read_bytes())
            for f in sorted((tree / split).rglob("*")) if f.is_file()]


@pytest.mark.parametrize("layout", ["split folder", "class folders", "dataset folder",
                                    "dataset root"])
def test_a_zip_of_a_tree_gives_the_extracted_trees_records(synth_tree, lmdb_dir, tmp_path,
                                                           capsys, layout):
    tree = synth_tree.root
    stray = [("README.txt", b"not an image"), ("top.JPEG", (tree / synth_tree.paths[0] if hasattr(
        synth_tree, "paths") else next((tree / "train").rglob("*.JPEG"))).read_bytes())]
    if layout == "split folder":  # zip -r train.zip train
        z = _zip(tmp_path / "train.zip", _tree_members(tree, "train"))
    elif layout == "class folders":  # (cd train && zip -r ../t.zip .), strays at the top
        z = _zip(tmp_path / "t.zip", [(n.split("/", 1)[1], d) for n, d in
                                      _tree_members(tree, "train")] + stray)
    else:
        top = "imagenet/" if layout == "dataset folder" else ""
        z = _zip(tmp_path / "imagenet.zip", _tree_members(tree, "train", top)
                 + _tree_members(tree, "val", top) + [(top + n, d) for n, d in stray])
    args = ["--split", "train"] if layout == "class folders" else []
    rc, err = _run(["preprocess", str(z), str(tmp_path / "out"), *args], capsys)
    assert rc == 0, err
    splits = ("train", "val") if layout.startswith("dataset") else ("train",)
    for split in splits:
        assert _content(tmp_path / "out" / f"ILSVRC-{split}.lmdb") == _content(
            lmdb_dir / f"ILSVRC-{split}.lmdb")
    assert not (tmp_path / "out" / "ILSVRC-val.lmdb").exists() or "val" in splits
    if layout == "dataset root":  # --split picks one, or names the ones there are
        rc, err = _run(["preprocess", str(z), str(tmp_path / "o2"), "--split", "test"], capsys)
        assert rc == 2 and "['train', 'val']" in err and len(err.strip().splitlines()) == 1


@pytest.mark.needs("pyarrow")
def test_parquet_with_named_columns_and_class_name_labels(synth_tree, lmdb_dir, tmp_path,
                                                          capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((synth_tree.root / "train").rglob("*.*"))
    table = pa.table({"jpg": [f.read_bytes() for f in files],
                      "cls": [f.parent.name for f in files]})
    pq.write_table(table, tmp_path / "mine.parquet", row_group_size=7)
    rc, err = _run(["preprocess", str(tmp_path / "mine.parquet"), str(tmp_path / "out"),
                    "--split", "train"], capsys)
    assert rc == 2 and "--image-column" in err and len(err.strip().splitlines()) == 1
    rc, err = _run(["preprocess", str(tmp_path / "mine.parquet"), str(tmp_path / "out"),
                    "--split", "train", "--image-column", "jpg", "--label-column", "cls"], capsys)
    assert rc == 0, err
    got = _content(tmp_path / "out" / "ILSVRC-train.lmdb")
    ref = _content(lmdb_dir / "ILSVRC-train.lmdb")
    assert got[0] == ref[0]
    assert sorted(r[1:] for r in got[1]) == sorted(r[1:] for r in ref[1])
    assert got[1][0][0].startswith("mine.parquet/")


@pytest.mark.needs("pyarrow")
def test_hf_test_split_is_refused_in_one_line(synth_tree, tmp_path, capsys):
    files = hf_parquet(synth_tree.root, tmp_path / "hf")
    test = [f for f in files if f.name.startswith("test")]
    rc, err = _run(["preprocess", *map(str, test), str(tmp_path / "out")], capsys)
    assert rc == 2 and "no split to write" in err
    rc, err = _run(["preprocess", *map(str, test), str(tmp_path / "out"), "--split", "val"],
                   capsys)
    lines = [ln for ln in err.splitlines() if not ln.startswith("warning:")]
    assert rc == 2 and len(lines) == 1 and "label -1" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_kaggle_val_labels_are_checked_against_its_images_before_writing(synth_tree,
                                                                          tmp_path, capsys):
    z = kaggle_zip(synth_tree.root, tmp_path / KAGGLE_NAME)
    with zipfile.ZipFile(z) as zf:
        members = [(i, zf.read(i)) for i in zf.infolist()]
    bad = tmp_path / "bad" / KAGGLE_NAME
    bad.parent.mkdir()
    with zipfile.ZipFile(bad, "w") as zf:
        for info, data in members:
            if info.filename == "LOC_val_solution.csv":
                data = b"\n".join(data.splitlines()[:-1]) + b"\n"  # one line lost
            zf.writestr(info, data)
    rc, err = _run(["preprocess", str(bad), str(tmp_path / "out")], capsys)
    lines = [ln for ln in err.splitlines() if not ln.startswith("warning:")]
    assert rc == 2 and len(lines) == 1 and "1 image(s) without a line" in lines[0], err
    assert not (tmp_path / "out").exists()


def test_zip64_members_and_physical_order(synth_tree, lmdb_dir, tmp_path, capsys):
    """ZIP64 records (as zip writes past 4 GiB or 65,535 members) are read; members are
    read in the order they lie in the file, whatever the central directory's order."""
    z = tmp_path / "train.zip"
    members = _tree_members(synth_tree.root, "train")
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            with zf.open(name, "w", force_zip64=True) as f:
                f.write(data)
        zf.filelist.reverse()  # (the central directory written in reverse order)
    with zipfile.ZipFile(z) as zf:
        assert zf.infolist()[0].filename == members[-1][0]
    from seqloader.write.inputs import open_source
    from seqloader.write.sources import Item

    names = [ev.name for ev, _ in open_source([z], split="train").events([])
             if isinstance(ev, Item)]
    assert names == [n.split("/", 1)[1] for n, _ in members]
    rc, err = _run(["preprocess", str(z), str(tmp_path / "out")], capsys)
    assert rc == 0, err
    assert _content(tmp_path / "out" / "ILSVRC-train.lmdb") == _content(
        lmdb_dir / "ILSVRC-train.lmdb")


@pytest.mark.slow
def test_preprocess_sequential_takes_the_kaggle_zip(synth_tree, tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    z = kaggle_zip(synth_tree.root, tmp_path / KAGGLE_NAME)
    proc = subprocess.run([sys.executable, str(repo / "preprocess_sequential.py"), str(z),
                           str(tmp_path / "out"), "--no-progress", "--workers", "2"],
                          env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "train: 48 records" in proc.stdout and "val: 12 records" in proc.stdout
