import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import lmdb
import pytest

from conftest import (assert_digests_match, assert_extents_match, raw_items, read_records,
                      resident_fraction, skip_unless_pages_can_be_dropped)
from seqloader import BadImageError, WriteOptions, open_database, preprocess
from seqloader.write.scan import scan_class_tree
from seqloader.write.writer import write_split
from seqloader.cli import main as cli
from seqloader.format.meta import PLAIN_VERSION
from seqloader.format.keys import META_KEY, encode_key
from seqloader.format.files import shard_path
from seqloader.errors import FormatError, IncompleteError
from seqloader.write.prepare import decode_bgr
from seqloader.write.writer import write_order

REPO = Path(__file__).resolve().parents[2]


def _opts(**kw):
    kw.setdefault("progress", False)
    kw.setdefault("workers", 2)
    return WriteOptions(**kw)


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def test_every_good_image_stored_exactly_once_with_imagefolder_labels(synth_tree, lmdb_dir):
    scan = scan_class_tree(synth_tree.root / "train")
    bad = {p.split("/", 1)[1] for p in synth_tree.bad_files if p.startswith("train/")}
    recs = read_records(lmdb_dir / "ILSVRC-train.lmdb")
    assert [i for i, _ in recs] == list(range(len(recs)))
    stored = {r.path: r for _, r in recs}
    assert len(stored) == len(recs) == len(scan) - len(bad)
    for path, label in zip(scan.paths, scan.labels.tolist()):
        if path in bad:
            assert path not in stored
            continue
        rec = stored[path]
        assert rec.label == label
        if rec.reencoded is None:
            assert rec.image == (synth_tree.root / "train" / path).read_bytes()
    db = open_database(lmdb_dir, "train")
    assert db.classes == synth_tree.classes == scan.classes


def test_odd_formats_decode_to_three_channels(synth_tree, lmdb_dir):
    recs = {f"{split}/{r.path}": r for split in ("train", "val")
            for _, r in read_records(lmdb_dir / f"ILSVRC-{split}.lmdb")}
    kinds = {k: v for k, v in synth_tree.odd_files.items() if v}
    assert {"gray", "png"} <= set(kinds)
    for kind, paths in kinds.items():
        for rel in paths:
            rec = recs[rel]
            img = decode_bgr(rec.image)
            assert img.ndim == 3 and img.shape[2] == 3
            assert rec.reencoded == (None if kind == "gray" else kind)


def test_train_is_shuffled_by_seed_and_val_sorted(synth_tree, lmdb_dir, tmp_path):
    train = [r.path for _, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")]
    assert train != sorted(train)
    val = [r.path for _, r in read_records(lmdb_dir / "ILSVRC-val.lmdb")]
    assert val == scan_class_tree(synth_tree.root / "val").paths
    _quiet(preprocess, synth_tree.root, tmp_path / "s1", splits=["train"], options=_opts(seed=5))
    _quiet(preprocess, synth_tree.root, tmp_path / "s2", splits=["train"],
           options=_opts(shuffle=False))
    other = [r.path for _, r in read_records(tmp_path / "s1/ILSVRC-train.lmdb")]
    assert sorted(other) == sorted(train) and other != train
    assert [r.path for _, r in read_records(tmp_path / "s2/ILSVRC-train.lmdb")] == sorted(train)


def test_bad_files_are_reported_not_fatal(synth_tree, lmdb_dir):
    report = (lmdb_dir / "ILSVRC-train.lmdb.bad-files.tsv").read_text().splitlines()
    listed = {line.split("\t")[0] for line in report}
    assert listed == {p.split("/", 1)[1] for p in synth_tree.bad_files}
    assert all(line.split("\t")[1] for line in report)
    meta = open_database(lmdb_dir, "train").metas[0]
    assert len(meta.bad_files) == len(synth_tree.bad_files)


def test_bad_file_warning_counts_them(synth_tree, tmp_path):
    with pytest.warns(UserWarning, match=rf"{len(synth_tree.bad_files)} file\(s\) were skipped as bad"):
        preprocess(synth_tree.root, tmp_path, splits=["train"], options=_opts())


def test_strict_stops_with_no_database(synth_tree, tmp_path, capsys):
    with pytest.raises(BadImageError, match="drop --strict"):
        _quiet(preprocess, synth_tree.root, tmp_path, splits=["train"],
               options=_opts(strict=True, shards=2))
    assert not list(tmp_path.glob("*.lmdb*"))
    code = cli(["preprocess", str(synth_tree.root), str(tmp_path / "cli"), "--strict",
                "--no-progress", "--splits", "train"])
    assert code != 0 and "JPEG" in capsys.readouterr().err
    assert not list((tmp_path / "cli").glob("*.lmdb"))


def test_strict_does_not_accept_an_output_that_skipped_bad_files(synth_tree, tmp_path,
                                                                 monkeypatch, capsys):
    """--strict must not finish a write started without it that already skipped bad files,
    nor accept a complete output that skipped some (both used to exit 0 with the files
    skipped): a non-zero exit naming the bad-files report and --overwrite, the files
    left as they are."""
    import seqloader.write.writer as W

    real = W.ShardWriter._commit

    def stop_after_a_bad_file(self, env, pending, meta):
        real(self, env, pending, meta)
        if meta.bad_files and not meta.complete:
            raise RuntimeError("stopped")
    monkeypatch.setattr(W.ShardWriter, "_commit", stop_after_a_bad_file)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="stopped"):
        _quiet(preprocess, synth_tree.root, out, splits=["train"], options=_opts(commit_bytes=1))
    monkeypatch.undo()
    partial, report = out / "ILSVRC-train.lmdb.partial", out / "ILSVRC-train.lmdb.bad-files.tsv"
    before = raw_items(partial)
    args = ["preprocess", str(synth_tree.root), str(out), "--splits", "train", "--no-progress",
            "--strict"]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert f"{partial} is an unfinished write started without --strict" in err
    assert "--overwrite" in err and str(report) in err
    assert raw_items(partial) == before and not (out / "ILSVRC-train.lmdb").exists()
    _quiet(preprocess, synth_tree.root, out, splits=["train"], options=_opts())  # finished
    assert report.exists()
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert f"skipped {len(synth_tree.bad_files)} bad file(s), listed in {report}" in err
    assert "--overwrite" in err
    assert cli(args + ["--overwrite"]) == 2 and "drop --strict" in capsys.readouterr().err


