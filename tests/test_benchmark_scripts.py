"""Smoke tests of the benchmark scripts (shuffle_quality, shuffle_accuracy, transforms_bench,
decode_floor, reduced_by_size, ...): tiny sizes, end to end through the command line."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(script: str, *args: str, cwd: Path, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    """Run ``benchmarks/<script> args`` (one thread); fail with its stderr unless it exits 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def _run(script: str, *args: str, cwd: Path) -> dict:
    return json.loads(_script(script, *args, cwd=cwd, timeout=120).stdout)


def _bench_module(name: str):
    """Import ``benchmarks/<name>.py`` (benchmarks/ is not a package; its scripts import
    each other by name, so the folder is on the path while it loads)."""
    import importlib

    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def test_vectorised_epoch_order_maps_positions_as_the_loader():
    """epoch_order maps stream positions to records all at once; the Loader maps them one
    by one (PositionMap.__call__): the same records."""
    sq = _bench_module("shuffle_quality")
    pair_repeat = sq.pair_repeat
    from seqloader.read.plan import PositionMap
    from seqloader.read.plan import PlanSpec, plan_epoch
    from seqloader.tools.quality import epoch_order

    for spec, cache in [(PlanSpec((1000,), 16, 7, True, num_workers=2), 50),
                        (PlanSpec((3, 500, 497), 16, 50, True, seed=4), 100),
                        (PlanSpec((777,), 32, 1024, True), 1000),
                        (PlanSpec((600,), 32, 64, False, even=False), 1)]:
        for epoch in (0, 1):
            index_of = PositionMap(plan_epoch(spec, epoch).ranges)
            positions = np.random.default_rng(epoch).permutation(len(index_of))
            assert np.array_equal(index_of.many(positions), [index_of(int(p)) for p in positions])
            order = epoch_order(spec, epoch, cache=cache)
            assert sorted(order.tolist()) == sorted(index_of.many(np.arange(len(index_of))))
    same = np.arange(1000)
    assert pair_repeat(same, same, 10) == 1.0
    rng = np.random.default_rng(0)
    assert pair_repeat(rng.permutation(1000), rng.permutation(1000), 10) < 0.05


@pytest.mark.slow
def test_shuffle_quality_of_a_database_does_not_overwrite_the_committed_results(lmdb_dir,
                                                                                 tmp_path):
    committed = BENCH / "results" / "shuffle_quality.md"
    before = committed.stat().st_mtime_ns
    doc = _run("shuffle_quality.py", "--db", str(lmdb_dir), "--caches", "8", "--chunks", "4",
               "--batch-size", "4", "--json", "--no-progress", cwd=tmp_path)
    assert doc["rows"] and committed.stat().st_mtime_ns == before
    assert (tmp_path / f"shuffle_quality-{lmdb_dir.name}.md").exists()


@pytest.mark.slow  # (a benchmark script end to end: seconds)
def test_shuffle_quality_script(tmp_path):
    out = tmp_path / "q.md"
    doc = _run("shuffle_quality.py", "--classes", "6", "--per-class", "50", "--caches",
               "20,100", "--chunks", "4,32", "--batch-size", "16", "--json", "--no-progress",
               "--out", str(out), cwd=tmp_path)
    assert set(doc) == {"conditions", "rows", "recommendation"}
    assert doc["conditions"]["layouts"] == ["class-sorted", "shuffled at write"]
    kinds = [r["kind"] for r in doc["rows"]]
    assert kinds == ["ideal permutation", "no shuffle"] + ["seqloader"] * 4
    for r in doc["rows"]:
        assert {"cache", "chunk_size", "distinct_ratio", "epoch_correlation", "pair_repeat",
                "buffer_mb", "hdd_efficiency_model"} <= set(r)
        assert set(r["distinct_ratio"]) == {"class-sorted", "shuffled at write"}
    no = doc["rows"][1]
    assert no["epoch_correlation"] > 0.999 and no["distinct_ratio"]["class-sorted"] < 0.5
    assert {"class-sorted", "shuffled at write", "criteria"} <= set(doc["recommendation"])
    assert "| seqloader | 100 | 32 |" in out.read_text()
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == doc["rows"]


