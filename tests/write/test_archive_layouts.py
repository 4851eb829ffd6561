"""Tars as other tools and people write them give the records of the extracted tree: an
archive of a whole dataset folder, stray files among class folders, GNU sparse members,
bzip2/xz/zstd compression; a flat tar's labels file is checked against its members
before anything is written, and its first line is a header only if it cannot be data."""
from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import read_records
from seqloader.cli import main
from test_damaged_inputs import _jpeg


def _run(argv, capsys):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rc = main(["preprocess", *argv, "--workers", "1", "--no-progress"])
    return rc, capsys.readouterr().err, [str(x.message) for x in w]


def _records(out: Path, split: str = "train"):
    return sorted((r.path, r.label, r.image) for _, r in read_records(
        out / f"ILSVRC-{split}.lmdb"))


def _dataset(root: Path) -> Path:
    """``root/{train,val}/{n01,n02,n03}/*.JPEG`` (4 train and 2 val images a class)."""
    for split, n in (("train", 4), ("val", 2)):
        for k, c in enumerate(("n01", "n02", "n03")):
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"{c}_{split}_{i}.JPEG").write_bytes(_jpeg(100 * k + 10 * n + i))
    return root


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


@pytest.fixture
def tree(tmp_path, capsys):
    """The dataset folder and its splits as preprocessed from the folder."""
    root = _dataset(tmp_path / "data")
    rc, err, _ = _run([str(root), str(tmp_path / "folder")], capsys)
    assert rc == 0, err
    return root, {s: _records(tmp_path / "folder", s) for s in ("train", "val")}