def test_shards_hold_every_record_once(synth_tree, lmdb_dir, tmp_path):
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["train"], options=_opts(shards=3))
    db = open_database(tmp_path, "train")
    assert len(db.paths) == 3 and max(db.shard_sizes) - min(db.shard_sizes) <= 3
    sharded = [r for _, r in read_records(db.paths[0])]
    single = [r for _, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")]
    assert [r.path for r in sharded] == [r.path for r in single]  # same global order
    # a single shard can be (re)written on its own, e.g. one per machine
    db.paths[1].unlink()
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["train"],
           options=_opts(shards=3, shard_ids=[1]))
    assert open_database(tmp_path, "train").shard_sizes == db.shard_sizes


def test_another_layout_of_the_split_is_replaced_only_when_told(synth_tree, tmp_path):
    """One file vs shards: readers open the single file first, so leaving it would hide
    newly written shards (and old shards beside a new single file are just as stale)."""
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts())
    with pytest.raises(FileExistsError, match=r"ILSVRC-val\.lmdb holds split 'val' in another layout"):
        _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts(shards=2))
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"],
           options=_opts(shards=2, overwrite=True))
    assert not (tmp_path / "ILSVRC-val.lmdb").exists()
    assert len(open_database(tmp_path, "val").paths) == 2
    with pytest.raises(FileExistsError, match="another layout"):
        _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts())
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts(overwrite=True))
    assert len(open_database(tmp_path, "val").paths) == 1
    assert sorted(p.name for p in tmp_path.glob("*.lmdb")) == ["ILSVRC-val.lmdb"]


