"""One labelling rule for every container: a tree, a tar of it, a tar of tars give the
same classes and labels; links inside archives are refused with a message, not
skipped; labels files are read and checked before any split is written; a header
line is known by its form; a single-class train split is warned about."""
from __future__ import annotations

import io
import os
import tarfile
import warnings

import pytest

from conftest import read_records
from seqloader.cli import main
from seqloader.write.scan import is_header
from test_damaged_inputs import _jpeg


def _run(argv, capsys):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rc = main(["preprocess", *argv, "--workers", "1", "--no-progress"])
    return rc, capsys.readouterr().err, [str(x.message) for x in w]


def _tree(root):
    for c, n in (("n01", 2), ("n02", 0), ("n03", 2)):  # n02: an empty class folder
        d = root / "train" / c
        d.mkdir(parents=True)
        for i in range(n):
            (d / f"{c}_{i}.JPEG").write_bytes(_jpeg(hash((c, i)) % 1000))
    return root


def _train_tar(tar, root):
    """``tar``: the tree's train folder as extraction would give it back (``train/<class>/..``)."""
    with tarfile.open(tar, "w") as tf:
        tf.add(root / "train", arcname="train")
    return tar


def _labels(out):
    return sorted((r.path, r.label) for _, r in read_records(out / "ILSVRC-train.lmdb"))


def test_an_empty_folder_is_a_class_in_a_tar_as_in_the_tree(tmp_path, capsys):
    root = _tree(tmp_path / "tree")
    tar = _train_tar(tmp_path / "tree.tar", root)
    assert _run([str(root), str(tmp_path / "a"), "--splits", "train"], capsys)[0] == 0
    rc, err, warned = _run([str(tar), str(tmp_path / "b"), "--split", "train"], capsys)
    assert rc == 0, err
    assert _labels(tmp_path / "a") == _labels(tmp_path / "b")
    assert {r.label for _, r in read_records(tmp_path / "b" / "ILSVRC-train.lmdb")} == {0, 2}
    assert any("no images and keep their labels" in m and "n02" in m for m in warned)


def _dot_tar(tar, top, members):
    """A tar as ``tar -cf TAR -C top .`` writes it: a ``./`` entry, then ``./class/...``."""
    with tarfile.open(tar, "w:gz" if str(tar).endswith(".gz") else "w") as tf:
        tf.add(top, arcname=".", recursive=False)
        for path in sorted(top.rglob("*")):
            tf.add(path, arcname="./" + path.relative_to(top).as_posix(), recursive=False)
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_tar_of_dot_gives_the_classes_of_the_tree(tmp_path, capsys, suffix):
    root = _tree(tmp_path / "tree")
    tar = tmp_path / f"train{suffix}"
    # (and ``a/./b``, ``a//b`` are the paths extraction makes of them: ``a/b``)
    _dot_tar(tar, root / "train", [("./n03/./n03_x.JPEG", _jpeg(7))])
    (root / "train" / "n03" / "n03_x.JPEG").write_bytes(_jpeg(7))
    assert _run([str(root), str(tmp_path / "a"), "--splits", "train"], capsys)[0] == 0
    rc, err, warned = _run([str(tar), str(tmp_path / "b"), "--split", "train"], capsys)
    assert rc == 0, err
    assert _labels(tmp_path / "a") == _labels(tmp_path / "b")
    assert not any("'.'" in m for m in warned), warned


