"""No command writes over what it reads, however the paths are spelled (NOTE [ outputs
apart from inputs ] in seqloader/write/overlap.py)."""
from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from seqloader.cli import main as cli
from seqloader.write.overlap import refuse_overlap


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith("-lock")}


@pytest.fixture
def copy(lmdb_dir, tmp_path) -> Path:
    """``tmp_path/data/lmdbcopy``: a copy of the session's database folder, and beside
    ``data`` a symbolic link ``link`` to it."""
    dst = tmp_path / "data" / "lmdbcopy"
    shutil.copytree(lmdb_dir, dst, ignore=shutil.ignore_patterns("*-lock"))
    (tmp_path / "link").symlink_to(dst, target_is_directory=True)
    return dst


def _refused(argv: list[str], capsys) -> str:
    code = cli(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, f"{argv} exited {code}: {err}"
    assert len(err.splitlines()) == 1 and "which this command reads" in err, err
    return err


def test_export_onto_its_source_in_any_spelling_is_refused(copy, tmp_path, capsys, monkeypatch):
    """``seqloader export lmdbcopy lmdbcopy --overwrite`` exited 0 after replacing the
    database with the exported tree."""
    monkeypatch.chdir(tmp_path / "data")
    before = _digest(copy)
    link = str(tmp_path / "link")
    for src, out in [("lmdbcopy", "lmdbcopy"),                      # the same
                     ("lmdbcopy", "../data/lmdbcopy"),              # .. in it
                     ("lmdbcopy", f"{tmp_path}/data/./lmdbcopy/"),  # absolute, ./ and /
                     (link, "lmdbcopy"),                            # a link to it, as source
                     ("lmdbcopy", link),                            # ... and as output
                     ("lmdbcopy/ILSVRC-train.lmdb", "lmdbcopy"),   # a file inside it
                     ("lmdbcopy", "."),                             # the folder holding it
                     (f"{link}/ILSVRC-val.lmdb", str(tmp_path))]:   # ... two levels up
        err = _refused(["export", src, out, "--overwrite", "--no-progress"], capsys)
        assert err.startswith("seqloader export: error: the output "), err
        assert _digest(copy) == before, (src, out)
    assert not list((tmp_path / "data").glob("*.partial"))
    # beside it, or below it (not over a file it reads), is fine
    assert cli(["export", "lmdbcopy", "lmdbcopy-tree", "--no-progress"]) == 0
    assert cli(["export", "lmdbcopy/ILSVRC-val.lmdb", "lmdbcopy/tree", "--no-progress"]) == 0
    assert (copy / "tree" / "val").is_dir()


def test_the_copy_tools_refuse_to_write_over_their_source(copy, tmp_path, capsys, monkeypatch):
    """reshard into the folder holding its file, with --overwrite, removed that file as
    a split file of another layout; subset and merge took other spellings as other folders."""
    monkeypatch.chdir(tmp_path / "data")
    before = _digest(copy)
    link = str(tmp_path / "link")
    for argv in (["reshard", "lmdbcopy/ILSVRC-train.lmdb", "lmdbcopy", "--shards", "2"],
                 ["reshard", "lmdbcopy", f"{link}/..", "--shards", "2"],
                 ["subset", link, "lmdbcopy", "--fraction", "0.5"],
                 ["subset", "lmdbcopy", "lmdbcopy/../lmdbcopy", "--split", "val",
                  "--per-class", "1"],
                 ["merge", "lmdbcopy/ILSVRC-train.lmdb", "lmdbcopy/ILSVRC-val.lmdb", link,
                  "--into", "trainval"],
                 ["merge", "lmdbcopy", tmp_path / "elsewhere", "--shuffle", "--scratch", "s"]):
        argv = [str(a) for a in argv]
        if "elsewhere" in argv[2]:  # (a fine merge: output apart; then merged onto itself)
            assert cli(argv + ["--no-progress"]) == 0
            argv = ["merge", "lmdbcopy", argv[2], argv[2] + "/.."]
        _refused(argv + ["--overwrite", "--no-progress"], capsys)
        assert _digest(copy) == before, argv


def test_preprocess_does_not_write_into_what_it_reads(synth_tree, tmp_path, capsys):
    tree = tmp_path / "tree"
    shutil.copytree(synth_tree.root, tree)
    before = _digest(tree)
    for out in (tree / "train" / "lmdb", tree / "val" / "x" / "..", tree / "val"):
        _refused(["preprocess", str(tree), str(out), "--no-progress", "--workers", "1"], capsys)
    assert _digest(tree) == before
    tar = tree / "val.tar"
    with tarfile.open(tar, "w") as t:
        t.add(tree / "val", "val")
    _refused(["preprocess", str(tar), str(tar), "--split", "val", "--no-progress"], capsys)
    # a source named as the database file the command writes (tensorpack's files are named
    # so), in the output folder
    named = tree / "ILSVRC-val.lmdb"
    shutil.copy(tar, named)
    _refused(["preprocess", str(named), str(tree), "--split", "val", "--no-progress"], capsys)
    assert named.read_bytes() == tar.read_bytes()


def test_preprocess_into_the_folder_that_holds_its_source(synth_tree, tmp_path, capsys):
    """The usual spellings `preprocess ILSVRC2012_img_val.tar .` and `preprocess imagenet .`
    write only ILSVRC-<split>.lmdb files beside the source: allowed, the source intact."""
    tree = tmp_path / "tree"
    shutil.copytree(synth_tree.root, tree)
    tar = tmp_path / "val.tar"
    with tarfile.open(tar, "w") as t:
        t.add(tree / "val", "val")
    before = tar.read_bytes()
    assert cli(["preprocess", str(tar), str(tmp_path), "--split", "val", "--no-progress"]) == 0
    assert tar.read_bytes() == before and (tmp_path / "ILSVRC-val.lmdb").is_file()
    splits_before = [_digest(tree / "train"), _digest(tree / "val")]
    assert cli(["preprocess", str(tree), str(tree), "--no-progress", "--workers", "1"]) == 0
    assert [_digest(tree / "train"), _digest(tree / "val")] == splits_before
    assert (tree / "ILSVRC-train.lmdb").is_file() and (tree / "ILSVRC-val.lmdb").is_file()


def test_refuse_overlap_compares_files_not_names(tmp_path):
    """A hard link is the same file, a bind-mounted or linked folder the same folder;
    a sibling with a common prefix is not inside."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.lmdb").write_bytes(b"x")
    os.link(tmp_path / "a" / "x.lmdb", tmp_path / "hard.lmdb")
    with pytest.raises(ValueError, match="the output .*hard.lmdb is .*x.lmdb"):
        refuse_overlap([tmp_path / "a" / "x.lmdb"], tmp_path / "hard.lmdb")
    refuse_overlap([tmp_path / "a"], tmp_path / "ab")
    refuse_overlap([tmp_path / "a" / "x.lmdb"], tmp_path / "a" / "new")
    refuse_overlap(["s3://bucket/a"], tmp_path)
    with pytest.raises(ValueError, match="lies inside"):
        refuse_overlap([tmp_path / "a"], tmp_path / "a" / "b" / "c")