@pytest.mark.slow
def test_shuffle_accuracy_script(tmp_path):
    fake = tmp_path / "fake-hddsim"  # runs the command as is: tests the wiring only
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    configs = "a_ideal,b_seq_default,c_sorted_default,c_sorted_bigbuf,d_sorted_noshuffle"
    doc = _run("shuffle_accuracy.py", "--classes", "3", "--per-class", "12",
               "--val-per-class", "2", "--epochs", "2", "--seeds", "0", "--batch-size", "8",
               "--size", "16", "--width", "4", "--configs", configs, "--no-imagenet-reference",
               "--work", str(tmp_path / "work"), "--out-dir", str(tmp_path / "out"),
               "--no-progress", "--json", "--hdd-throughput", "--hddsim", str(fake),
               "--hdd-size", "small", "--hdd-configs", "a_ideal,b_seq_default",
               "--hdd-chunks", "4", cwd=tmp_path)
    assert {"conditions", "runs", "summary", "goals", "reference_quality",
            "hdd_throughput"} <= set(doc)
    names = configs.split(",")
    assert list(doc["summary"]) == names and len(doc["runs"]) == len(names)
    for r in doc["runs"]:
        assert len(r["val_acc"]) == 2 and 0 <= r["final_acc"] <= 1
        assert {"distinct_ratio", "epoch_correlation", "pair_repeat",
                "observed_distinct_ratio"} <= set(r["quality"])
    s = doc["summary"]
    assert s["d_sorted_noshuffle"]["quality"]["epoch_correlation"] > 0.999
    assert {"final_mean", "final_std", "val_acc_mean", "delta_vs_ideal_mean"} <= set(s["a_ideal"])
    assert {"b_within_1pp", "d_clearly_worse"} <= set(doc["goals"])
    assert doc["conditions"]["scaled"]["cache"] >= 8
    rows = doc["hdd_throughput"]["rows"]
    assert [r["name"] for r in rows] == ["a_ideal", "b_seq_default", "sweep chunk 4"]
    assert all("error" not in r and r["records"] == 36 for r in rows), rows
    out = tmp_path / "out"
    assert (out / "shuffle_accuracy.md").read_text().startswith("# Shuffling vs accuracy")
    assert json.loads((out / "shuffle_accuracy.json").read_text())["goals"] == doc["goals"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib not installed: no plot")
    assert (out / "shuffle_accuracy.png").stat().st_size > 0


@pytest.mark.slow
def test_transforms_bench_script(tmp_path):
    out = tmp_path / "t.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, str(BENCH / "transforms_bench.py"), "--images", "3",
                        "--draws", "1", "--repeat", "1", "--sets", "imagenet,large",
                        "--quality", "75,90", "--json", str(out)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["quality"] == [75, 90]
    assert set(doc["sets"]) == {"imagenet-q75", "imagenet-q90", "large-q75", "large-q90"}
    for name, r in doc["sets"].items():
        assert r["max_dct_scaling_speedup"] > 0
        if name.startswith("large"):  # 2000x1500 at 224 px: reduced decoding always applies
            assert r["eval"]["k_counts"]["4"] == 3 and r["eval"]["speedup"] > 0
            assert r["where_reduced"]["samples"] >= 1 and r["where_reduced"]["speedup"] > 0
        else:  # ~500x375 at 224 px: it never does
            assert r["reduced_share"] == 0 and "speedup" not in r["eval"]
        assert 0 < r["rows_decoded_share"] <= 1 and r["speedup_all"]["speedup_partial_only"] > 0
    if shutil.which("jpegtran"):  # --restart-markers: also the original bytes
        p = subprocess.run([sys.executable, str(BENCH / "transforms_bench.py"), "--images", "2",
                            "--draws", "1", "--repeat", "1", "--sets", "large",
                            "--restart-markers", "--json", str(out)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        r = json.loads(out.read_text())["sets"]["large"]
        assert {"orig_fused", "orig_plain"} <= set(r["methods"])
        assert r["where_reduced"]["speedup_vs_orig_plain"] > 0
        assert r["rows_decoded_share"] < 1  # windows of the marked files
        assert "vs plain on the original bytes" in p.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "transforms_bench.py"), "--quality", "x"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--quality" in bad.stderr


@pytest.mark.slow
def test_epoch_gaps_script(lmdb_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, str(BENCH / "epoch_gaps.py"), "--db", str(lmdb_dir),
                        "--epochs", "2", "--code", str(BENCH.parent)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert doc["seqloader"].startswith(str(BENCH.parent))
    assert len(doc["boundary_waits_s"]) == 2 and doc["images_per_s"] > 0


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_read_cost_script(tmp_path, mode):
    """Reads exactly what it is asked to, in both modes (O_DIRECT works on tmp_path's disk
    file system; the CPU figures are hddsim's business, not a test's)."""
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(6 << 20))
    doc = _run("read_cost.py", str(f), "--mib", "5", "--block-mib", "2", "--mode", mode,
               cwd=tmp_path)
    assert doc["mode"] == mode and doc["mib"] == 5 and doc["mib_per_s"] > 0
    assert doc["user_s"] >= 0 and doc["sys_s"] >= 0


@pytest.mark.slow  # (a benchmark script end to end: seconds)
@pytest.mark.needs("jpegtran")
def test_decode_floor_script(tmp_path):
    """Runs end to end on a few 2000x1500 photos (every draw gets a reduced decode) and
    reports a consistent breakdown; the exact-crop copy codes part of the image."""
    out = tmp_path / "floor.json"
    p = _script("decode_floor.py", "--images", "3", "--draws", "2", "--repeat", "1",
                "--quality", "80", "--sets", "large", "--json", str(out), cwd=tmp_path)
    res, = json.loads(out.read_text())["results"]
    assert res["set"] == "large-q80" and res["samples"] >= 4
    assert sum(res["k_counts"].values()) == res["samples"]
    assert 0 < res["crop_bytes_share"] < 1
    assert res["region_vs_crop_px"] >= 1  # the shipped window holds the whole crop
    assert all(v > 0 for v in res["ms"].values())
    assert set(res["speedup"]) == {"fused", "perfect", "floor", "floor_bytes", "decoding"}
    assert res["speedup"]["decoding"] > 1  # a window at 1/2-1/4 scale vs the whole image
    assert "fused's stages" in p.stdout and "decoding alone" in p.stdout
    grids = res["restart_grids"]
    assert set(grids) == {"every MCU", "~2 MCUs", "stored (~4 MCUs)"}
    # more markers, more bytes (the coefficients are the same)
    # ("~2" is every MCU where neither 2 nor 3 divides a row's MCUs)
    assert grids["every MCU"]["kb"] >= grids["~2 MCUs"]["kb"] >= grids["stored (~4 MCUs)"]["kb"]
    assert grids["every MCU"]["kb"] > grids["stored (~4 MCUs)"]["kb"]


@pytest.mark.slow  # (a benchmark script end to end: seconds)
@pytest.mark.needs("jpegtran")
def test_decode_floor_sets_by_long_side(tmp_path):
    """``--sets`` also takes long sides in px (4:3 photos): a 400 px set has no draw with a
    reduced decode, a 1600 px set has some; an unknown name is a usage error."""
    out = tmp_path / "floor.json"
    p = _script("decode_floor.py", "--images", "2", "--draws", "2", "--repeat", "1",
                "--quality", "80", "--sets", "400,1600", "--no-grids", "--json", str(out),
                cwd=tmp_path)
    small, large = json.loads(out.read_text())["results"]
    assert small["set"] == "400-q80" and small["samples"] == 0
    assert "400-q80: no draw gets a reduced decode" in p.stdout
    assert large["set"] == "1600-q80" and large["samples"] >= 1 and "restart_grids" not in large
    bad = subprocess.run([sys.executable, str(BENCH / "decode_floor.py"), "--sets", "huge"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown set 'huge'" in bad.stderr


@pytest.mark.slow  # (a benchmark script end to end: seconds)
@pytest.mark.needs("jpegtran")
def test_reduced_by_size_script(tmp_path):
    """Runs end to end on a few photos of two sizes: only draws with a reduced decode are
    timed (all four draws here at 2000 px on the long side; none fits a 400 px image)."""
    out = tmp_path / "sizes.json"
    p = _script("reduced_by_size.py", "--sizes", "400,2000", "--quality", "80", "--images", "2",
                "--draws", "2", "--repeat", "1", "--fractional", "--json", str(out), cwd=tmp_path)
    small, large = json.loads(out.read_text())["results"]
    assert small == {"size": "400x300", "quality": 80, "samples": 0}
    assert "no draw gets a reduced decode" in p.stdout
    assert large["size"] == "2000x1500" and large["samples"] == large["draws"] == 4
    assert large["applies"] == 1.0 and large["kb"] > 0
    assert set(large["ms"]) == {"fused", "plain", "plain_orig", "fused_m8"}
    # speed-ups are the benchmark's figures (benchmarks/RESULTS.md), not asserted here: one
    # repeat on a loaded host can time either way
    assert large["speedup"] > 0 and large["speedup_orig"] > 0
    assert large["speedup_m8"] > 0 and "fused_m8" in p.stdout
    by_scale = large["decode_m8"]  # whole-image decode time at each M/8 scale
    assert list(by_scale) == [str(m) for m in range(1, 9)] and all(v > 0 for v in by_scale.values())


@pytest.mark.needs("jpegtran")
def test_reduced_by_size_fractional_renders_the_same_crop():
    """The --fractional experiment decodes the crop's window at the smallest M/8 scale
    and renders it as the shipped path does: the same crop, about as close to the plain
    path (the whole image at full scale) as the shipped 1/2-scale decode is (measured:
    2.6 vs 2.4 grey levels mean difference on these grainy photos at 3/8), where another
    crop differs by tens."""
    rbs = _bench_module("reduced_by_size")
    MEAN, STD, make_set = rbs.MEAN, rbs.STD, rbs.make_set  # (from transforms_bench)
    from seqloader.write.prepare import add_restart_markers
    from seqloader.transforms import (Compose, Normalize, RandomHorizontalFlip,
                                      RandomResizedCrop, ToTensor, compile_fused)

    recipe = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                      Normalize(MEAN, STD)])
    fused = compile_fused(recipe)
    plain = compile_fused(recipe, reduced_decode=False, partial_decode=False)
    jpeg = add_restart_markers(make_set([(900, 1200)], 1, 3, 85)[0])
    shipped, m8, ref, other = (np.empty(fused.out_shape, fused.out_dtype) for _ in range(4))
    grey = np.asarray(STD, np.float32)[:, None, None] * 255  # normalised units -> grey levels
    diffs, scales = [], set()
    for seed in range(40):
        p = fused.prepare(jpeg, np.random.default_rng(seed))
        if p.plan.k < 2:
            continue
        for pipe, out, s in ((fused, shipped, seed), (plain, ref, seed), (plain, other, seed + 1)):
            pipe(jpeg, out, np.random.default_rng(s))
        rbs.decode_m8(fused, jpeg, np.random.default_rng(seed), m8)
        w = p.plan.window
        scales.add(next(m for m in range(1, 9) if min(w.x1 - w.x0, w.y1 - w.y0) * m >= 8 * 224))
        diffs.append([float(np.abs((x - ref) * grey).mean()) for x in (shipped, m8, other)])
    shipped_d, m8_d, other_d = np.mean(diffs, axis=0)
    assert len(scales) >= 2 and len(diffs) >= 10  # e.g. 3/8 and 4/8 both occur
    assert m8_d < 1.5 * shipped_d + 0.5, (m8_d, shipped_d)
    assert other_d > 10 * shipped_d, (other_d, shipped_d)


def _committed_bytes() -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (BENCH / "results").rglob("*") if p.is_file()}


def test_benchmark_scripts_name_no_machine_paths():
    """Data and tool paths are arguments: no script or README defaults to one machine's
    folders."""
    for f in sorted(BENCH.glob("*.py")) + [BENCH / "README.md"]:
        text = f.read_text()
        for bad in ("/work/", "bench-data"):
            assert bad not in text, f"{f.name} names {bad!r}: take the path as an argument"


@pytest.mark.parametrize("script, flag", [
    ("hdd_compare.py", "--data"), ("preprocess_bench.py", "--data"),
    ("memory_epochs.py", "--data"), ("cpu_ratio.py", "--data"), ("hdd_ratio.py", "--data"),
    ("epoch_gaps.py", "--db")])
def test_benchmark_scripts_require_their_data_path(script, flag, tmp_path):
    p = subprocess.run([sys.executable, str(BENCH / script)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"required: {flag}" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow  # (a benchmark script end to end: seconds)
def test_shuffle_quality_writes_into_the_current_folder_by_default(tmp_path):
    before = _committed_bytes()
    doc = _run("shuffle_quality.py", "--classes", "4", "--per-class", "30", "--caches", "10",
               "--chunks", "4", "--batch-size", "8", "--json", "--no-progress", cwd=tmp_path)
    assert doc["rows"] and (tmp_path / "shuffle_quality.md").exists()
    assert (tmp_path / "shuffle_quality.json").exists()
    assert _committed_bytes() == before


def test_memory_epochs_report_goes_to_out(tmp_path):
    """``--report-only`` re-renders the .md from the .json in ``--out``; the committed
    report is not touched."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(BENCH / "results" / "memory.json", out / "memory.json")
    before = _committed_bytes()
    _script("memory_epochs.py", "--data", str(tmp_path), "--report-only", "--out", "out",
            cwd=tmp_path, timeout=60)
    md = (out / "memory.md").read_text()
    assert md.startswith("# Loader memory over epochs") and "| 19 |" in md
    assert _committed_bytes() == before


@pytest.mark.slow
def test_hdd_compare_report_from_raw_runs_in_out(tmp_path):
    """The report phase assembles ``OUT/raw/hdd_compare/*.json`` into ``OUT``."""
    out = tmp_path / "out"
    shutil.copytree(BENCH / "results" / "raw" / "hdd_compare", out / "raw" / "hdd_compare")
    before = _committed_bytes()
    _script("hdd_compare.py", "--data", str(tmp_path), "--phase", "report", "--out", str(out),
            cwd=tmp_path, timeout=120)
    doc = json.loads((out / "hdd_compare.json").read_text())
    assert doc["rows"] and (out / "hdd_compare.md").read_text().startswith("#")
    assert _committed_bytes() == before


@pytest.mark.slow
def test_raw_cpu_compares_checkouts(lmdb_dir):
    """benchmarks/raw_cpu.py: two runs of this checkout, the same digest (records, order)."""
    root = BENCH.parent
    p = _script("raw_cpu.py", str(lmdb_dir), "--checkout", f"a={root}", "--checkout", f"b={root}",
                "--rounds", "1", "--epochs", "1", "--batch-size", "4", "--cache", "8",
                "--consume", "copy", cwd=root)
    lines = [x for x in p.stdout.splitlines() if x.startswith("round 0")]
    assert len(lines) == 2 and lines[0].split()[-2] == lines[1].split()[-2]


@pytest.mark.slow
def test_gpu_node_runs_every_part_on_the_cpu(tmp_path):
    """benchmarks/gpu_node.py end to end with --device cpu, tiny: every part measured,
    the report written (the device run uses the same code on CUDA)."""
    _script("gpu_node.py", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
            "--device", "cpu", "--images", "40", "--workers", "1,2", "--gpu-workers", "1",
            "--seconds", "1", "--batch-size", "8", "--size", "32", "--floor-images", "16",
            "--budget", "280", cwd=tmp_path, timeout=300)
    res = json.loads((tmp_path / "out" / "gpu_node.json").read_text())
    parts = res["parts"]
    assert [r["workers"] for r in parts["cpu"]] == [1, 2]
    assert all("error" not in r and r["images_per_s"] > 0 for r in parts["cpu"] + parts["gpu"])
    assert {r["recipe"] for r in parts["gpu"]} == {"train", "eval"}
    # (32 px from ImageNet-sized images: ~4 grey levels mean, docs/gpu.md; ~0.8 at 224)
    assert parts["pixels"]["train"]["mean"] < 8 and parts["pixels"]["eval"]["mean"] < 8
    assert parts["floor"]["pageable"]["images_per_s"] > 0
    assert "gpu_over_cpu_top" in res["summary"] and "decode_floor_images_per_s" in res["summary"]
    assert "## Goals" in (tmp_path / "out" / "gpu_node.md").read_text()


@pytest.mark.slow  # (a benchmark script end to end: seconds)
def test_dbtools_hdd_script(lmdb_dir, tmp_path):
    """Every step of benchmarks/dbtools_hdd.py runs (a fake hddsim: the wiring only)."""
    fake = tmp_path / "fake-hddsim"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    p = _script("dbtools_hdd.py", str(lmdb_dir), str(tmp_path / "work"), "--hddsim", str(fake),
                "--json", str(tmp_path / "r.json"), cwd=tmp_path)
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["step"] for r in rows][:3] == ["read", "reshard", "subset-half"] and len(rows) == 9
    assert all(r["wall_s"] >= 0 and r["source_bytes"] > 0 for r in rows)
    assert all(r["output_bytes"] > 0 for r in rows[1:]) and p.stdout.count("\n") == 9


def test_zip_inflate_cost_inflates_every_deflated_member(tmp_path):
    """preprocess_zip_parquet.py --inflate-cost: every deflated member inflated and
    CRC-checked (stored members are no cost), so a damaged one is not timed as good."""
    import zipfile

    mod = _bench_module("preprocess_zip_parquet")
    z = tmp_path / "a.zip"
    data = [os.urandom(5000) for _ in range(4)]  # (incompressible: stored blocks)
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as zf:
        for i, d in enumerate(data):
            zf.writestr(f"c/{i}.JPEG", d)
        zf.writestr("stored", b"x" * 100, compress_type=zipfile.ZIP_STORED)
    got = mod.inflate_cost(z, rounds=1)
    assert got["members"] == 4 and got["MB"] == 4 * 5000 / 1e6 and got["zlib cpu s"] >= 0
    raw = bytearray(z.read_bytes())
    at = raw.index(data[2][:8])  # a deflate stored-block payload: flip a byte in it
    raw[at] ^= 0xFF
    z.write_bytes(bytes(raw))
    with pytest.raises(AssertionError, match="damaged"):
        mod.inflate_cost(z, rounds=1)


@pytest.mark.slow  # (a benchmark script end to end: seconds)
def test_first_batch_and_stats_cost_run(lmdb_dir, tmp_path):
    """benchmarks/first_batch.py (issue 39's first-batch and throughput A/B unit) and
    stats_cost.py, tiny."""
    out = tmp_path / "rows.jsonl"
    for transform in ("fused", "cv2"):
        _script("first_batch.py", str(lmdb_dir), "--transform", transform, "--batch-size", "8",
                "--epochs", "2", "--out", str(out), cwd=tmp_path)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["transform"] for r in rows] == ["fused", "cv2"]
    assert all(r["first_batch_s"] > 0 and r["images_per_s"] > 0 for r in rows)
    assert all(r["stats_first_batch_s"] == pytest.approx(r["first_batch_s"], abs=0.01)
               for r in rows)
    p = _script("stats_cost.py", cwd=tmp_path)
    assert "% of a batch's CPU" in p.stdout and "total" in p.stdout
