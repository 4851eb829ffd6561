"""Stream sources and the external shuffle: every source kind, resume in both passes,
uniformity of the written permutation."""
from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_digests_match, raw_items, read_records
from seqloader.read.database import open_database
from seqloader.write.extshuffle import record_keys, write_source
from seqloader.format.keys import META_KEY
from seqloader.write.preprocess import preprocess_sources
from seqloader.write.inputs import open_source
from seqloader.write.sources import Item
from seqloader.write.writer import BadImageError, WriteOptions

REPO = Path(__file__).resolve().parents[2]


def _opts(**kw) -> WriteOptions:
    return WriteOptions(**{"progress": False, "workers": 2, **kw})


def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as tf:
        for name, data in members:
            _add(tf, name, data)
    return b.getvalue()


def _train_files(root: Path) -> dict[str, list[tuple[str, bytes]]]:
    train = root / "train"
    return {c.name: [(f.name, f.read_bytes()) for f in sorted(c.iterdir())]
            for c in sorted(train.iterdir())}


def _tar_of_tars(path: Path, classes: dict, *, gz_inner: bool = False) -> Path:
    with tarfile.open(path, "w") as outer:
        for cls in reversed(list(classes)):  # (any order: classes are sorted by name)
            inner = _tar_bytes(classes[cls])
            _add(outer, f"{cls}.tar.gz" if gz_inner else f"{cls}.tar",
                 gzip.compress(inner, mtime=0) if gz_inner else inner)
    return path


def _pairs(db_path) -> list[tuple[str, int, bytes]]:
    return [(r.path, r.label, r.image) for _, r in read_records(db_path)]


@pytest.fixture(scope="module")
def train_tar(synth_tree, tmp_path_factory) -> Path:
    return _tar_of_tars(tmp_path_factory.mktemp("tars") / "ILSVRC2012_img_train.tar",
                        _train_files(synth_tree.root))


def test_tar_of_tars_gives_imagefolder_classes_labels_and_paths(train_tar, lmdb_dir, tmp_path):
    out = tmp_path / "out"
    (rep,) = _quiet(preprocess_sources, [train_tar], out, options=_opts())
    db, ref = open_database(out / "ILSVRC-train.lmdb"), open_database(lmdb_dir / "ILSVRC-train.lmdb")
    assert db.classes == ref.classes and db.metas[0].shuffled
    assert sorted(_pairs(out / "ILSVRC-train.lmdb")) == sorted(_pairs(lmdb_dir / "ILSVRC-train.lmdb"))
    assert sorted(p for p, _ in rep.bad_files) == sorted(p for p, _ in
                                                         ref.metas[0].bad_files)
    assert not (out / "ILSVRC-train.lmdb.scratch").exists()
    assert_digests_match(out / "ILSVRC-train.lmdb")  # (external shuffle, pass 2)


def test_two_passes_workers_and_budget_do_not_change_the_order(train_tar, tmp_path):
    src = open_source([train_tar], split="train")
    dbs = []
    for k, (budget, workers) in enumerate([(1 << 30, 2), (60_000, 1), (150_000, 2)]):
        out = tmp_path / f"o{k}" / "ILSVRC-train.lmdb"
        _quiet(write_source, src, out, "train", _opts(workers=workers, commit_bytes=50_000),
               memory_budget=budget)
        dbs.append([x for x in raw_items(out) if x[0] != META_KEY])
        assert not out.with_name(out.name + ".scratch").exists()
    assert dbs[0] == dbs[1] == dbs[2]


def test_tree_tar_gz_and_gzip_inner_tars(synth_tree, tmp_path):
    files = _train_files(synth_tree.root)
    tree = tmp_path / "train.tar.gz"  # a gzip'd tar of train/<class>/<image>
    with tarfile.open(tree, "w:gz") as tf:
        for cls, imgs in files.items():
            for name, data in imgs:
                _add(tf, f"train/{cls}/{name}", data)
    nested = _tar_of_tars(tmp_path / "nested-train.tar", files, gz_inner=True)
    got = []
    for src in (tree, nested):
        assert open_source([src], split="train").kind in ("tree", "tar-of-tars")
        out = tmp_path / f"out-{src.name}"
        _quiet(preprocess_sources, [src], out, options=_opts())
        got.append(sorted(_pairs(out / "ILSVRC-train.lmdb")))
    assert got[0] == got[1] and len(got[0]) == 48 and got[0][0][0].count("/") == 1


