"""export: round trips through a class tree and webdataset shards are exact."""
from __future__ import annotations

import glob
import json
import tarfile
import warnings

import pytest

from conftest import read_records
from seqloader.cli import main as cli
from seqloader.read.database import open_database
from seqloader.tools.dbtools.export import export
from seqloader.write.preprocess import preprocess, preprocess_sources
from seqloader.write.writer import WriteOptions


def _records(path, split):
    db = open_database(path, split)
    return [r for p in db.paths for _, r in read_records(p)]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A tree without odd or bad files, and its database."""
    from seqloader.tools.synth import make_synthetic_imagenet

    root = tmp_path_factory.mktemp("clean")
    make_synthetic_imagenet(root / "tree", classes=3, per_class=8, val_per_class=2, seed=4,
                            odd_fraction=0, size="small", progress=False)
    preprocess(root / "tree", root / "db", options=WriteOptions(progress=False, workers=2))
    return root


def test_tree_db_export_tree_db_gives_identical_records(clean, tmp_path):
    export(clean / "db", tmp_path / "tree", progress=False)
    assert not (tmp_path / "tree.partial").exists()
    preprocess(tmp_path / "tree", tmp_path / "db", options=WriteOptions(progress=False, workers=2))
    for split in ("train", "val"):
        a, b = open_database(clean / "db", split), open_database(tmp_path / "db", split)
        assert a.classes == b.classes and a.metas[0].fingerprint == b.metas[0].fingerprint
        assert a.metas[0].checksum == b.metas[0].checksum  # same bytes, same order
    orig = sorted((clean / "tree").rglob("*.JPEG"))
    assert [p.read_bytes() for p in orig] == \
        [(tmp_path / "tree" / p.relative_to(clean / "tree")).read_bytes() for p in orig]


def test_tree_export_keeps_names_bytes_labels_of_odd_and_skipped_files(lmdb_dir, tmp_path):
    """Odd sources (PNG, CMYK) come back as the JPEG bytes stored, under their names;
    every class keeps its folder."""
    export(lmdb_dir, tmp_path / "tree", split="train", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(tmp_path / "tree", tmp_path / "db", options=WriteOptions(progress=False))
    key = lambda r: (r.path, r.image, r.label)  # noqa: E731
    assert sorted(map(key, _records(tmp_path / "db", "train"))) == \
        sorted(map(key, _records(lmdb_dir, "train")))


def test_webdataset_export_preprocesses_back_to_the_same_records(lmdb_dir, tmp_path):
    export(lmdb_dir, tmp_path / "wds", to="webdataset", shard_bytes=50_000, progress=False)
    tars = sorted(glob.glob(str(tmp_path / "wds" / "train-*.tar")))
    assert len(tars) > 1
    with tarfile.open(tars[0]) as tf:
        names = tf.getnames()
    assert names[:2] == ["00000000.jpg", "00000000.cls"]
    preprocess_sources(tars, tmp_path / "db", split="train",
                       class_names=(tmp_path / "wds" / "train-classes.txt").read_text().split(),
                       options=WriteOptions(progress=False, shuffle=False, workers=2))
    got, want = _records(tmp_path / "db", "train"), _records(lmdb_dir, "train")
    assert [(r.image, r.label) for r in got] == [(r.image, r.label) for r in want]
    assert open_database(tmp_path / "db", "train").classes == open_database(lmdb_dir, "train").classes


@pytest.mark.needs("webdataset")
def test_webdataset_reads_the_exported_shards(lmdb_dir, tmp_path):
    import webdataset as wds

    for targets in ("cls", "json"):
        out = tmp_path / targets
        export(lmdb_dir, out, to="webdataset", targets=targets, split="val", progress=False)
        ds = wds.WebDataset(sorted(glob.glob(str(out / "val-*.tar"))), shardshuffle=False)
        samples = list(ds)
        want = _records(lmdb_dir, "val")
        assert [s["jpg"] for s in samples] == [r.image for r in want]
        if targets == "cls":
            assert [int(s["cls"]) for s in samples] == [r.label for r in want]
        else:
            import json
            got = [json.loads(s["json"]) for s in samples]
            assert [g["label"] for g in got] == [r.label for r in want]
            assert [g["path"] for g in got] == [r.path for r in want]


def test_export_is_atomic_refuses_to_overwrite_and_reruns(lmdb_dir, tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "out.partial" / "junk").mkdir(parents=True)  # an interrupted run's
    assert cli(["export", str(lmdb_dir), str(out), "--split", "val", "--no-progress"]) == 0
    assert not (tmp_path / "out.partial").exists() and (out / "val").is_dir()
    assert cli(["export", str(lmdb_dir), str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err
    assert cli(["export", str(lmdb_dir), str(out), "--format", "webdataset", "--overwrite",
                "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name[0] != ".")[:2] == ["train-000000.tar", "train-classes.txt"]


def test_stored_record_is_unpack_record_without_the_copy(lmdb_dir, tmp_path):
    import numpy as np

    from seqloader.format.records import Record, pack_record, unpack_record
    from seqloader.tools.dbtools.export import stored_record
    from seqloader.write.dataset import write_dataset

    rng = np.random.default_rng(0)
    write_dataset([(rng.integers(0, 255, (6, 5, 3), np.uint8), {"a": np.arange(3)})
                   for _ in range(3)], tmp_path / "any", image_format="pixels", progress=False,
                  workers=1)
    values = [pack_record(r) for _, r in read_records(lmdb_dir / "ILSVRC-val.lmdb")]
    values += [pack_record(r) for _, r in read_records(tmp_path / "any" / "ILSVRC-train.lmdb")]
    values.append(pack_record(Record(b"\xff\xd8xx", 3, extra={"z": 1})))
    for v in values:
        a, b = stored_record(v, "v"), unpack_record(v)
        assert isinstance(a.image, memoryview) and bytes(a.image) == b.image
        assert (a.label, a.path, a.reencoded, a.shape) == (b.label, b.path, b.reencoded, b.shape)
        assert repr(a.target) == repr(b.target)
    export(tmp_path / "any", tmp_path / "wds", to="webdataset", progress=False)
    with tarfile.open(tmp_path / "wds" / "train-000000.tar") as tf:
        names = tf.getnames()
        assert names[:2] == ["00000000.png", "00000000.json"]
        assert json.loads(tf.extractfile(names[1]).read())["target"] == {"a": [0, 1, 2]}


def test_rerunning_a_finished_export_is_complete_and_another_is_refused(lmdb_dir, tmp_path,
                                                                         capsys):
    out = tmp_path / "exwk"
    args = ["export", str(lmdb_dir), str(out), "--split", "val", "--format", "webdataset",
            "--no-progress"]
    assert cli(args) == 0
    first = capsys.readouterr().out
    mtime = (out / "val-000000.tar").stat().st_mtime_ns
    assert cli(args) == 0  # the same export again: nothing to do
    again = capsys.readouterr().out
    assert again.split("\n")[0] == first.split("\n")[0] + " (already complete)"
    assert (out / "val-000000.tar").stat().st_mtime_ns == mtime
    assert cli([*args, "--targets", "json"]) == 2  # another export: refused
    assert "--overwrite" in capsys.readouterr().err


def test_export_to_a_place_that_cannot_be_written_is_one_line(lmdb_dir, tmp_path, capsys):
    ro = tmp_path / "missing" / "deeper"
    (tmp_path / "missing").write_text("a file, not a folder")
    assert cli(["export", str(lmdb_dir), str(ro / "e1"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot create the export's folder" in err
    assert "a place you can write to" in err


def test_a_round_trip_keeps_the_order_only_when_no_file_was_skipped(lmdb_dir, tmp_path):
    """docs/tools.md said a tree export preprocessed again keeps the order; the write order
    is a seeded permutation of the files found, so a tree without the source's skipped
    (bad) files comes back with the same records in another order.  (With none skipped:
    test_tree_db_export_tree_db_gives_identical_records.)"""
    assert open_database(lmdb_dir, "train").metas[0].bad_files  # (3 skipped)
    export(lmdb_dir, tmp_path / "tree", split="train", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(tmp_path / "tree", tmp_path / "db", options=WriteOptions(progress=False))
    before = [(r.path, r.label) for r in _records(lmdb_dir, "train")]
    after = [(r.path, r.label) for r in _records(tmp_path / "db", "train")]
    assert sorted(before) == sorted(after) and before != after