def test_tar_of_tars_and_shards_read_dotted_names_as_extraction_does(tmp_path, capsys):
    tot = tmp_path / "ILSVRC2012_img_train.tar"
    with tarfile.open(tot, "w") as outer:
        for c in ("n01", "n02"):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as inner:
                dot = tarfile.TarInfo(".")
                dot.type = tarfile.DIRTYPE
                inner.addfile(dot)
                for i in range(2):
                    data = _jpeg(i)
                    ti = tarfile.TarInfo(f"./{c}_{i}.JPEG" if i == 0 else f"./sub/{c}_{i}.JPEG")
                    ti.size = len(data)
                    inner.addfile(ti, io.BytesIO(data))
            ti = tarfile.TarInfo(f"./{c}.tar")
            ti.size = buf.tell()
            buf.seek(0)
            outer.addfile(ti, buf)
    rc, err, _ = _run([str(tot), str(tmp_path / "a")], capsys)
    assert rc == 0, err
    assert _labels(tmp_path / "a") == [(p, k) for k, c in enumerate(("n01", "n02"))
                                       for p in (f"{c}/{c}_0.JPEG", f"{c}/sub/{c}_1.JPEG")]
    shard = tmp_path / "shard-000000.tar"
    with tarfile.open(shard, "w") as tf:
        for i in range(2):
            for name, data in ((f"./s/k{i}.jpg", _jpeg(i)), (f"./s/k{i}.cls", str(i).encode())):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    rc, err, _ = _run([str(shard), str(tmp_path / "b"), "--split", "train"], capsys)
    assert rc == 0, err
    assert _labels(tmp_path / "b") == [("shard-000000/s/k0.jpg", 0), ("shard-000000/s/k1.jpg", 1)]


def test_a_member_path_with_dotdot_is_refused(tmp_path, capsys):
    tar = tmp_path / "train.tar"
    with tarfile.open(tar, "w") as tf:
        for name in ("n01/a.JPEG", "n01/../../b.JPEG"):
            data = _jpeg(1)
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    rc, err, _ = _run([str(tar), str(tmp_path / "out")], capsys)
    assert rc == 2 and "member n01/../../b.JPEG has a '..'" in err, err
    assert not (tmp_path / "out" / "ILSVRC-train.lmdb").exists()


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_links_in_a_tar_are_refused_with_a_message_not_skipped(tmp_path, capsys, link):
    root = _tree(tmp_path / "tree")
    target = root / "train" / "n01" / "n01_0.JPEG"
    extra = root / "train" / "n03" / "linked.JPEG"
    (os.link if link == "hard" else os.symlink)(target, extra)
    tar = _train_tar(tmp_path / "tree.tar", root)
    rc, err, _ = _run([str(tar), str(tmp_path / "out"), "--split", "train"], capsys)
    assert rc == 2, err
    assert f"member train/n03/linked.JPEG is a {link} link" in err
    assert not (tmp_path / "out" / "ILSVRC-train.lmdb").exists()


def test_a_header_is_known_by_its_form():
    assert is_header("ImageId", "PredictionString")
    assert is_header("filename", "label")
    assert not is_header("ILSVRC2012_val_00000001", "n01751748")
    assert not is_header("ILSVRC2012_val_00000001.JPEG", "n09999999")  # a class seen once
    assert not is_header("cat.jpg", "cat")
    assert not is_header("img7", "3")


def _val_tar(tmp_path):
    names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 5)]
    tar = tmp_path / "ILSVRC2012_img_val.tar"
    with tarfile.open(tar, "w") as tf:
        for i, n in enumerate(names):
            data = _jpeg(i)
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return tar, names


def test_a_first_line_naming_a_class_seen_once_is_data_not_a_header(tmp_path, capsys):
    tar, names = _val_tar(tmp_path)
    labels = tmp_path / "val.txt"
    labels.write_text(f"{names[0]} n09\n" + "".join(f"{n} n01\n" for n in names[1:]))
    rc, err, _ = _run([str(tar), str(tmp_path / "out"), "--val-labels", str(labels)], capsys)
    assert rc == 0, err
    got = sorted((r.path, r.label) for _, r in read_records(tmp_path / "out" / "ILSVRC-val.lmdb"))
    assert got == [(names[0], 1)] + [(n, 0) for n in names[1:]]
    kaggle = tmp_path / "LOC_val_solution.csv"
    kaggle.write_text("ImageId,PredictionString\n" + "".join(
        f"{n[:-5]},n01 1 2 3 4\n" for n in names))
    rc, err, _ = _run([str(tar), str(tmp_path / "out2"), "--val-labels", str(kaggle)], capsys)
    assert rc == 0, err