def _val_tar(synth_tree, tmp_path) -> tuple[Path, list[tuple[str, str]]]:
    val = synth_tree.root / "val"
    rows = [(f.name, c.name) for c in sorted(val.iterdir()) for f in sorted(c.iterdir())]
    path = tmp_path / "ILSVRC2012_img_val.tar"
    path.write_bytes(_tar_bytes([(n, (val / c / n).read_bytes()) for n, c in sorted(rows)]))
    return path, rows


@pytest.mark.parametrize("fmt", ["wnid", "index", "kaggle"])
def test_flat_val_tar_with_each_labels_format(synth_tree, train_tar, tmp_path, fmt):
    tar, rows = _val_tar(synth_tree, tmp_path)
    classes = sorted({c for _, c in rows})
    labels = tmp_path / "labels.txt"
    if fmt == "wnid":
        labels.write_text("".join(f"{n} {c}\n" for n, c in rows))
    elif fmt == "index":
        labels.write_text("".join(f"{n} {classes.index(c)}\n" for n, c in rows))
    else:  # Kaggle's LOC_val_solution.csv: ImageId without extension, boxes after the wnid
        labels.write_text("ImageId,PredictionString\n" + "".join(
            f"{os.path.splitext(n)[0]},{c} 1 2 3 4 {c} 5 6 7 8\n" for n, c in rows))
    out = tmp_path / "out"
    _quiet(preprocess_sources, [train_tar, tar], out, val_labels=labels, options=_opts())
    db = open_database(out / "ILSVRC-val.lmdb")
    assert not db.metas[0].shuffled
    got = [(p, db.classes[lab]) for p, lab, _ in _pairs(out / "ILSVRC-val.lmdb")]
    ok = sorted((n, c) for n, c in rows)
    bad = {p for p, _ in db.metas[0].bad_files}
    assert got == [x for x in ok if x[0] not in bad]  # source (tar) order, unshuffled
    assert_digests_match(out / "ILSVRC-val.lmdb")


def test_flat_tar_image_without_label_is_named_label_without_image_warned(synth_tree, tmp_path):
    tar, rows = _val_tar(synth_tree, tmp_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{n} {c}\n" for n, c in rows[1:]))
    with pytest.raises(ValueError, match=rows[0][0]):
        _quiet(preprocess_sources, [tar], tmp_path / "out", val_labels=labels, options=_opts())
    labels.write_text("".join(f"{n} {c}\n" for n, c in rows) + f"extra.JPEG {rows[0][1]}\n")
    with pytest.warns(UserWarning, match="1 labelled image.*extra.JPEG"):
        preprocess_sources([tar], tmp_path / "out2", val_labels=labels, options=_opts())


def test_webdataset_shards_with_cls_and_json(synth_tree, tmp_path):
    files = _train_files(synth_tree.root)
    classes = list(files)
    samples = [(f"{cls}_{n.split('.')[0]}", data, classes.index(cls))
               for cls in classes for n, data in files[cls]]
    shards = []
    for s in range(2):
        members = []
        for key, data, label in samples[s::2]:
            members.append((f"{key}.jpg", data))
            members.append((f"{key}.cls", str(label).encode()) if s == 0 else
                           (f"{key}.json", json.dumps({"label": label}).encode()))
        shards.append(tmp_path / f"train-{s:04d}.tar")
        shards[-1].write_bytes(_tar_bytes(members))
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(classes))
    out = tmp_path / "out"
    from seqloader.cli import main
    with warnings.catch_warnings():
        assert main(["preprocess", *map(str, shards), str(out), "--class-names", str(names),
                     "--no-progress", "--workers", "2"]) == 0
    db = open_database(out / "ILSVRC-train.lmdb")
    assert db.classes == classes
    want = {(f"train-{s:04d}/{k}.jpg", lab) for s in range(2) for k, _, lab in samples[s::2]}
    bad = {p for p, _ in db.metas[0].bad_files}
    assert {(p, lab) for p, lab, _ in _pairs(out / "ILSVRC-train.lmdb")} == {
        x for x in want if x[0] not in bad}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_no_scratch_file_stays_open(train_tar, tmp_path):
    """Pass 2 without workers reads the buckets in this process; once the call returns, no
    descriptor holds a (removed) bucket file, whose disk space it would keep."""
    out = tmp_path / "ILSVRC-train.lmdb"
    _quiet(write_source, open_source([train_tar]), out, "train", _opts(verify=False),
           memory_budget=60_000)
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    assert not [p for p in held if ".scratch" in p]