def test_bad_files_report_escapes_and_is_named(tmp_path):
    """A file name with a tab or a line break must not break the report's lines, and
    the warning names the reports that exist (here one shard's)."""
    import cv2
    import numpy as np

    for i in range(6):
        d = tmp_path / "src" / "train" / "c0"
        d.mkdir(parents=True, exist_ok=True)
        ok, buf = cv2.imencode(".jpg", np.full((8, 8, 3), 30 * i, np.uint8))
        (d / f"{i}.JPEG").write_bytes(buf.tobytes())
    (d / "5.JPEG").write_bytes(b"not\ta\njpeg")
    (d / "5.JPEG").rename(d / "bad\tname\n.JPEG")
    with pytest.warns(UserWarning) as got:
        preprocess(tmp_path / "src", tmp_path / "out",
                   options=_opts(shards=2, shuffle=False))
    msg = " ".join(str(w.message) for w in got)
    report, = (tmp_path / "out").glob("*.tsv")  # one shard has the bad file
    assert f"see {report}" in msg and msg.count(".tsv") == 1
    lines = report.read_text()
    assert lines.count("\n") == 1 and lines.startswith("c0/bad\\tname\\n.JPEG\t")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_fifo_named_like_an_image_is_a_bad_file_not_a_hang(tmp_path):
    """Reading a named pipe blocks until something writes to it: one called ``x.JPEG``
    hung the run.  It is refused when opened (not a regular file) and reported."""
    import cv2
    import numpy as np

    d = tmp_path / "src" / "train" / "c0"
    d.mkdir(parents=True)
    for i in range(3):
        ok, buf = cv2.imencode(".jpg", np.full((8, 8, 3), 40 * i, np.uint8))
        (d / f"{i}.JPEG").write_bytes(buf.tobytes())
    os.mkfifo(d / "x.JPEG")
    code = textwrap.dedent(f"""
        import warnings
        from seqloader import WriteOptions, preprocess
        warnings.simplefilter("ignore")
        preprocess({str(tmp_path / "src")!r}, {str(tmp_path / "out")!r},
                   options=WriteOptions(progress=False, workers=2))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(read_records(tmp_path / "out" / "ILSVRC-train.lmdb")) == 3
    report = (tmp_path / "out" / "ILSVRC-train.lmdb.bad-files.tsv").read_text()
    assert report == "c0/x.JPEG\tcannot read: not a regular file (a FIFO, socket or device named like an image)\n"


def test_names_that_are_not_utf8_are_stored_escaped(tmp_path):
    """Latin-1 file and folder names (not valid UTF-8; Python holds them with surrogate
    escapes) stopped the whole split with an encoding error.  They are stored with the
    bytes that are not UTF-8 written as \\xNN; a re-run finds the output complete."""
    import cv2
    import numpy as np

    root = os.fsencode(tmp_path / "src" / "train")
    for cls in (b"caf\xe9", b"plain"):
        os.makedirs(os.path.join(root, cls))
        for i in range(2):
            ok, buf = cv2.imencode(".jpg", np.full((8, 8, 3), 50 * i, np.uint8))
            with open(os.path.join(root, cls, b"%d-\xe9t\xe9.JPEG" % i), "wb") as f:
                f.write(buf.tobytes())
    with open(os.path.join(root, b"plain", b"bad-\xff.JPEG"), "wb") as f:
        f.write(b"not a jpeg")
    with pytest.warns(UserWarning, match="1 file"):
        rep, = preprocess(tmp_path / "src", tmp_path / "out", options=_opts(shuffle=False))
    assert rep.num_records == 4
    db = open_database(tmp_path / "out", "train")
    assert db.classes == ["caf\\xe9", "plain"]
    paths = [r.path for _, r in read_records(tmp_path / "out" / "ILSVRC-train.lmdb")]
    assert paths == ["caf\\xe9/0-\\xe9t\\xe9.JPEG", "caf\\xe9/1-\\xe9t\\xe9.JPEG",
                     "plain/0-\\xe9t\\xe9.JPEG", "plain/1-\\xe9t\\xe9.JPEG"]
    report = (tmp_path / "out" / "ILSVRC-train.lmdb.bad-files.tsv").read_text()
    assert report.startswith("plain/bad-\\\\xff.JPEG\t")  # the report escapes the backslash
    again, = _quiet(preprocess, tmp_path / "src", tmp_path / "out", options=_opts(shuffle=False))
    assert again.shards[0].skipped


def test_existing_output_is_never_overwritten_silently(synth_tree, lmdb_dir, tmp_path):
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts())
    before = raw_items(tmp_path / "ILSVRC-val.lmdb")
    # the same command again: already complete, nothing rewritten
    rep = _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts())
    assert rep[0].shards[0].skipped
    with pytest.raises(FileExistsError, match="--overwrite"):
        _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts(verify=False))
    assert raw_items(tmp_path / "ILSVRC-val.lmdb") == before
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"],
           options=_opts(verify=False, overwrite=True))
    assert open_database(tmp_path, "val").metas[0].writer["verify"] is False


def test_map_grows_on_demand(synth_tree, tmp_path):
    rep = _quiet(preprocess, synth_tree.root, tmp_path, splits=["train"],
                 options=_opts(initial_map_size=64 << 10, commit_bytes=1 << 20))
    assert rep[0].num_records == len(read_records(tmp_path / "ILSVRC-train.lmdb"))


KILLABLE = textwrap.dedent("""
    import sys, time, warnings
    warnings.simplefilter("ignore")
    import seqloader.write.shardwriter as w
    real = w.prepare_image
    def slow(*a, **k):
        time.sleep(0.01)
        return real(*a, **k)
    w.prepare_image = slow
    from seqloader import preprocess, WriteOptions
    preprocess(sys.argv[1], sys.argv[2], splits=["train"],
               options=WriteOptions(progress=False, workers=1, commit_bytes=20000, shards=2))
""")


def _records_committed(partial: Path) -> int:
    if not partial.exists():
        return 0
    try:
        env = lmdb.open(str(partial), subdir=False, readonly=True, lock=False)
    except lmdb.Error:
        return 0
    with env.begin() as txn:
        n = txn.stat()["entries"]
    env.close()
    return n


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_write_resumes_to_identical_database(synth_tree, tmp_path, sig):
    ref = tmp_path / "ref"
    _quiet(preprocess, synth_tree.root, ref, splits=["train"], options=_opts(shards=2))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE, str(synth_tree.root), str(out)],
                            env=env)
    partial = shard_path(out / "ILSVRC-train.lmdb", 1, 2).with_suffix(".lmdb.partial")
    deadline = time.time() + 60
    while _records_committed(partial) < 5 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "writer finished before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(30)
    assert partial.exists()
    with pytest.raises(IncompleteError):
        open_database(partial, require_complete=True)
    _quiet(preprocess, synth_tree.root, out, splits=["train"], options=_opts(shards=2))
    assert not partial.exists()
    for k in range(2):
        a = raw_items(shard_path(ref / "ILSVRC-train.lmdb", k, 2))
        b = raw_items(shard_path(out / "ILSVRC-train.lmdb", k, 2))
        assert [x for x in a if x[0] != META_KEY] == [x for x in b if x[0] != META_KEY]
        ma, mb = (open_database(shard_path(d / "ILSVRC-train.lmdb", k, 2)).metas[0]
                  for d in (ref, out))
        assert (ma.checksum, ma.num_records, ma.fingerprint, ma.digests) == (
            mb.checksum, mb.num_records, mb.fingerprint, mb.digests)
        # the resumed file's extents and digests (the first part found by re-reading it)
        # are right too
        assert_extents_match(shard_path(out / "ILSVRC-train.lmdb", k, 2))
        assert_digests_match(shard_path(out / "ILSVRC-train.lmdb", k, 2))


KILLED_AFTER_RENAME = textwrap.dedent("""
    import os, sys, warnings
    warnings.simplefilter("ignore")
    real = os.replace
    def replace(src, dst, *a, **k):
        real(src, dst, *a, **k)
        if str(dst).endswith(".lmdb"):
            os._exit(137)  # a kill -9 right after the final rename
    os.replace = replace
    from seqloader import preprocess, WriteOptions
    preprocess(sys.argv[1], sys.argv[2], splits=["train"],
               options=WriteOptions(progress=False, workers=2))
""")


def test_bad_files_report_survives_a_kill_right_after_the_final_rename(synth_tree, tmp_path):
    """The .bad-files.tsv used to be written after .partial was renamed to .lmdb: a kill
    in between lost it for good (the re-run said "already complete ... see <report>" and
    there was none).  It is written (atomically) before the rename."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILLED_AFTER_RENAME, str(synth_tree.root),
                           str(out)], env=env, timeout=120)
    assert proc.returncode == 137 and (out / "ILSVRC-train.lmdb").exists()
    report = out / "ILSVRC-train.lmdb.bad-files.tsv"
    with pytest.warns(UserWarning, match=f"see {report}"):
        rep, = preprocess(synth_tree.root, out, splits=["train"], options=_opts())
    assert rep.shards[0].skipped
    listed = {line.split("\t")[0] for line in report.read_text().splitlines()}
    assert listed == {p.split("/", 1)[1] for p in synth_tree.bad_files}
    assert not list(out.glob("*.tsv.*"))  # (its temporary file was renamed)


