"""reshard and merge: copies as stored, any layout, resumable, checked by verify."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_digests_match, assert_extents_match, read_records
from seqloader.cli import main as cli
from seqloader.read.database import open_database
from seqloader.tools.dbtools import merge, reshard, subset
from seqloader.tools.dbtools.copier import CopyPlan, write_copy
from seqloader.tools.dbtools.stream import Selection, RecordStream, runs
from seqloader.tools.dbtools.verify import verify_database


def values(path, split=None):
    """Every record value of a database (a whole shard set), in global order (as stored)."""
    from seqloader.read.reader import RangeReader

    db = open_database(path, split)
    r = RangeReader(db)
    try:
        return [bytes(v) for _, v in r.read([(0, db.num_records)])]
    finally:
        r.close()


def test_runs_bridge_small_gaps():
    idx = np.array([0, 1, 2, 5, 6, 20])
    assert runs(idx) == [(0, 3), (5, 7), (20, 21)]
    assert runs(idx, bridge=2) == [(0, 7), (20, 21)]
    assert runs(np.zeros(0, np.int64)) == []


def test_reshard_to_m_then_back_gives_identical_records(lmdb_dir, tmp_path):
    src = lmdb_dir / "ILSVRC-train.lmdb"
    reshard(lmdb_dir, tmp_path / "m", split="train", shards=3, progress=False)
    db3 = open_database(tmp_path / "m", "train")
    assert len(db3.paths) == 3 and db3.num_records == open_database(src).num_records
    reshard(tmp_path / "m", tmp_path / "back", shards=1, progress=False)
    back = tmp_path / "back" / "ILSVRC-train.lmdb"
    assert values(back) == values(src)  # the very bytes, in order
    a, b = open_database(src), open_database(back)
    assert a.metas[0].checksum == b.metas[0].checksum  # same records, same keys: same chain
    assert np.array_equal(a.labels(), b.labels()) and a.classes == b.classes
    assert len(a.metas[0].bad_files) == sum(len(m.bad_files) for m in db3.metas) > 0
    for d in (tmp_path / "m", tmp_path / "back"):
        assert verify_database(d, "train", workers=1, progress=False).ok
    for p in (*db3.paths, back):
        assert_extents_match(p)  # taken at each commit, as the writer takes them
        assert_digests_match(p)
    assert b.metas[0].digests == a.metas[0].digests


def test_shard_ids_write_one_range_each_and_rerun_skips_finished(lmdb_dir, tmp_path):
    out = tmp_path / "out"
    reshard(lmdb_dir, out, split="val", shards=3, shard_ids=[2], progress=False)
    with pytest.raises(Exception, match="missing"):
        open_database(out, "val")  # (an unfinished set never opens)
    reshard(lmdb_dir, out, split="val", shards=3, shard_ids=[0, 1], progress=False)
    mtime = (out / "ILSVRC-val-00002-of-00003.lmdb").stat().st_mtime_ns
    reshard(lmdb_dir, out, split="val", shards=3, progress=False)  # all done: skipped
    assert (out / "ILSVRC-val-00002-of-00003.lmdb").stat().st_mtime_ns == mtime
    assert values(out, "val") == values(lmdb_dir, "val")
    assert verify_database(out, "val", workers=1, progress=False).ok


def test_refuses_other_outputs_without_overwrite(lmdb_dir, tmp_path, capsys):
    out = tmp_path / "out"
    reshard(lmdb_dir, out, split="val", shards=2, progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        reshard(lmdb_dir, out, split="val", shards=1, progress=False)
    assert cli(["reshard", str(lmdb_dir), str(out), "--split", "val", "--shards", "1",
                "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seqloader reshard: error:" in err and "--overwrite" in err
    reshard(lmdb_dir, out, split="val", shards=1, overwrite=True, progress=False)
    assert [p.name for p in sorted(out.glob("*.lmdb"))] == ["ILSVRC-val.lmdb"]
    with pytest.raises(ValueError, match="folder outside it"):
        reshard(lmdb_dir, lmdb_dir, split="val", shards=1, overwrite=True, progress=False)


def test_a_crash_leaves_no_database_and_a_rerun_resumes(lmdb_dir, tmp_path):
    """Killed after its first commit: only a .partial is left; the re-run resumes it
    after the committed records and writes the bytes of an uninterrupted run."""
    db = open_database(lmdb_dir, "train")
    stream = RecordStream([Selection(db, np.arange(db.num_records))])
    plan = CopyPlan("train", db.num_records, db.labels(), db.metas[0], "fp-test")

    def dying(start, stop):
        for k, v in enumerate(stream(start, stop)):
            if k == 10:
                raise KeyboardInterrupt
            yield v

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_copy(plan, dying, out, progress=False, commit_bytes=1)
    assert not (out / "ILSVRC-train.lmdb").exists()
    assert (out / "ILSVRC-train.lmdb.partial").exists()
    with pytest.raises(FileNotFoundError):
        open_database(out, "train")
    asked = []

    def counting(start, stop):
        asked.append(start)
        return stream(start, stop)

    write_copy(plan, counting, out, progress=False)
    stream.close()
    assert asked == [10]  # resumed after the 10 committed records
    assert values(out / "ILSVRC-train.lmdb") == values(lmdb_dir / "ILSVRC-train.lmdb")
    # the first 10 digests recomputed from the committed records (NOTE [ resumed digests ])
    assert open_database(out, "train").metas[0].digests == db.metas[0].digests
    assert verify_database(out, "train", workers=1, progress=False).ok


def test_subset_and_merge_of_the_complement_give_the_original_set(lmdb_dir, tmp_path):
    kw = dict(split="train", fraction=0.4, seed=5, progress=False)
    subset(lmdb_dir, tmp_path / "a", **kw)
    subset(lmdb_dir, tmp_path / "b", complement=True, **kw)
    merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m", progress=False)
    orig, merged = values(lmdb_dir / "ILSVRC-train.lmdb"), values(tmp_path / "m" / "ILSVRC-train.lmdb")
    assert len(merged) == len(orig) and sorted(merged) == sorted(orig)
    assert open_database(tmp_path / "m", "train").classes == open_database(lmdb_dir, "train").classes
    assert verify_database(tmp_path / "m", "train", workers=1, progress=False).ok


def test_merge_shuffled_is_seeded_sequential_and_complete(lmdb_dir, tmp_path):
    orig = values(lmdb_dir / "ILSVRC-train.lmdb")
    for name, budget in (("mem", 1 << 30), ("disk", 20_000)):  # in memory, and in buckets
        merge([lmdb_dir / "ILSVRC-train.lmdb"], tmp_path / name, shuffle=True, seed=3,
              shards=2, memory_budget=budget, progress=False)
        assert not list((tmp_path / name).glob(".*shuffle*"))  # scratch removed
    got = values(tmp_path / "mem", "train")
    assert got == values(tmp_path / "disk", "train")  # fixed by the seed, not the budget
    both = open_database(tmp_path / "mem", "train")
    assert sorted(got) == sorted(orig) and got != orig
    assert both.metas[0].shuffled and both.metas[0].seed == 3
    assert verify_database(tmp_path / "disk", "train", workers=1, progress=False).ok


def test_merge_by_split_name_and_into_one_split_unites_classes(lmdb_dir, tmp_path):
    subset(lmdb_dir, tmp_path / "first", classes=["0", "1"], renumber=True, progress=False)
    subset(lmdb_dir, tmp_path / "last", classes=["2", "3"], renumber=True, progress=False)
    merge([tmp_path / "first", tmp_path / "last"], tmp_path / "sets", progress=False)
    full = open_database(lmdb_dir, "train")
    for split in ("train", "val"):
        m = open_database(tmp_path / "sets", split)
        assert m.classes == full.classes  # labels renumbered back to the united list
        recs = {r.image: r.label for _, r in read_records(m.paths[0])}
        orig = {r.image: r.label for _, r in read_records(open_database(lmdb_dir, split).paths[0])}
        assert recs == orig
        assert verify_database(tmp_path / "sets", split, workers=1, progress=False).ok
    merge([tmp_path / "first"], tmp_path / "one", into="all", progress=False)
    one = open_database(tmp_path / "one", "all")
    assert one.num_records == sum(open_database(tmp_path / "first", s).num_records
                                  for s in ("train", "val"))


def test_summary_counts_what_this_run_wrote_and_names_the_target_kind(lmdb_dir, tmp_path,
                                                                      capsys):
    n = open_database(lmdb_dir, "train").num_records
    assert cli(["reshard", str(lmdb_dir), str(tmp_path / "r"), "--split", "train", "--shards",
                "3", "--shard-ids", "0", "2", "--no-progress"]) == 0
    from seqloader.read.database import file_meta

    written = sum(file_meta(tmp_path / "r" / f"ILSVRC-train-0000{k}-of-00003.lmdb").num_records
                  for k in (0, 2))
    assert f"train: {written} records (of the split's {n}), 4 classes in 2 file(s)" in \
        capsys.readouterr().out
    from seqloader.write.dataset import write_dataset

    rng = np.random.default_rng(0)
    write_dataset([(rng.integers(0, 255, (6, 5, 3), np.uint8), {"a": i}) for i in range(4)],
                  tmp_path / "any", image_format="pixels", progress=False, workers=1)
    assert cli(["reshard", str(tmp_path / "any"), str(tmp_path / "r2"), "--shards", "2",
                "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "train: 4 records, any targets in 2 file(s)" in out and "0 classes" not in out


def test_a_merge_says_its_order_and_counts_each_bad_file_once(lmdb_dir, tmp_path):
    """Two shuffled subsets merged were recorded as "order: sorted", with the source's 3
    bad files counted twice (6)."""
    from seqloader.tools.dbtools import describe
    from seqloader.tools.dbtools.info import format_info

    subset(lmdb_dir, tmp_path / "half", split="train", fraction=0.5, seed=7, progress=False)
    subset(lmdb_dir, tmp_path / "rest", split="train", fraction=0.5, seed=7, complement=True,
           progress=False)
    merge([tmp_path / "half", tmp_path / "rest"], tmp_path / "whole", progress=False)
    info = describe(tmp_path / "whole", "train")
    assert info["shuffled"] and info["seed"] is None and info["bad_files"] == 3
    text = format_info(info)
    assert "order: shuffled (several shuffled sources in turn: no one seed); 3 bad" in text
    # a shuffled and a sorted source in turn: neither shuffled nor sorted
    merge([lmdb_dir / "ILSVRC-train.lmdb", lmdb_dir / "ILSVRC-val.lmdb"], tmp_path / "tv",
          into="trainval", progress=False)
    info = describe(tmp_path / "tv", "trainval")
    assert not info["shuffled"] and info["bad_files"] == 3
    assert "order: the sources' orders in turn (shuffled, sorted)" in format_info(info)
    # one source, or a reshuffle: as before
    assert describe(tmp_path / "half", "train")["seed"] == 0
    merge([tmp_path / "half", tmp_path / "rest"], tmp_path / "mixed", shuffle=True, seed=5,
          progress=False)
    assert "order: shuffled, seed 5;" in format_info(describe(tmp_path / "mixed", "train"))