def test_strict_stops_and_removes_scratch(train_tar, tmp_path):
    out = tmp_path / "ILSVRC-train.lmdb"
    with pytest.raises(BadImageError, match="drop --strict"):
        write_source(open_source([train_tar]), out, "train", _opts(strict=True),
                     memory_budget=60_000)
    assert not out.with_name(out.name + ".scratch").exists() and not out.exists()


def _chi_square(table: np.ndarray) -> float:
    expected = table.sum() / table.size
    return float(((table - expected) ** 2 / expected).sum())


def test_written_order_is_uniform_over_positions():
    """Record i lands at each position equally often over seeds: a chi-square test of the
    (record, position) table of 3,200 seeded orders of 8 records (49 degrees of freedom;
    99.9 % quantile 85.35), the order being what write_source writes (checked below)."""
    n, seeds = 8, 3200
    table = np.zeros((n, n))
    for seed in range(seeds):
        order = np.lexsort((np.arange(n), record_keys(seed, "source", 0, n)))
        table[order, np.arange(n)] += 1
    assert _chi_square(table) < 85.35
    biased = table.copy()  # the test can fail: one record a little early too often
    biased[0, 0] += 100
    biased[0, 1:] -= 100 / (n - 1)
    assert _chi_square(biased) > 85.35


def test_keys_resume_mid_stream_and_write_source_uses_them(train_tar, tmp_path):
    full = record_keys(5, "x", 0, 1000)
    assert np.array_equal(full[300:], record_keys(5, "x", 300, 700))
    src = open_source([train_tar], split="train")
    out = tmp_path / "ILSVRC-train.lmdb"
    _quiet(write_source, src, out, "train", _opts(seed=5), memory_budget=60_000)
    idx = [r.path for _, r in read_records(out)]
    names = [ev.name for ev, _ in src.events([]) if isinstance(ev, Item)]
    order = np.lexsort((np.arange(len(names)), record_keys(5, src.identity(), 0, len(names))))
    bad = {b for b, _ in open_database(out).metas[0].bad_files}
    assert idx == [names[i] for i in order if names[i] not in bad]