def test_partial_of_a_different_command_is_not_mixed_in(synth_tree, tmp_path):
    out = tmp_path / "ILSVRC-train.lmdb"
    scan = scan_class_tree(synth_tree.root / "train")
    _quiet(write_split, scan, out, "train", _opts(seed=1))
    out.rename(out.with_name(out.name + ".partial"))  # stands in for an unfinished seed-1 run
    # the refusal says what differs, so the user can re-run the right command
    with pytest.raises(FileExistsError, match="different command: it was written with other "
                                              "options: --seed 1 then, 2 now"):
        _quiet(write_split, scan, out, "train", _opts(seed=2))
    # the re-encode quality shapes the CMYK / PNG-as-JPEG records even without max_size
    with pytest.raises(FileExistsError, match="different command: .*--quality 95 then, 40 now"):
        _quiet(write_split, scan, out, "train", _opts(seed=1, quality=40))
    if __import__("shutil").which("jpegtran"):  # (without it: the jpegtran error comes first)
        with pytest.raises(FileExistsError, match="--restart-markers off then, on now"):
            _quiet(write_split, scan, out, "train", _opts(seed=1, restart_markers=True))
    fewer = dataclasses.replace(scan, paths=scan.paths[1:], labels=scan.labels[1:])
    with pytest.raises(FileExistsError, match="the source images or their labels differ: "
                                              "files were added, removed or renamed"):
        _quiet(write_split, fewer, out, "train", _opts(seed=1))
    _quiet(write_split, scan, out, "train", _opts(seed=1))  # the same command finishes it
    with pytest.raises(FileExistsError, match=r"not written by this command \(it was written "
                                              r"with other options: --quality 95 then, 40 now\)"):
        _quiet(write_split, scan, out, "train", _opts(seed=1, quality=40))


