"""Crash-safe preprocessing: a writer killed at any moment (the whole process group,
SIGKILL) and re-run with the same command finishes to the identical database."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from conftest import assert_digests_match, assert_extents_match, raw_items
from seqloader import WriteOptions, open_database, preprocess
from seqloader.format.files import shard_path
from seqloader.format.keys import META_KEY
from seqloader.read.database import Database, open_env, close_env, read_meta
from seqloader.read.pages import LIBC
from seqloader.read.reader import RangeReader

REPO = Path(__file__).resolve().parents[2]
SHARDS = 2
COMMIT_BYTES = 20000

#: The writer, slowed a little so that kills by time land inside it; ``commit`` mode kills
#: its own process group ``delay`` seconds into commit number ``n`` (during the commit's
#: LMDB write or fsync, or right after it when the commit was faster), ``after`` mode
#: right after commit ``n`` returned.
WRITER = textwrap.dedent("""
    import os, signal, sys, threading, time, warnings
    warnings.simplefilter("ignore")
    import seqloader.write.shardwriter as w
    real = w.prepare_image
    def slow(*a, **k):
        time.sleep(0.005)
        return real(*a, **k)
    w.prepare_image = slow
    mode, n, delay = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    commit, count = w.ShardWriter._commit, [0]
    def killing_commit(*a, **k):
        count[0] += 1
        if mode == "commit" and count[0] == n:
            threading.Timer(delay, os.killpg, (0, signal.SIGKILL)).start()
        commit(*a, **k)
        if mode == "after" and count[0] == n:
            os.killpg(0, signal.SIGKILL)
    w.ShardWriter._commit = killing_commit
    from seqloader import preprocess, WriteOptions
    preprocess(sys.argv[1], sys.argv[2], splits=["train"],
               options=WriteOptions(progress=False, workers=2, commit_bytes=%d, shards=%d))