KILLED = textwrap.dedent("""
    import os, sys, warnings
    warnings.simplefilter("ignore")
    from seqloader.write import extshuffle, writer
    from seqloader.write.inputs import open_source
    from seqloader.write.sources import Item
    which, after = sys.argv[3], int(sys.argv[4])
    cls, name = (extshuffle._Pass1, "_commit") if which == "1" else (writer.ShardWriter, "_commit")
    real, calls = getattr(cls, name), [0]
    def commit(self, *a, **k):
        calls[0] += 1
        if calls[0] > after:
            os._exit(137)  # as kill -9: no cleanup, unsynced frames left past the state
        return real(self, *a, **k)
    setattr(cls, name, commit)
    extshuffle.write_source(open_source([sys.argv[1]]), __import__("pathlib").Path(sys.argv[2]),
                            "train", writer.WriteOptions(progress=False, workers=2,
                                                         commit_bytes=40_000),
                            memory_budget=100_000)
""")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["1", "2"])
def test_kill_in_either_pass_resumes_to_identical_records(train_tar, tmp_path, which):
    ref = tmp_path / "ref" / "ILSVRC-train.lmdb"
    opt = _opts(commit_bytes=40_000)
    _quiet(write_source, open_source([train_tar]), ref, "train", opt, memory_budget=100_000)
    out = tmp_path / "out" / "ILSVRC-train.lmdb"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILLED, str(train_tar), str(out), which, "3"],
                          env=env, timeout=120)
    assert proc.returncode == 137
    scratch = out.with_name(out.name + ".scratch")
    state = json.loads((scratch / "state.json").read_text())
    assert state["done"] == (which == "2") and 0 < state["records"]
    if which == "1":  # frames past the last commit are on disk: the resume cuts them off
        assert sum(f.stat().st_size for f in scratch.glob("bucket-*")) > sum(state["buckets"])
    else:
        assert out.with_name(out.name + ".partial").exists()
    _quiet(write_source, open_source([train_tar]), out, "train", opt, memory_budget=100_000)
    assert not scratch.exists()
    assert [x for x in raw_items(out) if x[0] != META_KEY] == [
        x for x in raw_items(ref) if x[0] != META_KEY]
    ma, mb = open_database(ref).metas[0], open_database(out).metas[0]
    assert (ma.checksum, ma.fingerprint, ma.bad_files, ma.digests) == (
        mb.checksum, mb.fingerprint, mb.bad_files, mb.digests)


def test_ctrl_c_in_pass_one_resumes(train_tar, tmp_path, monkeypatch):
    from seqloader.write import extshuffle

    ref = tmp_path / "ref" / "ILSVRC-train.lmdb"
    opt = _opts(commit_bytes=40_000)
    _quiet(write_source, open_source([train_tar]), ref, "train", opt, memory_budget=100_000)
    real, calls = extshuffle._Pass1._commit, [0]

    def interrupted(self, *a, **k):
        calls[0] += 1
        real(self, *a, **k)
        if calls[0] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(extshuffle._Pass1, "_commit", interrupted)
    out = tmp_path / "out" / "ILSVRC-train.lmdb"
    with pytest.raises(KeyboardInterrupt):
        _quiet(write_source, open_source([train_tar]), out, "train", opt, memory_budget=100_000)
    monkeypatch.undo()
    _quiet(write_source, open_source([train_tar]), out, "train", opt, memory_budget=100_000)
    assert [x for x in raw_items(out) if x[0] != META_KEY] == [
        x for x in raw_items(ref) if x[0] != META_KEY]


@pytest.mark.slow
def test_preprocess_sequential_takes_the_train_tar(train_tar, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "preprocess_sequential.py"), str(train_tar),
                           str(out), "--no-progress", "--workers", "2"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "train: 48 records" in proc.stdout
    assert open_database(out / "ILSVRC-train.lmdb").num_records == 48