def test_a_bad_labels_file_fails_before_train_is_written(tmp_path, capsys):
    root = _tree(tmp_path / "tree")
    train = _train_tar(tmp_path / "ILSVRC2012_img_train.tar", root)
    val, _ = _val_tar(tmp_path)
    out = tmp_path / "out"
    rc, err, _ = _run([str(train), str(val), str(out), "--val-labels",
                       str(tmp_path / "missing.txt")], capsys)
    assert rc == 2 and "labels file" in err and "missing.txt" in err, err
    assert not (out / "ILSVRC-train.lmdb").exists()
    bad = tmp_path / "bad.txt"
    bad.write_text("ILSVRC2012_val_00000001.JPEG\n")
    (root / "val").mkdir()
    rc, err, _ = _run([str(root), str(out), "--val-labels", str(bad)], capsys)
    assert rc == 2 and "bad.txt:1" in err, err
    assert not (out / "ILSVRC-train.lmdb").exists()


@pytest.mark.parametrize("bad", ["n99", "3"])  # an unknown class; an index past train's 3
def test_val_labels_outside_train_classes_fail_before_train_is_written(tmp_path, capsys, bad):
    root = _tree(tmp_path / "tree")
    train = _train_tar(tmp_path / "ILSVRC2012_img_train.tar", root)
    val, names = _val_tar(tmp_path)
    labels = tmp_path / "val.txt"
    labels.write_text("".join(f"{n} {bad if i == 2 else 'n01'}\n" for i, n in enumerate(names)))
    out = tmp_path / "out"
    rc, err, _ = _run([str(train), str(val), str(out), "--val-labels", str(labels)], capsys)
    assert rc == 2, err
    assert f"val.txt:3: {names[2]}'s class '{bad}' is not one of the 3 classes of the train" in err
    assert "in the same run" not in err
    assert not (out / "ILSVRC-train.lmdb").exists()
    assert not out.exists() or any(out.iterdir())  # no empty folder left behind
    labels.write_text("".join(f"{n} {i % 3}\n" for i, n in enumerate(names)))  # fixed: resumes
    rc, err, _ = _run([str(train), str(val), str(out), "--val-labels", str(labels)], capsys)
    assert rc == 0, err


def test_a_labels_folder_is_named_a_folder(tmp_path, capsys):
    val, _ = _val_tar(tmp_path)
    rc, err, _ = _run([str(val), str(tmp_path / "out"), "--val-labels", str(tmp_path)], capsys)
    assert rc == 2 and f"labels file {tmp_path} is a directory; give the file in it" in err, err
    root = _tree(tmp_path / "tree")
    (root / "val").mkdir()
    rc, err, _ = _run([str(root), str(tmp_path / "out2"), "--val-labels", str(tmp_path)], capsys)
    assert rc == 2 and "is a directory" in err and "LOC_val_solution.csv" in err, err


def test_a_single_class_train_split_names_the_layout(tmp_path, capsys):
    root = tmp_path / "kaggle"
    for c in ("n01", "n02"):
        d = root / "ILSVRC" / "Data" / "CLS-LOC" / "train" / c
        d.mkdir(parents=True)
        (d / f"{c}_0.JPEG").write_bytes(_jpeg(1))
    tar = tmp_path / "imagenet-object-localization-challenge.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root / "ILSVRC", arcname="ILSVRC")
    rc, err, warned = _run([str(tar), str(tmp_path / "out"), "--split", "train"], capsys)
    assert rc == 0, err
    assert any("single class, 'ILSVRC'" in m and "CLS-LOC" in m for m in warned), warned
