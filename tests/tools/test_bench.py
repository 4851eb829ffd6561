"""``seqloader bench``: every mode of both loaders runs, the JSON schema, --cold without
root, the library functions, and clear errors.  Tiny data, a few batches per run."""
from __future__ import annotations

import argparse
import json
import os
import warnings

import numpy as np
import pytest

from seqloader.tools import bench
from conftest import old_empty_database, raw_items
from seqloader.tools.bench import cpu_limit, evict, measure, residency
from seqloader.tools.bench.machine import usable_cores
from seqloader.format.keys import is_record_key

RESULT_KEYS = {"loader": str, "mode": str, "workers": int, "batch_size": int,
               "images": int, "batches": int, "seconds": float, "images_per_s": float,
               "mb_per_s": float, "first_batch_s": float, "peak_rss_mb": float,
               "peak_pss_mb": float, "peak_uss_mb": float, "cpu_percent": (float, type(None)),
               "cold": bool}
CONDITION_KEYS = ("date", "hostname", "kernel", "seqloader_version", "cpu_count", "cpu_affinity",
                  "workers", "batch_size", "cache_state", "images", "mean_encoded_bytes",
                  "mean_resolution", "database", "files", "notes")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A clean tree (no undecodable files: the files loader would stop on them, like a
    DataLoader) and its database: 4 classes x 16 small images."""
    from seqloader import WriteOptions, preprocess
    from seqloader.tools.synth import make_synthetic_imagenet

    root = tmp_path_factory.mktemp("bench") / "imagenet"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_synthetic_imagenet(root, classes=4, per_class=16, val_per_class=0, seed=3,
                                size="small", progress=False)
        out = root.parent / "lmdb"
        preprocess(root, out, options=WriteOptions(progress=False, workers=1))
    return root, out


def _run_json(capsys, argv):
    assert bench.main(argv + ["--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def _check_row(r):
    for k, typ in RESULT_KEYS.items():
        assert k in r, k
        if r["mode"] != "cpu-limit" or k in ("loader", "mode", "workers", "images_per_s", "cold"):
            v = r[k]
            assert isinstance(v, typ) or (typ is float and isinstance(v, int)), (k, v)
    assert r["cpu_percent"] is None or r["cpu_percent"] >= 0


def test_every_mode_both_loaders_json_schema(data, capsys):
    root, db = data
    doc = _run_json(capsys, [str(db), "--files", str(root), "--loader", "both", "--mode", "all",
                             "--workers", "1", "--batch-size", "8", "--batches", "3",
                             "--warmup", "1", "--quality"])
    assert set(doc) == {"conditions", "results", "quality"}
    assert all(list(r) == list(bench.RESULT_KEYS) for r in doc["results"])
    c = doc["conditions"]
    for k in CONDITION_KEYS:
        assert k in c, k
    assert c["workers"] == [1] and c["batch_size"] == 8 and c["cache_state"] == "warm"
    assert c["images"] == 64 and c["database"]["num_records"] == 64
    assert c["files"]["num_images"] == 64 and c["files"]["root"].endswith("train")
    assert c["mean_encoded_bytes"] > 100 and 64 <= c["mean_resolution"][0] <= 128
    results = doc["results"]
    assert [(r["loader"], r["mode"]) for r in results] == [
        (lo, m) for lo in ("seqloader", "files") for m in ("raw", "decode", "full")]
    for r in results:
        _check_row(r)
        assert r["batches"] == 3 and r["images"] == 24 and r["stopped"] == "batches"
        assert r["images_per_s"] > 0 and r["mb_per_s"] > 0 and r["first_batch_s"] > 0
        assert r["peak_pss_mb"] > 10 and r["peak_rss_mb"] >= r["peak_pss_mb"] >= r["peak_uss_mb"] > 0
        # the main process and its worker (seqloader reads raw records in the main process)
        assert r["peak_processes"] == (1 if (r["loader"], r["mode"]) == ("seqloader", "raw") else 2)
        assert r["cold"] is False
        assert not r.get("leftover_processes")
        # how the reader read: auto reads a small database through the page cache
        assert r["io"] == ("buffered" if r["loader"] == "seqloader" else None)
        # bytes: exact for raw and files; estimated from the mean for seqloader decode/full
        assert r["bytes_exact"] == (r["loader"] == "files" or r["mode"] == "raw")
        assert r["mb_per_s"] == pytest.approx(
            r["images_per_s"] * c["database" if r["loader"] == "seqloader" else "files"]
            ["sample"]["mean_bytes"] / 1e6, rel=0.5)
    q = doc["quality"]
    assert q["seqloader"][0]["workers"] == 1 and 0 < q["seqloader"][0]["distinct_ratio"] <= 1.5
    assert "distinct_ratio" in q["files"]


def test_io_reports_how_the_reader_read(data, capsys):
    root, db = data
    doc = _run_json(capsys, [str(db), "--mode", "raw", "--workers", "1", "--batch-size", "8",
                             "--batches", "2", "--warmup", "0", "--io", "direct"])
    (row,) = doc["results"]
    assert row["io"] == "direct"


def test_results_count_workers_and_cpu_limit(data, capsys):
    root, db = data
    doc = _run_json(capsys, [str(db), "--files", str(root), "--loader", "both",
                             "--mode", "raw,cpu-limit", "--workers", "1", "--workers", "2",
                             "--batch-size", "8", "--batches", "2", "--seconds", "0.2",
                             "--warmup", "1"])
    rows = doc["results"]
    assert len(rows) == 2 * 2 * 2  # loaders x modes x workers
    assert all(list(r) == list(bench.RESULT_KEYS) for r in rows)
    assert doc["quality"] is None
    for r in rows:
        _check_row(r)
        if r["mode"] == "cpu-limit":
            assert r["per_process_images_per_s"] > 0 and r["first_batch_s"] is None
            assert r["images_per_s"] == pytest.approx(
                r["per_process_images_per_s"] * min(r["workers"], usable_cores()), rel=1e-3)
        else:
            assert r["peak_processes"] == (1 if r["loader"] == "seqloader" else 1 + r["workers"])
        assert not r.get("leftover_processes")
    assert bench.process_tree()[1:] == [] or all(  # only multiprocessing's own helpers
        any(h in open(f"/proc/{p}/cmdline").read() for h in ("resource_tracker", "forkserver"))
        for p in bench.process_tree()[1:])


def test_cold_evicts_without_root(data, capsys):
    root, db = data
    doc = _run_json(capsys, [str(db), "--files", str(root), "--loader", "both", "--mode", "raw",
                             "--workers", "1", "--batch-size", "8", "--batches", "2", "--cold"])
    assert doc["conditions"]["cache_state"] == "cold"
    for r in doc["results"]:
        assert r["cold"] is True and r["evicted"] is True
        # we own the files, so mincore can tell; fadvise dropped (nearly) everything
        assert r["resident_before"] is not None and r["resident_before"] < 0.5


def test_evict_and_residency(data):
    _, db = data
    path = str(db / "ILSVRC-train.lmdb")
    with open(path, "rb") as f:
        f.read()
    assert residency([path]) > 0.9
    assert evict([path]) == 1
    assert residency([path]) < 0.5


def test_cpu_percent_over_a_one_second_window(data, capsys):
    _, db = data
    doc = _run_json(capsys, [str(db), "--mode", "decode", "--workers", "1", "--batch-size", "4",
                             "--seconds", "1.05", "--warmup", "1"])
    (r,) = doc["results"]
    assert r["stopped"] == "seconds" and r["seconds"] >= 1.0
    # the tree is busy (worker decoding, main process feeding/copying), within the cores
    assert 5 < r["cpu_percent"] <= 100 * (usable_cores() + 0.3)
    assert r["cpu_seconds"] > 0


def test_text_report_states_conditions(data, capsys):
    root, _ = data
    assert bench.main([str(root), "--loader", "files", "--mode", "decode", "--workers", "0",
                       "--batch-size", "8", "--batches", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for s in ("usable core", "batch size 8", "page cache warm", "images/s", "MB/s",
              "files sample of", "seqloader 0.", "first batch includes"):
        assert s in out, s
    assert out.splitlines()[0].startswith("seqloader bench")


def test_measure_library_function():
    def make():
        return (([b"x" * 10] * 4, None) for _ in range(10))

    r = measure(make, batches=5, warmup=2)
    assert (r["batches"], r["images"], r["bytes"], r["warmup_batches"]) == (5, 20, 200, 2)
    assert r["stopped"] == "batches" and r["images_per_s"] > 0 and r["peak_processes"] == 1
    r = measure(make, warmup=8)
    assert r["batches"] == 2 and r["stopped"] == "exhausted"
    closed = []

    class It:
        def __iter__(self):
            while True:
                yield (np.zeros((3, 2)),)

        def close(self):
            closed.append(True)

    r = measure(It, seconds=0.05, warmup=0)
    assert r["stopped"] == "seconds" and r["images"] == 3 * r["batches"] and closed == [True]


def test_cpu_limit_both_paths(data):
    from seqloader import open_database
    from seqloader.write.scan import scan_class_tree

    root, db = data
    tf = bench.imagenet_train_transform()
    a = cpu_limit(open_database(db, "train"), tf, seconds=0.1, records=20)
    b = cpu_limit(scan_class_tree(root / "train"), tf, seconds=0.1, records=20)
    c = cpu_limit(db / "ILSVRC-train.lmdb", bench.decode_transform(), seconds=0.1, records=20)
    assert a > 0 and b > 0 and c > 0
    # the sample it decodes is reported, so its cost can be checked against the data's
    # (NOTE [ a representative sample ]): by default as many records as the data has, up
    # to 3,000 -- here all of them, so its mean size is the data's
    database = open_database(db, "train")
    stats: dict = {}
    cpu_limit(database, tf, seconds=0.05, stats=stats)
    lengths = [len(v) for k, v in raw_items(db / "ILSVRC-train.lmdb") if is_record_key(k)]
    assert stats["records"] == database.num_records == len(lengths)
    assert stats["sample_mean_bytes"] == pytest.approx(sum(lengths) / len(lengths), abs=0.1)


@pytest.mark.parametrize("argv, needle", [
    (["{tmp}/missing.lmdb"], "missing.lmdb"),
    (["{root}", "--loader", "seqloader"], "looks like an image tree (4 class folders under train/)"),
    (["{db}", "--loader", "files"], "--files"),
    (["{db}", "--workers", "x"], "--workers"),
    (["{db}", "--mode", "bogus"], "bogus"),
    # a file of another split, and a tree without the split (it was measured as classes)
    (["{db}/ILSVRC-train.lmdb", "--split", "val"], "holds split 'train', not 'val'"),
    (["{root}", "--loader", "files", "--split", "test"], "has no test/ folder (it has train)"),
    # NaN passed `<= 0` and then never reached the time limit: a run that never ended
    (["{db}", "--seconds", "nan"], "--seconds must be a finite number > 0, got nan"),
    (["{db}", "--seconds", "inf"], "--seconds must be a finite number > 0, got inf"),
])
def test_bad_arguments_exit_2_naming_the_problem(data, tmp_path, capsys, argv, needle):
    root, db = data
    argv = [a.format(tmp=tmp_path, root=root, db=db) for a in argv]
    assert bench.main(argv + ["--no-progress", "--batches", "1"]) == 2
    err = capsys.readouterr().err
    assert "seqloader bench: error:" in err and needle in err


def test_files_loader_skips_what_preprocessing_skipped(data, tmp_path, capsys):
    """A tree with undecodable files: with the database given, the files loader reads the
    images the database holds (the bad files it lists are left out, and the report says
    so); without it, the failure names the file and the fix, and the runs measured
    before it are still printed."""
    import shutil

    from seqloader import WriteOptions, preprocess

    root, _ = data
    tree = tmp_path / "imagenet"
    shutil.copytree(root, tree)
    cls = sorted(p for p in (tree / "train").iterdir())[1]
    (cls / "zz_empty.JPEG").write_bytes(b"")
    good = next(cls.glob("*.JPEG")).read_bytes()
    (cls / "zz_cut.JPEG").write_bytes(good[: len(good) // 2])
    (cls / os.fsdecode(b"zz_bad\xe9.JPEG")).write_bytes(b"not a JPEG")  # a non-UTF-8 name
    db = tmp_path / "lmdb"
    with pytest.warns(UserWarning, match="3 file.s. were skipped as bad"):
        preprocess(tree, db, options=WriteOptions(progress=False, workers=1))
    doc = _run_json(capsys, [str(db), "--files", str(tree), "--loader", "both", "--mode", "full",
                             "--workers", "0", "--batch-size", "8", "--batches", "8",
                             "--warmup", "0"])
    files = doc["conditions"]["files"]
    assert files["excluded_bad_files"] == 3
    assert files["num_images"] == doc["conditions"]["database"]["num_records"] == 64
    assert [r["images"] for r in doc["results"]] == [64, 64]  # 8 batches of 8, both loaders

    code = bench.main([str(tree), "--loader", "files", "--mode", "raw,full", "--workers", "0",
                       "--batch-size", "8", "--batches", "10", "--warmup", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the files loader (full, 0 workers) failed" in err and "zz_" in err
    assert "remove or replace the file" in err and "Traceback" not in err
    assert "the runs before it measured" in err and "files      raw" in err


def test_empty_database_says_why_nothing_is_measured(tmp_path, capsys):
    # (what older writers left for a split of undecodable images; the writer now refuses)
    db = old_empty_database(tmp_path)
    assert bench.main([str(db), "--mode", "raw", "--workers", "0",
                       "--batches", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the database has 0 records" in err and "ILSVRC-train.lmdb.bad-files.tsv" in err


def test_run_bench_raises_for_bad_path(tmp_path):
    ap = argparse.ArgumentParser()
    bench.add_bench_arguments(ap)
    with pytest.raises(FileNotFoundError, match="nope"):
        bench.run_bench(ap.parse_args([str(tmp_path / "nope")]))


def test_monitor_keeps_its_sampling_within_its_cpu_budget():
    """The memory sampler backs off when a sample is expensive (smaps_rollup of big
    processes), so it takes at most ``budget`` of a core from the measured pipeline."""
    from seqloader.tools.bench.machine import TreeMonitor

    mon = TreeMonitor(interval=0.5, budget=0.01)
    mon.sample()  # a real sample of this process: costs something, is recorded
    assert mon.last_cost > 0 and mon.own_cpu >= mon.last_cost
    assert mon.peak["rss"] > 0
    mon.last_cost = 0.001  # cheap: the interval holds
    assert mon.wait_s() == 0.5
    mon.last_cost = 0.05  # 50 ms a sample: 5 s apart = 1 % of a core
    assert mon.wait_s() == pytest.approx(5.0)
