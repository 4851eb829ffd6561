"""Interrupted tool runs: a re-run of the same command finishes the job, whatever the
moment of the kill (NOTE [ unclaimed partial files ] in copier.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pytest

from seqloader.read.database import open_database
from seqloader.tools.dbtools.verify import verify_database
from seqloader.tools.dbtools import copier, merge, reshard, subset

REPO = Path(__file__).resolve().parents[3]


def snapshot(folder):
    """What a tool's output holds: per split, each file's records, checksum, digests."""
    from conftest import raw_items

    out = {}
    for p in sorted(Path(folder).glob("*.lmdb")):
        m = open_database(p).metas[0]
        recs = [kv for kv in raw_items(p) if not kv[0].startswith(b"__")]
        out[p.name] = (recs, m.checksum, m.digests, m.labels, m.num_records)
    return out


def leftovers(folder):
    return sorted(p.name for p in Path(folder).iterdir() if ".partial" in p.name
                  or p.name.endswith(".shuffle"))


def run_cli(args, kill_after=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "seqloader", *args, "--no-progress"],
                            env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        time.sleep(kill_after)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_a_partial_without_committed_metadata_is_restarted(lmdb_dir, tmp_path):
    ref = tmp_path / "ref"
    reshard(lmdb_dir, ref, split="train", shards=3, progress=False)
    out = tmp_path / "out"
    out.mkdir()
    # killed before its first commit: an LMDB with no seqloader metadata (8 KiB + lock)
    partial = out / "ILSVRC-train-00001-of-00003.lmdb.partial"
    env = lmdb.open(str(partial), subdir=False)
    env.close()
    assert partial.stat().st_size > 0
    reshard(lmdb_dir, out, split="train", shards=3, progress=False)
    assert snapshot(out) == snapshot(ref) and leftovers(out) == []


def test_unfinished_tool_output_names_the_tool(lmdb_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(copier.write_copy.__kwdefaults__, "commit_bytes", 1)
    real = copier._ShardCopy._write

    def dies(self, env, meta, values):
        def some():
            for j, v in enumerate(values):
                if j == 3:
                    raise KeyboardInterrupt
                yield v
        real(self, env, meta, some())

    monkeypatch.setattr(copier._ShardCopy, "_write", dies)
    with pytest.raises(KeyboardInterrupt):
        reshard(lmdb_dir, tmp_path / "o", split="train", shards=1, progress=False)
    with pytest.raises(FileNotFoundError, match="re-run the same seqloader reshard command"):
        open_database(tmp_path / "o", "train")


CASES = {
    "reshard": (lambda src, out: reshard(src, out, shards=3, progress=False),
                lambda src, out: ["reshard", str(src), str(out), "--shards", "3"]),
    "subset": (lambda src, out: subset(src, out, fraction=0.5, seed=3, shards=2, progress=False),
               lambda src, out: ["subset", str(src), str(out), "--fraction", "0.5", "--seed", "3",
                                 "--shards", "2"]),
    "merge-shuffle": (lambda src, out: merge([src], out, shuffle=True, seed=5, shards=2,
                                             memory_budget=4 << 20, progress=False),
                      lambda src, out: ["merge", str(src), str(out), "--shuffle", "--seed", "5",
                                        "--shards", "2", "--memory-budget", "4MiB"]),
}


def kill_anywhere(tool, big_db, tmp_path, fractions):
    """Run ``tool``'s command uninterrupted (timed), then for each fraction f kill a fresh
    run's process group f x that time after its start and re-run it: the same output.
    How many kills left unfinished files behind (the rest came too early or too late)."""
    src = big_db.paths[0]
    api, args = CASES[tool]
    ref = tmp_path / "ref"
    t0 = time.monotonic()
    assert run_cli(args(src, ref))[0] == 0
    took = time.monotonic() - t0
    cut = 0
    for f in fractions:
        out = tmp_path / f"k{round(f * 100)}"
        run_cli(args(src, out), kill_after=f * took)
        cut += bool(leftovers(out)) if out.exists() else 0
        rc, err = run_cli(args(src, out))
        assert rc == 0, f"{tool}, killed after {f * took:.2f} s: re-run exited {rc}: {err}"
        assert snapshot(out) == snapshot(ref), f"{tool}, killed after {f * took:.2f} s"
        assert leftovers(out) == []
        assert verify_database(out, "train", workers=1, progress=False).ok
    return cut


@pytest.mark.parametrize("tool", [t if i == 0 else pytest.param(t, marks=pytest.mark.slow)
                                  for i, t in enumerate(CASES)])  # (one tool by default)
def test_kill_anywhere_then_rerun_gives_the_uninterrupted_result(tool, big_db, tmp_path):
    kill_anywhere(tool, big_db, tmp_path, [0.75, 0.9])


@pytest.mark.slow
@pytest.mark.parametrize("tool", list(CASES))
def test_kill_anywhere_many_times(tool, big_db, tmp_path):
    fractions = [0.4 + 0.05 * k for k in range(12)]
    assert kill_anywhere(tool, big_db, tmp_path, fractions) >= 2  # (some kills cut a write)