@pytest.mark.parametrize("top", ["", "imagenet/"])
def test_an_archive_of_a_dataset_folder_gives_the_split_asked_for(tree, tmp_path, capsys, top):
    """``tar -cf d.tar -C data train val`` and ``imagenet.tar.gz`` holding
    ``imagenet/{train,val}``: exactly the extracted split, never train and val merged
    (on main: 18 records), never classes named train and val."""
    root, want = tree
    tar = tmp_path / ("imagenet.tar.gz" if top else "d.tar")
    with tarfile.open(tar, "w:gz" if top else "w") as tf:
        for split in ("train", "val"):
            tf.add(root / split, arcname=f"{top}{split}")
    for split in ("train", "val"):
        rc, err, _ = _run([str(tar), str(tmp_path / split), "--split", split], capsys)
        assert rc == 0, err
        assert _records(tmp_path / split, split) == want[split]
    rc, err, _ = _run([str(tar), str(tmp_path / "nosplit")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--split" in err, err
    rc, err, _ = _run([str(tar), str(tmp_path / "test"), "--split", "test"], capsys)
    assert rc == 2 and "without a 'test' split folder" in err and "train" in err, err


def test_a_top_folder_is_dropped_only_where_it_holds_every_image(tree, tmp_path, capsys):
    """The layout is read off the first images, not the first one: a class folder named
    like the archive, beside others, is a class; an image outside the top folder the
    first images are in stops the run."""
    root, want = tree
    tar = tmp_path / "n01.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root / "train" / "n01", arcname="n01")
        tf.add(root / "train" / "n02", arcname="n02")
        tf.add(root / "train" / "n03", arcname="n03")
    rc, err, _ = _run([str(tar), str(tmp_path / "a"), "--split", "train"], capsys)
    assert rc == 0, err
    assert _records(tmp_path / "a") == want["train"]
    many = tmp_path / "mydata.tar"
    with tarfile.open(many, "w") as tf:
        for i in range(40):  # more than the layout's sample
            _add(tf, f"mydata/n01/x{i}.JPEG", _jpeg(i))
        _add(tf, "other/n02/y.JPEG", _jpeg(99))
    rc, err, _ = _run([str(many), str(tmp_path / "b"), "--split", "train"], capsys)
    assert rc == 2 and "other/n02/y.JPEG is outside mydata/" in err, err


def test_stray_files_among_class_folders_are_as_in_the_tree(tree, tmp_path, capsys):
    """A ``dataset_info.json`` or a ``.cls`` among the first members is no webdataset;
    an image at the archive's top is skipped as the folder's scan skips it."""
    root, want = tree
    (root / "train" / "dataset_info.json").write_text('{"name": "mine"}')
    (root / "train" / "classes.cls").write_text("3")
    cv2.imwrite(str(root / "train" / "cover.png"), np.zeros((8, 8, 3), np.uint8))
    rc, err, _ = _run([str(root), str(tmp_path / "folder2"), "--splits", "train"], capsys)
    assert rc == 0, err
    assert _records(tmp_path / "folder2") == want["train"]
    tar = tmp_path / "train.tar"
    with tarfile.open(tar, "w") as tf:
        for name in ("dataset_info.json", "classes.cls", "cover.png"):
            tf.add(root / "train" / name, arcname=name)
        for c in ("n01", "n02", "n03"):
            tf.add(root / "train" / c, arcname=c)
    rc, err, warned = _run([str(tar), str(tmp_path / "out")], capsys)
    assert rc == 0, err
    assert _records(tmp_path / "out") == want["train"]
    assert any("not inside a class folder are skipped" in m and "cover.png" in m
               for m in warned), warned


def _sparse_copy(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "--sparse=always", str(src), str(dst)], check=True)


@pytest.mark.skipif(shutil.which("tar") is None or b"GNU" not in subprocess.run(
    ["tar", "--version"], capture_output=True).stdout, reason="needs GNU tar (--sparse)")
def test_gnu_sparse_members_are_read(tree, tmp_path, capsys):
    """``tar --sparse``: an inner tar of a tar of tars (on main: opened as gzip, "Not a
    gzipped file") and an image of a tree tar, each with holes, read as stored."""
    root, want = tree
    work = tmp_path / "work"
    work.mkdir()
    for c in ("n01", "n02", "n03"):
        plain = tmp_path / f"{c}.tar"
        with tarfile.open(plain, "w") as tf:  # a zero-filled member: holes in the copy
            for f in sorted((root / "train" / c).iterdir()):
                tf.add(f, arcname=f.name)
            _add(tf, "padding.bin", bytes(16384))
        _sparse_copy(plain, work / f"{c}.tar")
    tars = tmp_path / "ILSVRC2012_img_train.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(tars), "-C", str(work), "n01.tar", "n02.tar",
                    "n03.tar"], check=True)
    with tarfile.open(tars) as tf:
        if not any(m.issparse() for m in tf):
            pytest.skip("this file system makes no holes (cp --sparse=always)")
    rc, err, _ = _run([str(tars), str(tmp_path / "tars")], capsys)
    assert rc == 0, err
    assert _records(tmp_path / "tars") == want["train"]

    black = np.zeros((64, 64, 3), np.uint8)  # a BMP of zeros: 12 KB of them, holes
    tree2 = tmp_path / "t2" / "train" / "n01"
    tree2.mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "black.bmp"), black)
    _sparse_copy(tmp_path / "black.bmp", tree2 / "black.bmp")
    (tree2 / "a.JPEG").write_bytes(_jpeg(5))
    sparse = tmp_path / "train-sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(sparse), "-C", str(tree2.parent), "n01"],
                   check=True)
    with tarfile.open(sparse) as tf:
        assert any(m.issparse() for m in tf)
    rc, err, _ = _run([str(sparse), str(tmp_path / "sp")], capsys)
    assert rc == 0, err
    rc, err, _ = _run([str(tmp_path / "t2"), str(tmp_path / "sp-folder")], capsys)
    assert rc == 0, err
    assert _records(tmp_path / "sp") == _records(tmp_path / "sp-folder")
    assert len(_records(tmp_path / "sp")) == 2


def _compress(data: bytes, how: str) -> bytes:
    if how == "bz2":
        import bz2

        return bz2.compress(data)
    if how == "xz":
        import lzma

        return lzma.compress(data)
    import zstandard

    return zstandard.ZstdCompressor(write_checksum=True).compress(data)


@pytest.mark.parametrize("how", ["bz2", "xz", pytest.param("zst", marks=pytest.mark.needs(
    "zstandard"))])