""" % (COMMIT_BYTES, SHARDS))


def _start(tree, out, mode="none", n=0, delay=0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(tree), str(out), mode, str(n),
                             str(delay)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=60)


def _partial_bytes(out: Path) -> int:
    total = 0
    for k in range(SHARDS):
        p = shard_path(out / "ILSVRC-train.lmdb", k, SHARDS)
        for q in (p, p.with_suffix(".lmdb.partial")):
            try:
                total += q.stat().st_size
            except OSError:
                pass
    return total


def _interrupt(tree, out, kind: str, rng: random.Random) -> None:
    """One run of the writer, killed (with its decode workers) by ``kind``."""
    if kind in ("commit", "after"):
        proc = _start(tree, out, kind, rng.randint(1, 12), rng.uniform(0, 0.004))
        proc.communicate(timeout=120)
        return
    proc = _start(tree, out)
    deadline = time.time() + 60
    if kind == "time":
        time.sleep(rng.uniform(0.1, 1.0))
    else:  # "bytes": once this many bytes are in the output files
        target = rng.randint(1, 400_000)
        while _partial_bytes(out) < target and proc.poll() is None and time.time() < deadline:
            time.sleep(0.001)
    _kill_group(proc)


def _finish(tree, out) -> None:
    proc = _start(tree, out)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"re-run exited {proc.returncode}:\n{err[-3000:]}"
    assert "Traceback" not in err and "Fatal Python error" not in err, err[-3000:]


def _assert_same_database(ref: Path, out: Path) -> None:
    for k in range(SHARDS):
        a, b = (shard_path(d / "ILSVRC-train.lmdb", k, SHARDS) for d in (ref, out))
        assert not b.with_suffix(".lmdb.partial").exists()
        assert [x for x in raw_items(a) if x[0] != META_KEY] == \
            [x for x in raw_items(b) if x[0] != META_KEY]
        ma, mb = open_database(a).metas[0], open_database(b).metas[0]
        for field in ("checksum", "num_records", "fingerprint", "labels", "bad_files",
                      "next_source", "image_bytes", "digests"):
            assert getattr(ma, field) == getattr(mb, field), field
        assert_extents_match(b)
        assert_digests_match(b)  # (the first part recomputed by the re-run)


@pytest.fixture(scope="module")
def reference(synth_tree, tmp_path_factory):
    ref = tmp_path_factory.mktemp("ref")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, ref, splits=["train"],
                   options=WriteOptions(progress=False, workers=2, commit_bytes=COMMIT_BYTES,
                                        shards=SHARDS))
    return ref


def _kill_and_resume(tree, ref, tmp_path, seed: int, kinds) -> None:
    rng = random.Random(seed)
    for i, kind in enumerate(kinds):
        out = tmp_path / f"out{seed}-{i}"
        _interrupt(tree, out, kind, rng)
        if rng.random() < 0.3:  # the re-run killed too, at another moment
            _interrupt(tree, out, rng.choice(("commit", "after", "time")), rng)
        _finish(tree, out)
        _assert_same_database(ref, out)


def test_killed_anywhere_resumes_to_the_identical_database(synth_tree, reference, tmp_path):
    """Kills during commits, right after them, by time and by bytes written."""
    _kill_and_resume(synth_tree.root, reference, tmp_path, 0,
                     ["commit", "commit", "after", "time", "bytes"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 9))
def test_killed_anywhere_many_times_in_a_row(synth_tree, reference, tmp_path, seed):
    _kill_and_resume(synth_tree.root, reference, tmp_path, seed,
                     ["commit", "after", "time", "bytes"] * 3)


def _mapping_end(start: int) -> int:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo == start:
                return hi
    raise AssertionError(f"no mapping starts at {start:#x}")


@pytest.mark.skipif(LIBC is None, reason="Linux only")
def test_indexing_a_partial_file_with_uncommitted_pages_stays_inside_its_map(
        synth_tree, tmp_path, monkeypatch):
    """A writer killed inside a commit leaves pages after the last committed one.  LMDB
    maps only the committed pages (or its default 10 MiB), and the resume's walk used to
    madvise(DONTNEED) the whole file's length from the map's start: whatever the process
    had mapped after the map was zeroed -- the SIGSEGV on re-runs.  Every unmap stays
    inside the file's map now."""
    from seqloader.read import shard as shard_module

    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, out, splits=["train"],
                   options=WriteOptions(progress=False, workers=1, commit_bytes=COMMIT_BYTES))
    partial = out / "partial.lmdb"
    data = (out / "ILSVRC-train.lmdb").read_bytes()
    partial.write_bytes(data + b"\xab" * (12 << 20))  # uncommitted pages, past LMDB's map
    env = open_env(partial)
    meta = read_meta(env, partial)
    close_env(env)
    meta.extents = None  # (walk the B-tree, as a resume does)
    calls = []
    monkeypatch.setattr(shard_module, "unmap", lambda start, n: calls.append((start, n)))
    reader = RangeReader(Database((partial,), (meta,)))
    try:
        ext = reader.extents([(0, meta.num_records)])
        shard, = reader._open()
        end = _mapping_end(shard.base)
        assert calls and all(shard.base <= s and s + n <= end for s, n in calls), \
            (calls, shard.base, end)
    finally:
        reader.close()
    got = [data[o:o + n] for o, n in ext.tolist()]
    assert got == [v for k, v in raw_items(out / "ILSVRC-train.lmdb") if k != META_KEY]


