"""Bad or empty input gets the right diagnosis: a split of undecodable images, an empty
database left by an older writer, an image tree passed where a database belongs, and
the one rule of ``info``/``verify``/``bench`` for a folder (every split, or --split)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import junk_tree, old_empty_database
from seqloader import EmptyDatabaseError, NoRecordsError, WriteOptions, preprocess
from seqloader.cli import main as cli

REPO = Path(__file__).resolve().parents[1]


def _run(*args: object, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


# ------------------------------------------------------------ no records written

def test_a_split_of_undecodable_images_is_an_error_naming_its_report(tmp_path):
    tree, out = junk_tree(tmp_path / "tree"), tmp_path / "out"
    p = _run("-m", "seqloader.cli", "preprocess", tree, out, "--no-progress", "--workers", "1")
    assert p.returncode == 2, p.stdout + p.stderr
    report = out / "ILSVRC-train.lmdb.bad-files.tsv"
    assert "seqloader preprocess: error: split 'train': none of its 4 image(s)" in p.stderr
    assert str(report) in p.stderr and "not an image" in p.stderr and "(and 1 more)" in p.stderr
    # no database that looks complete is left; the report (the diagnosis) is
    assert sorted(q.name for q in out.iterdir()) == [report.name]
    assert len(report.read_text().splitlines()) == 4


def test_no_records_in_any_shard_removes_them_all(tmp_path):
    tree, out = junk_tree(tmp_path / "tree"), tmp_path / "out"
    with pytest.raises(NoRecordsError, match=r"00000-of-00002\.lmdb\.bad-files\.tsv, .*"
                                             r"00001-of-00002\.lmdb\.bad-files\.tsv"):
        preprocess(tree, out, options=WriteOptions(progress=False, workers=1, shards=2))
    assert not list(out.glob("*.lmdb")) and len(list(out.glob("*.bad-files.tsv"))) == 2


def test_a_rerun_removes_an_older_writers_empty_database(tmp_path):
    out = old_empty_database(tmp_path)
    with pytest.raises(NoRecordsError):  # (it was skipped as complete before)
        preprocess(tmp_path / "junk", out, options=WriteOptions(progress=False, workers=1))
    assert not (out / "ILSVRC-train.lmdb").exists()
    assert (out / "ILSVRC-train.lmdb.bad-files.tsv").exists()


def test_one_good_image_is_enough(tmp_path, synth_tree):
    tree = junk_tree(tmp_path / "tree")
    good = next((synth_tree.root / "train").rglob("*.JPEG"))
    shutil.copy(good, tree / "train" / "n00000000" / "good.JPEG")
    with pytest.warns(UserWarning, match="4 file"):
        (r,) = preprocess(tree, tmp_path / "out", options=WriteOptions(progress=False, workers=1))
    assert r.num_records == 1


def test_an_empty_database_says_so_everywhere(tmp_path, capsys):
    from seqloader import Loader, open_database

    db = old_empty_database(tmp_path)
    report = str(db / "ILSVRC-train.lmdb.bad-files.tsv")
    for opening in (lambda: Loader(db, "train"), lambda: open_database(db, "train")):
        with pytest.raises(EmptyDatabaseError, match="the database has 0 records") as e:
            opening()
        assert report in str(e.value) and "--overwrite" in str(e.value)
    capsys.readouterr()
    assert cli(["verify", str(db), "--no-progress"]) == 1  # (it said OK)
    out = capsys.readouterr().out
    assert "problem: " in out and "0 records" in out and report in out
    assert cli(["info", str(db)]) == 0  # info still describes it
    assert "EMPTY: " in capsys.readouterr().out


# ------------------------------------------------------------ an image tree where a database belongs

def test_an_image_tree_is_named_with_the_command_that_preprocesses_it(synth_tree):
    from seqloader import Loader

    root = synth_tree.root
    with pytest.raises(FileNotFoundError) as e:
        Loader(root, "train")
    msg = str(e.value)
    assert "looks like an image tree (4 class folders under train/)" in msg
    assert f"seqloader preprocess {root} OUT" in msg
    assert f"preprocess_sequential.py <imagenet dir> {root}" not in msg  # (the tree as output)
    with pytest.raises(FileNotFoundError, match=r"one split's image folder \(4 class folders"
                                                r".*--splits val"):
        Loader(root / "val", "val")
    cls = root / "train" / synth_tree.classes[0]
    with pytest.raises(FileNotFoundError, match="holds image files, not seqloader databases"):
        Loader(cls, "train")


@pytest.mark.parametrize("command", ["info", "verify", "bench"])
def test_the_commands_name_an_image_tree(synth_tree, capsys, command):
    assert cli([command, str(synth_tree.root)]) == 2
    err = capsys.readouterr().err
    assert f"seqloader {command}: error: " in err and "looks like an image tree" in err
    assert f"seqloader preprocess {synth_tree.root} OUT" in err


def test_an_empty_folder_still_says_what_was_looked_for(tmp_path):
    from seqloader.format.files import find_database

    with pytest.raises(FileNotFoundError, match=r"no database for split 'train' in .*"
                                                r"ILSVRC-train.lmdb.*no .lmdb files"):
        find_database(tmp_path, "train")
    (tmp_path / "ILSVRC-train.lmdb.partial").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no complete database, only unfinished writes: "
                                                "ILSVRC-train.lmdb.partial; re-run"):
        find_database(tmp_path)


@pytest.mark.slow  # (~9 s: a training script's start-up)
def test_main_py_names_an_image_tree(synth_tree):
    p = _run(REPO / "examples" / "imagenet" / "main.py", synth_tree.root, "--epochs", "1",
             timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr[-2000:]
    assert "main.py: error: " in p.stderr and "looks like an image tree" in p.stderr
    assert f"seqloader preprocess {synth_tree.root} OUT" in p.stderr


# ------------------------------------------------------------ a folder: every split, or --split

def test_info_and_verify_of_a_folder_take_every_split(lmdb_dir, capsys):
    assert cli(["info", str(lmdb_dir)]) == 0
    out = capsys.readouterr().out
    assert "split 'train'" in out and "split 'val'" in out
    assert cli(["info", str(lmdb_dir), "--json"]) == 0
    infos = json.loads(capsys.readouterr().out)
    assert list(infos) == ["train", "val"] and infos["val"]["split"] == "val"
    assert cli(["info", str(lmdb_dir), "--split", "val", "--json"]) == 0  # narrowed: as before
    assert json.loads(capsys.readouterr().out)["split"] == "val"
    assert cli(["verify", str(lmdb_dir), "--no-progress", "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["train", "val"]
    assert all(line.endswith("records checked: OK") for line in lines)
    assert cli(["verify", str(lmdb_dir), "--split", "val", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines() == [lines[1].split(": ", 1)[1]]


def test_verify_of_a_folder_fails_if_any_split_does(lmdb_dir, tmp_path, capsys):
    db = old_empty_database(tmp_path)
    shutil.copy(lmdb_dir / "ILSVRC-val.lmdb", db)
    assert cli(["verify", str(db), "--no-progress", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "train: 0 records checked: 0 bad record(s), 1 problem(s)" in out
    assert "val: " in out and out.rstrip().endswith("records checked: OK")


def test_database_splits_and_the_split_bench_takes(lmdb_dir, tmp_path):
    from seqloader.read.database import path_splits
    from seqloader.format.files import database_splits

    assert database_splits(lmdb_dir) == ["train", "val"]
    (tmp_path / "ILSVRC-val.lmdb").write_bytes(b"")
    for name in ("ILSVRC-test-00000-of-00002.lmdb", "ILSVRC-test-00001-of-00002.lmdb",
                 "ILSVRC-a.lmdb.partial", "other.lmdb"):
        (tmp_path / name).write_bytes(b"")
    assert database_splits(tmp_path) == ["val", "test"]
    assert path_splits(tmp_path, None) == ["val", "test"]
    assert path_splits(tmp_path, "x") == ["x"]
    assert path_splits(lmdb_dir / "ILSVRC-val.lmdb", None) == [None]


def test_bench_of_a_folder_without_train_measures_its_split(lmdb_dir, tmp_path, capsys):
    from seqloader.tools import bench

    shutil.copy(lmdb_dir / "ILSVRC-val.lmdb", tmp_path)  # (it said: no ILSVRC-train.lmdb)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = bench.main([str(tmp_path), "--mode", "raw", "--workers", "0", "--batch-size", "4",
                           "--batches", "1", "--warmup", "0", "--json", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["conditions"]["split"] == "val"