def test_bz2_xz_and_zstd_tars_are_read(tree, tmp_path, capsys, how):
    """On main each was called a damaged download."""
    root, want = tree
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as tf:
        tf.add(root / "train", arcname="train")
    tar = tmp_path / f"train.tar.{how}"
    tar.write_bytes(_compress(b.getvalue(), how))
    rc, err, warned = _run([str(tar), str(tmp_path / "out")], capsys)
    assert rc == 0, err
    assert _records(tmp_path / "out") == want["train"]
    # each file opened is closed (a user saw "warning: unclosed file <...train.tar.xz>")
    assert not [m for m in warned if "unclosed" in m], warned


def test_zstd_without_zstandard_is_not_supported_not_damaged(tmp_path, capsys, monkeypatch):
    tar = tmp_path / "train.tar.zst"
    tar.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(60))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    rc, err, _ = _run([str(tar), str(tmp_path / "out")], capsys)
    assert rc == 2 and "not supported: " in err and "zstandard" in err, err
    assert "damaged" not in err and len(err.strip().splitlines()) == 1


def _flat(tar: Path, names: list[str]) -> Path:
    with tarfile.open(tar, "w") as tf:
        for i, n in enumerate(names):
            _add(tf, n, _jpeg(i))
    return tar


def test_a_first_labels_line_that_is_data_is_kept(tmp_path, capsys):
    """``alpha cat`` looks like a header (no digit, no dot) but names an image of the
    archive: data (on main it was dropped, and alpha.jpg had no label)."""
    tar = _flat(tmp_path / "val.tar", ["alpha.jpg", "beta.jpg", "gamma.jpg"])
    labels = tmp_path / "labels.txt"
    labels.write_text("alpha cat\nbeta dog\ngamma cat\n")
    rc, err, _ = _run([str(tar), str(tmp_path / "out"), "--val-labels", str(labels)], capsys)
    assert rc == 0, err
    got = sorted((r.path, r.label) for _, r in read_records(tmp_path / "out" / "ILSVRC-val.lmdb"))
    assert got == [("alpha.jpg", 0), ("beta.jpg", 1), ("gamma.jpg", 0)]
    labels.write_text("filename class\nalpha cat\nbeta dog\ngamma cat\n")  # a real header
    rc, err, _ = _run([str(tar), str(tmp_path / "out2"), "--val-labels", str(labels)], capsys)
    assert rc == 0, err


def test_a_labels_file_of_another_archive_fails_before_train_is_written(tree, tmp_path, capsys):
    root, _ = tree
    train = tmp_path / "ILSVRC2012_img_train.tar"
    with tarfile.open(train, "w") as tf:
        tf.add(root / "train", arcname="train")
    val = _flat(tmp_path / "ILSVRC2012_img_val.tar", ["v1.JPEG", "v2.JPEG"])
    other = tmp_path / "other.txt"
    other.write_text("w1.JPEG n01\nw2.JPEG n02\n")
    out = tmp_path / "out"
    rc, err, _ = _run([str(train), str(val), str(out), "--val-labels", str(other)], capsys)
    assert rc == 2 and "have no line in" in err and "other.txt" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (out / "ILSVRC-train.lmdb").exists()


def test_a_pass_resumed_after_the_splits_last_image_does_not_call_it_missing(tree, tmp_path):
    """The check "no such split folder" is made by a walk from the archive's start only: a
    pass resumed (NOTE [ stream cursors ]) after train's last image, in val's members,
    takes nothing more and is no error."""
    from seqloader.write.inputs import open_source
    from seqloader.write.sources import Item

    root, want = tree
    tar = tmp_path / "d.tar"
    with tarfile.open(tar, "w") as tf:
        for split in ("train", "val"):
            tf.add(root / split, arcname=split)
    src = open_source([tar], split="train")
    events = list(src.events([]))
    names = [ev.name for ev, _ in events if isinstance(ev, Item)]
    assert sorted(names) == sorted(p for p, _, _ in want["train"])
    last = max(i for i, (ev, _) in enumerate(events) if isinstance(ev, Item))
    assert list(src.events(events[last][1])) == []