#: The archive writer (preprocess_sources: the external shuffle's two passes, then the
#: shard writer) over zip or parquet sources, slowed a little; ``commit`` mode kills its
#: process group ``delay`` s into commit ``n`` (pass 1's or the writer's, counted together).
SOURCE_WRITER = textwrap.dedent("""
    import os, signal, sys, threading, time, warnings
    warnings.simplefilter("ignore")
    from seqloader.write import extshuffle as x, shardwriter as w
    real = x.read_item
    def slow(*a, **k):
        time.sleep(0.003)
        return real(*a, **k)
    x.read_item = slow
    mode, n, delay = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    count = [0]
    def killing(commit):
        def run(*a, **k):
            count[0] += 1
            if mode == "commit" and count[0] == n:
                threading.Timer(delay, os.killpg, (0, signal.SIGKILL)).start()
            return commit(*a, **k)
        return run
    x._Pass1._commit = killing(x._Pass1._commit)
    w.ShardWriter._commit = killing(w.ShardWriter._commit)
    from seqloader import WriteOptions
    from seqloader.write.preprocess import preprocess_sources
    preprocess_sources(sys.argv[1].split(","), sys.argv[2], memory_budget=150_000,
                       options=WriteOptions(progress=False, workers=2, commit_bytes=%d))
""" % COMMIT_BYTES)


@pytest.fixture(scope="module")
def downloads(synth_tree, tmp_path_factory):
    """{kind: (its files, joined by ',', the database of an uninterrupted run)}."""
    from kaggle_hf import KAGGLE_NAME, hf_parquet, kaggle_zip

    root = tmp_path_factory.mktemp("downloads")
    kinds = {"kaggle zip": [kaggle_zip(synth_tree.root, root / KAGGLE_NAME)]}
    try:
        kinds["hf parquet"] = [f for f in hf_parquet(synth_tree.root, root / "hf", row_group=4)
                               if not f.name.startswith("test")]
    except ImportError:
        pass
    out = {}
    for kind, files in kinds.items():
        arg = ",".join(map(str, files))
        ref = root / kind.replace(" ", "-")
        proc = _start_source(arg, ref)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        out[kind] = arg, ref
    return out


def _start_source(arg: str, out, mode="none", n=0, delay=0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", SOURCE_WRITER, arg, str(out), mode, str(n),
                             str(delay)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_source_and_resume(downloads, kind, tmp_path, seed: int, kills: int) -> None:
    if kind not in downloads:
        pytest.skip("needs pyarrow (pip install -c constraints.txt -e '.[parquet]')")
    arg, ref = downloads[kind]
    rng = random.Random(seed)
    out = tmp_path / f"out{seed}"
    for _ in range(kills):  # each run killed, by a commit's moment or by time
        if rng.random() < 0.5:
            proc = _start_source(arg, out, "commit", rng.randint(1, 40), rng.uniform(0, 0.004))
            proc.communicate(timeout=120)
        else:
            proc = _start_source(arg, out)
            time.sleep(rng.uniform(0.2, 2.5))
            _kill_group(proc)
    proc = _start_source(arg, out)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    for split in ("train", "val"):
        a, b = ref / f"ILSVRC-{split}.lmdb", out / f"ILSVRC-{split}.lmdb"
        assert [x for x in raw_items(a) if x[0] != META_KEY] == \
            [x for x in raw_items(b) if x[0] != META_KEY], split
        ma, mb = open_database(a).metas[0], open_database(b).metas[0]
        for field in ("checksum", "num_records", "fingerprint", "labels", "bad_files",
                      "classes", "writer"):
            assert getattr(ma, field) == getattr(mb, field), (split, field)
    assert not list(out.glob("*.scratch")) and not list(out.glob("*.partial"))


@pytest.mark.parametrize("kind", ["kaggle zip", "hf parquet"])
def test_a_killed_zip_or_parquet_preprocess_resumes_to_the_identical_database(
        downloads, kind, tmp_path):
    _kill_source_and_resume(downloads, kind, tmp_path, 0, 2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 5))
@pytest.mark.parametrize("kind", ["kaggle zip", "hf parquet"])
def test_zip_and_parquet_killed_many_times_in_a_row(downloads, kind, tmp_path, seed):
    _kill_source_and_resume(downloads, kind, tmp_path, seed, 5)