def _devkit(path: Path, rows: list[tuple[str, str]], savemat) -> list[str]:
    """An ILSVRC2012 devkit tar: ids in a shuffled (non-sorted) wnid order, as ImageNet's."""
    wnids = sorted({c for _, c in rows}, reverse=True)
    synsets = np.array([(i + 1, w) for i, w in enumerate(wnids)],
                       dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O")])
    mat = io.BytesIO()
    savemat(mat, {"synsets": synsets})
    truth = "".join(f"{wnids.index(c) + 1}\n" for _, c in rows).encode()
    path.write_bytes(_tar_bytes([("ILSVRC2012_devkit_t12/data/meta.mat", mat.getvalue()),
                                 ("ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth"
                                  ".txt", truth)]))
    return wnids


def test_val_labels_from_the_devkit(synth_tree, tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    val = synth_tree.root / "val"
    src = sorted((c.name, f) for c in sorted(val.iterdir()) for f in sorted(c.iterdir()))
    rows = [(f"ILSVRC2012_val_{i:08d}.JPEG", c) for i, (c, _) in enumerate(src, 1)]
    tar = tmp_path / "ILSVRC2012_img_val.tar"
    tar.write_bytes(_tar_bytes([(n, f.read_bytes()) for (n, _), (_, f) in zip(rows, src)]))
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    _devkit(devkit, rows, scipy_io.savemat)
    out = tmp_path / "out"
    _quiet(preprocess_sources, [tar], out, val_labels=devkit, options=_opts(verify=False))
    db = open_database(out / "ILSVRC-val.lmdb")
    assert [(p, db.classes[lab]) for p, lab, _ in _pairs(out / "ILSVRC-val.lmdb")] == rows


def test_devkit_without_scipy_says_what_to_do(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_scipy(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    tar = tmp_path / "ILSVRC2012_img_val.tar"
    tar.write_bytes(_tar_bytes([("ILSVRC2012_val_00000001.JPEG", b"x")]))
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    devkit.write_bytes(_tar_bytes([("x", b"")]))
    with pytest.raises(ValueError, match="needs scipy.*LOC_val_solution.csv"):
        open_source([tar], labels_file=devkit)


def test_too_small_budget_and_another_commands_scratch_are_refused(train_tar, tmp_path):
    out = tmp_path / "ILSVRC-train.lmdb"
    with pytest.raises(ValueError, match="memory-budget .* too small.*at least"):
        write_source(open_source([train_tar]), out, "train", _opts(), memory_budget=100)
    scratch = out.with_name(out.name + ".scratch")
    scratch.mkdir()
    (scratch / "state.json").write_text(json.dumps({"plan": "another", "done": False}))
    with pytest.raises(FileExistsError, match="another command.*--overwrite"):
        write_source(open_source([train_tar]), out, "train", _opts(), memory_budget=60_000)
    _quiet(write_source, open_source([train_tar]), out, "train", _opts(overwrite=True),
           memory_budget=60_000)
    assert out.exists() and not scratch.exists()


def test_memory_budget_sizes_parse_and_bad_ones_are_usage_errors(capsys):
    from seqloader.cli import main
    from seqloader.tools.sizes import size_arg

    assert (size_arg("4G"), size_arg("512M"), size_arg("1.5GiB"), size_arg("1000")) == (
        4 << 30, 512 << 20, 3 << 29, 1000)
    for bad in ("0", "-1G", "lots", "nan", "inf"):
        with pytest.raises(SystemExit):
            main(["preprocess", "x.tar", "out", "--memory-budget", bad])
        assert "size" in capsys.readouterr().err


@pytest.mark.slow
def test_preprocess_tar_benchmark_runs_warm(synth_tree, tmp_path):
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "preprocess_tar.py"),
                        str(synth_tree.root), str(tmp_path / "work"), "--skip-tree",
                        "--json", str(tmp_path / "r.json")],
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (r,) = json.loads((tmp_path / "r.json").read_text())
    assert r["run"] == "tar-verify-warm" and r["images"] == 48 and r["pass2_s"] > 0


def test_options_that_do_not_apply_are_refused(train_tar, synth_tree, tmp_path, capsys):
    """Archive sources: no URL output, no stored pixels (yet), no --staging; a folder
    tree: no archive-only options -- each a usage error naming the option, never a
    silent no-op (pixels were written as JPEG records labelled "pixels")."""
    from seqloader.cli import main

    with pytest.raises(ValueError, match="written to a local folder"):
        preprocess_sources([train_tar], "s3://bucket/prefix")
    with pytest.raises(ValueError, match="not supported for archive sources"):
        preprocess_sources([train_tar], tmp_path / "o",
                           options=WriteOptions(image_format="pixels", short_side=64,
                                                progress=False))
    for args, needle in ((["--staging", str(tmp_path / "s")], "--staging"),):
        assert main(["preprocess", str(train_tar), str(tmp_path / "o"), *args]) == 2
        assert needle in capsys.readouterr().err
    for args in (["--memory-budget", "1G"], ["--split", "train"], ["--scratch", str(tmp_path)]):
        assert main(["preprocess", str(synth_tree.root), str(tmp_path / "o"), *args]) == 2
        assert args[0] in capsys.readouterr().err
    assert main(["preprocess", str(synth_tree.root), str(tmp_path / "o"), "--staging",
                 str(tmp_path / "s")]) == 2
    assert "--staging" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