def test_an_unfinished_write_in_another_layout_is_refused_and_removed_when_told(synth_tree,
                                                                                  tmp_path):
    """An interrupted one-file write, then a run with --shards 2: the .partial (up to the
    split's size) was ignored and stayed on disk for good."""
    scan = scan_class_tree(synth_tree.root / "val")
    out = tmp_path / "ILSVRC-val.lmdb"
    _quiet(write_split, scan, out, "val", _opts())
    partial = out.with_name(out.name + ".partial")
    out.rename(partial)  # stands in for an interrupted one-file write
    with pytest.raises(FileExistsError, match=r"ILSVRC-val\.lmdb\.partial is an unfinished "
                                              r"write of split 'val' in another layout"):
        _quiet(write_split, scan, out, "val", _opts(shards=2))
    _quiet(write_split, scan, out, "val", _opts(shards=2, overwrite=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ILSVRC-val-00000-of-00002.lmdb", "ILSVRC-val-00001-of-00002.lmdb"]
    # and the other way round: an unfinished shard, then one file
    shard = shard_path(out, 1, 2)
    shard.rename(shard.with_name(shard.name + ".partial"))
    with pytest.raises(FileExistsError, match="another layout"):
        _quiet(write_split, scan, out, "val", _opts(overwrite=False))
    _quiet(write_split, scan, out, "val", _opts(overwrite=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ILSVRC-val.lmdb"]


def test_resume_says_what_it_reads_and_a_dead_worker_says_how_to_go_on(synth_tree, tmp_path,
                                                                         capsys, monkeypatch):
    from seqloader.errors import WorkerDiedError
    from seqloader.write import writer

    scan = scan_class_tree(synth_tree.root / "val")
    out = tmp_path / "ILSVRC-val.lmdb"
    _quiet(write_split, scan, out, "val", _opts())
    n = open_database(out).num_records
    out.rename(out.with_name(out.name + ".partial"))  # as if interrupted at its very end
    capsys.readouterr()
    _quiet(write_split, scan, out, "val", _opts(progress=True))
    assert f"ILSVRC-val.lmdb.partial: resuming after {n:,} records (" in \
        capsys.readouterr().err

    def broken(self, start, stop):
        raise WorkerDiedError("seqloader map worker 1 (pid 1) was killed by SIGKILL",
                              worker=1, pid=1, exitcode=-9)

    monkeypatch.setattr(writer.ShardWriter, "_run", broken)
    with pytest.raises(WorkerDiedError, match=r"a decode worker process died \(killed by the "
                                           r"out-of-memory killer .*re-run the same command"):
        _quiet(write_split, scan, tmp_path / "other" / "ILSVRC-val.lmdb", "val", _opts())


def test_resume_refuses_committed_records_that_do_not_match_the_checksum(synth_tree, tmp_path):
    """A resumed shard recomputes the digests of what was committed (NOTE [ resumed
    digests ]) and chains them: a record damaged since (here: one byte of its image)
    is refused, not completed with a wrong table and checksum."""
    from seqloader.format.meta import meta_extents

    scan = scan_class_tree(synth_tree.root / "val")
    out = tmp_path / "ILSVRC-val.lmdb"
    _quiet(write_split, scan, out, "val", _opts())
    meta = open_database(out).metas[0]
    off, n = meta_extents(meta, out.stat().st_size, where=str(out))[2].tolist()
    partial = out.with_name(out.name + ".partial")
    out.rename(partial)  # as if interrupted at its very end
    with open(partial, "r+b") as f:
        f.seek(off + n // 2)
        byte = f.read(1)
        f.seek(off + n // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(FormatError, match=r"ILSVRC-val.lmdb.partial: the records .* do not "
                                          r"match its checksum.*--overwrite"):
        _quiet(write_split, scan, out, "val", _opts())
    _quiet(write_split, scan, out, "val", _opts(overwrite=True))
    assert open_database(out).metas[0].digests == meta.digests


def test_interrupt_hint_does_not_say_resume_with_overwrite(synth_tree, tmp_path, capsys,
                                                          monkeypatch):
    pre = sys.modules["seqloader.write.preprocess"]  # (the module; the package exports the function)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pre, "write_split", interrupted)
    for extra, hint in (([], "re-run the same command to resume"),
                        (["--overwrite"], "re-run the same command to start again, or "
                                          "without --overwrite to resume")):
        assert cli(["preprocess", str(synth_tree.root), str(tmp_path), "--no-progress",
                    *extra]) == 130
        assert f"interrupted; {hint}" in capsys.readouterr().err


def test_info_and_verify_cli(lmdb_dir, tmp_path, capsys):
    assert cli(["info", str(lmdb_dir), "--split", "train", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["complete"] and info["num_records"] > 0 and info["format_version"] == PLAIN_VERSION
    assert info["checksum_algorithm"] == "sha256"
    assert {"classes", "image_bytes", "checksums", "split"} <= set(info)
    assert info["record_extents"] is True and info["record_digests"] is True
    assert cli(["verify", str(lmdb_dir / "ILSVRC-val.lmdb"), "--no-progress"]) == 0
    # damage one record: verify must name it and fail
    import shutil
    bad = tmp_path / "bad.lmdb"
    shutil.copy(lmdb_dir / "ILSVRC-val.lmdb", bad)
    env = lmdb.open(str(bad), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        import msgpack
        rec = msgpack.unpackb(txn.get(encode_key(2)))
        rec["image"] = rec["image"][:100] + b"\x00" * 100
        txn.put(encode_key(2), msgpack.packb(rec, use_bin_type=True))
    env.close()
    capsys.readouterr()
    assert cli(["verify", str(bad), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "bad record 2" in out and "checksum" in out
    assert "extents of 1 records (first: record 2) do not match" in out  # it moved


def test_val_labels_flat_folder(synth_tree, tmp_path):
    import shutil
    root = tmp_path / "imnet"
    shutil.copytree(synth_tree.root / "train", root / "train")
    (root / "val").mkdir()
    lines = []
    for i, (rel, lab) in enumerate(zip(*(lambda s: (s.paths, s.labels))(
            scan_class_tree(synth_tree.root / "val")))):
        shutil.copy(synth_tree.root / "val" / rel, root / "val" / f"v_{i:04d}.JPEG")
        lines.append(f"v_{i:04d}.JPEG {synth_tree.classes[lab]}")
    (tmp_path / "labels.txt").write_text("\n".join(lines))
    code = cli(["preprocess", str(root), str(tmp_path / "out"), "--splits", "val",
                "--val-labels", str(tmp_path / "labels.txt"), "--no-progress"])
    assert code == 0
    recs = [r for _, r in read_records(tmp_path / "out/ILSVRC-val.lmdb")]
    assert [r.label for r in recs] == scan_class_tree(synth_tree.root / "val").labels.tolist()
    assert open_database(tmp_path / "out", "val").classes == synth_tree.classes


def test_extents_of_values_small_enough_to_live_in_btree_leaves(tmp_path):
    """Tiny images (< half a page) live inside LMDB leaves, which later commits copy
    elsewhere: their extents must be the final ones (larger values never move)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    for c in range(2):
        d = tmp_path / "src" / "train" / f"c{c}"
        d.mkdir(parents=True)
        for i in range(40):
            side = 8 if i % 2 else 120  # ~0.6 KB (in a leaf) and ~5 KB (overflow pages)
            img = rng.integers(0, 256, (side, side, 3), np.uint8)
            (d / f"{i}.jpg").write_bytes(cv2.imencode(".jpg", img)[1].tobytes())
    _quiet(preprocess, tmp_path / "src", tmp_path / "out", splits=["train"],
           options=_opts(commit_bytes=3000))
    path = tmp_path / "out" / "ILSVRC-train.lmdb"
    sizes = [len(v) for k, v in raw_items(path) if k != META_KEY]
    assert min(sizes) < 1000 and max(sizes) > 4096
    assert_extents_match(path)


needs_jpegtran = pytest.mark.needs("jpegtran")


@needs_jpegtran
def test_restart_markers_are_lossless_and_on_every_row(synth_tree, lmdb_dir, tmp_path):
    """--restart-markers: the same records in the same order, every JPEG with a restart
    marker at each MCU row, and every image decoding to exactly the same pixels."""
    from seqloader.format.jpeg import jpeg_frame, restart_grid
    out = tmp_path / "rst"
    _quiet(preprocess, synth_tree.root, out, splits=["train"],
           options=_opts(restart_markers=True))
    plain = read_records(lmdb_dir / "ILSVRC-train.lmdb")
    marked = read_records(out / "ILSVRC-train.lmdb")
    assert [(i, r.path, r.label) for i, r in plain] == [(i, r.path, r.label) for i, r in marked]
    kinds = set()
    for (_, a), (_, b) in zip(plain, marked):
        assert restart_grid(b.image), b.path
        assert jpeg_frame(b.image).marker == 0xC0  # progressive sources become baseline
        if a.reencoded is None:  # stored as it was: transcoded losslessly
            assert b.reencoded == "restart" and b.image != a.image
            assert (decode_bgr(b.image) == decode_bgr(a.image)).all(), b.path
        else:  # re-encoded anyway (CMYK, PNG): written with the markers
            assert b.reencoded == a.reencoded
        kinds.add(b.reencoded)
    assert {"restart", "png"} <= kinds
    from seqloader.format.jpeg import jpeg_scan
    assert all(jpeg_scan(r.image, jpeg_frame(r.image)).index != (0, 0) for _, r in marked)
    meta = open_database(out, "train").metas[0]
    assert meta.writer["restart_markers"] is True and meta.writer["restart_index"] is True
    from seqloader.tools.dbtools.info import describe  # (what `seqloader info` says)
    assert describe(out, "train")["restart_markers"] == "index"
    assert describe(lmdb_dir, "train")["restart_markers"] is None


def test_restart_markers_without_jpegtran_is_a_clear_error(monkeypatch, synth_tree, tmp_path,
                                                          capsys):
    import seqloader.write.options
    monkeypatch.setattr(seqloader.write.options.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="jpegtran on PATH .*apt install libjpeg-turbo-progs"):
        _opts(restart_markers=True)
    assert cli(["preprocess", str(synth_tree.root), str(tmp_path / "o"), "--restart-markers",
                "--no-progress"]) == 2
    assert "libjpeg-turbo-progs" in capsys.readouterr().err
    assert not (tmp_path / "o" / "ILSVRC-train.lmdb").exists()


def test_written_records_leave_the_page_cache(tmp_path):
    """NOTE [ drop-behind ]: a written database's record pages are not left in the
    page cache (it would flood it on a 140 GB split), and the file still reads and
    verifies.  (Mutation: without ``_drop_behind`` nearly every page stays.)"""
    from seqloader.tools.synth import make_synthetic_imagenet
    from seqloader.tools.dbtools.verify import verify_database

    skip_unless_pages_can_be_dropped(tmp_path)
    tree = _quiet(make_synthetic_imagenet, tmp_path / "src", classes=3, per_class=20,
                  val_per_class=0, seed=3, odd_fraction=0, bad=0, size="imagenet",
                  progress=False)
    scan = scan_class_tree(tree.root / "train")
    out = tmp_path / "ILSVRC-train.lmdb"
    # three commits: each one's records are dropped once it is synced
    _quiet(write_split, scan, out, "train", _opts(commit_bytes=1 << 21))
    assert out.stat().st_size > 2 << 20
    assert resident_fraction(out) < 0.2
    assert verify_database(out, progress=False).ok
    assert [r.label for _, r in read_records(out)] == [
        int(scan.labels[i]) for i in write_order(len(scan), seed=0, shuffle=True)]


def test_verify_names_truncated_images_and_bad_labels_in_processes_and_threads(lmdb_dir, tmp_path):
    """`seqloader verify` runs the writer's checks on every record (a truncated JPEG
    decodes with a mere warning; the EOI check catches it), in forked processes that
    read the records themselves or, with one worker, in this process: same findings."""
    import shutil

    import msgpack

    from seqloader.tools.dbtools.verify import verify_database

    bad = tmp_path / "bad.lmdb"
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", bad)
    env = lmdb.open(str(bad), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        rec = msgpack.unpackb(txn.get(encode_key(3)))
        rec["image"] = rec["image"][:len(rec["image"]) * 3 // 5]
        txn.put(encode_key(3), msgpack.packb(rec, use_bin_type=True))
        rec = msgpack.unpackb(txn.get(encode_key(5)))
        rec["label"] = 99
        txn.put(encode_key(5), msgpack.packb(rec, use_bin_type=True))
    env.close()
    found = []
    for workers in (3, 1):
        res = verify_database(bad, workers=workers, progress=False)
        assert [i for i, _ in res.bad] == [3, 5], res.bad
        assert "truncated JPEG" in res.bad[0][1] and "label 99 outside [0, 4)" in res.bad[1][1]
        assert any("checksum" in p for p in res.problems)
        found.append(res.bad)
    assert found[0] == found[1]
    assert verify_database(lmdb_dir / "ILSVRC-train.lmdb", workers=3, progress=False).ok


def test_verify_compares_the_metadata_labels_with_the_records(lmdb_dir, tmp_path):
    """The metadata's copy of the labels (read by `info` and the shuffle-quality metrics)
    is outside the records' checksum: a damaged one passed `seqloader verify`."""
    import shutil

    import numpy as np

    from seqloader.format.meta import pack_meta, unpack_meta
    from seqloader.tools.dbtools.verify import verify_database

    bad = tmp_path / "bad.lmdb"
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", bad)
    env = lmdb.open(str(bad), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        meta = unpack_meta(txn.get(META_KEY), where=str(bad))
        labels = np.frombuffer(meta.labels, "<i4").copy()
        labels[4] = (labels[4] + 1) % len(meta.classes)
        meta.labels = labels.tobytes()
        txn.put(META_KEY, pack_meta(meta))
    env.close()
    for workers in (3, 1):
        res = verify_database(bad, workers=workers, progress=False)
        assert not res.bad and len(res.problems) == 1, res.problems
        assert "metadata's labels of 1 records (first: record 4) differ" in res.problems[0]


def test_digest_table_round_trip_and_verify_checks_it(lmdb_dir, tmp_path):
    """A local write stores each record's digest (NOTE [ record digests ]) and `seqloader
    verify` passes; an entry or a table that does not match its records is a problem
    (the records, and with them the checksum, unchanged)."""
    import shutil

    from seqloader.format.meta import pack_meta, unpack_meta
    from seqloader.tools.dbtools.verify import verify_database

    import re

    for split in ("train", "val"):
        assert_digests_match(lmdb_dir / f"ILSVRC-{split}.lmdb")
        assert verify_database(lmdb_dir, split, progress=False).ok
    for change, want in [(lambda d: d[:32] + bytes([d[32] ^ 1]) + d[33:],
                          r"metadata's digests of 1 records \(first: record 4\) differ"),
                         (lambda d: d[:-8], "record digests (.*) do not fit its")]:
        bad = tmp_path / "bad.lmdb"
        shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", bad)
        env = lmdb.open(str(bad), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            meta = unpack_meta(txn.get(META_KEY), where=str(bad))
            meta.digests = change(meta.digests)
            txn.put(META_KEY, pack_meta(meta))
        env.close()
        for workers in (3, 1):
            res = verify_database(bad, workers=workers, progress=False)
            assert not res.bad and len(res.problems) == 1, res.problems
            assert re.search(want, res.problems[0]), res.problems


def test_a_failing_disk_is_named_with_the_fix(synth_tree, tmp_path, monkeypatch, capsys):
    """A full disk (or an unwritable folder) while writing: an error naming the file
    and what to do, not an LMDB traceback; re-running the same command resumes."""
    import seqloader.write.writer as W

    def full(self, env, pending, meta):
        raise lmdb.Error("mdb_txn_commit: Input/output error")
    monkeypatch.setattr(W.ShardWriter, "_commit", full)
    out = tmp_path / "out"
    with pytest.raises(OSError, match=r"ILSVRC-train\.lmdb\.partial: cannot write .*Input/output "
                                      r"error.*free space.*re-run the same command"):
        _quiet(preprocess, synth_tree.root, out, splits=("train",), options=_opts())
    assert cli(["preprocess", str(synth_tree.root), str(out), "--splits", "train",
                "--no-progress"]) == 2
    assert "free space" in capsys.readouterr().err
    monkeypatch.undo()
    _quiet(preprocess, synth_tree.root, out, splits=("train",), options=_opts())
    assert open_database(out / "ILSVRC-train.lmdb").num_records > 0


def test_a_run_that_waited_for_another_to_finish_takes_its_result(synth_tree, tmp_path,
                                                                   monkeypatch):
    """Two runs of one command: the second waits for the first's lock; when it gets
    it, the first has renamed the partial file to the final one.  The second must see
    the finished database (not write into the renamed file or trip over stale state)."""
    import shutil

    import seqloader.write.shardwriter as W

    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts())
    final = tmp_path / "ILSVRC-val.lmdb"
    before = raw_items(final)
    partial = tmp_path / "ILSVRC-val.lmdb.partial"
    shutil.move(final, partial)  # the first run, about to finish
    real = W.lock_or_fail

    def finish_while_waiting(lockf, path, patience=5.0):
        os.replace(partial, final)  # ... and it finishes while we wait
        real(lockf, path, patience)
    monkeypatch.setattr(W, "lock_or_fail", finish_while_waiting)
    rep = _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts())
    assert rep[0].shards[0].skipped
    assert raw_items(final) == before and not partial.exists()


def test_overwrite_waits_for_the_writers_lock_before_removing_anything(synth_tree, tmp_path,
                                                                        monkeypatch):
    """--overwrite used to delete the .partial of a run still writing it before taking
    the writer's lock (and then write a second file under the same name, unopposed): it
    must take the lock first, and fail as usual while another process holds it."""
    import fcntl

    import seqloader.write.outfiles as F
    import seqloader.write.writer as W

    real_commit, real_lock = W.ShardWriter._commit, F.lock_or_fail

    def stop_midway(self, env, pending, meta):
        real_commit(self, env, pending, meta)
        if meta.num_records >= 5 and not meta.complete:
            raise RuntimeError("stopped")
    monkeypatch.setattr(W.ShardWriter, "_commit", stop_midway)
    with pytest.raises(RuntimeError, match="stopped"):  # a run still at work, in effect
        _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"],
               options=_opts(commit_bytes=1))
    monkeypatch.setattr(W.ShardWriter, "_commit", real_commit)
    monkeypatch.setattr(F, "lock_or_fail", lambda lockf, path: real_lock(lockf, path, 0.2))
    partial = tmp_path / "ILSVRC-val.lmdb.partial"
    before, inode = raw_items(partial), partial.stat().st_ino
    with open(partial, "rb") as held:  # the other writer's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match=f"another process is writing {partial}"):
            _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"],
                   options=_opts(overwrite=True))
        assert partial.stat().st_ino == inode and raw_items(partial) == before
    _quiet(preprocess, synth_tree.root, tmp_path, splits=["val"], options=_opts(overwrite=True))
    assert not partial.exists()
    val = scan_class_tree(synth_tree.root / "val")
    assert open_database(tmp_path, "val").num_records == len(val)


def test_verify_accepts_small_records_whose_extent_is_an_identical_copy(tmp_path, capsys):
    """Records of ~2 KB or less share the first leaf page with the metadata; its last
    commit copies that page, so their extents point at the (never rewritten) old copy.
    verify compares the bytes there, not only the address: a fresh database passes."""
    import cv2
    import numpy as np

    d = tmp_path / "src" / "train" / "c0"
    d.mkdir(parents=True)
    for i in range(5):
        img = np.random.default_rng(i).integers(0, 256, (64, 64, 3), np.uint8)
        img = cv2.GaussianBlur(img, (9, 9), 3)  # ~1.7 KB as a JPEG
        (d / f"{i}.JPEG").write_bytes(cv2.imencode(".jpg", img)[1].tobytes())
    _quiet(preprocess, tmp_path / "src", tmp_path / "out", options=_opts())
    db = tmp_path / "out" / "ILSVRC-train.lmdb"
    assert cli(["verify", str(db), "--no-progress"]) == 0, capsys.readouterr().out
    assert [r.image for _, r in read_records(db)] == [
        r.image for r in _reader_records(db)]


def _reader_records(path):
    """Records as the Loader's reader returns them (through the metadata's extents)."""
    from seqloader.read.database import open_database
    from seqloader.format.records import unpack_record
    from seqloader.read.reader import RangeReader

    db = open_database(path)
    reader = RangeReader(db)
    try:
        return [unpack_record(bytes(v)) for _, v in reader.read([(0, db.num_records)])]
    finally:
        reader.close()


def test_bad_output_paths_and_shard_ids_are_named(synth_tree, tmp_path):
    """An output path that is a file, and a shard id given twice (it was written and
    reported twice), are errors naming them."""
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match=r"output folder .*/f is a file"):
        preprocess(synth_tree.root, tmp_path / "f", options=_opts())
    with pytest.raises(ValueError, match=r"shard ids \[1\] are listed more than once"):
        _opts(shards=2, shard_ids=[1, 1])
