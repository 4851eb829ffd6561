"""The sequential reader's memory and I/O contracts, and the batch-buffer layout."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

import seqloader.transforms as T
from seqloader import Loader
from seqloader.read.database import Database, close_env, open_database, open_env
from seqloader.format.meta import EXTENT_DTYPE
from seqloader.format.keys import META_KEY, encode_key
from seqloader.errors import FormatError
from seqloader.dataflow.batch import BatchSpec
from seqloader.dataflow.cpumode import CPUMode
from seqloader.read.reader import RangeReader

from conftest import assert_extents_match, raw_items


def _mapped_kb(path) -> int:
    """Resident kB of this process's mappings of ``path``."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:
                current = parts[5] if len(parts) > 5 else None
            elif parts[0] == "Rss:" and current == str(path):
                total += int(parts[1])
    return total


def test_walk_does_not_leave_the_file_mapped(big_db):
    path = big_db.paths[0].resolve()
    size_kb = path.stat().st_size // 1024
    assert size_kb > 20_000
    # control: a plain LMDB cursor walk maps most of the file (LMDB touches each value,
    # the kernel maps its neighbours), so the check below can fail
    env = open_env(path)
    try:
        with env.begin(buffers=True) as txn:
            cur = txn.cursor()
            cur.set_key(encode_key(0))
            n = sum(len(cur.value()) > 0 for _ in iter(cur.next, False))
            assert n > 100
            assert _mapped_kb(path) > size_kb // 2
    finally:
        close_env(env)
    reader = RangeReader(big_db, fault_in=False)
    try:
        values = [v for _, v in reader.read([(0, big_db.num_records)])]
        assert len(values) == big_db.num_records
        assert _mapped_kb(path) < 6 * 1024  # at most ~one unmapping step (4 MiB) + B-tree
        out = np.empty(max(len(v) for v in values), np.uint8)
        copies = []
        for v in values:  # copies go through pread: still nothing mapped
            reader.copy_into(v, out[:len(v)])
            copies.append(out[:len(v)].tobytes())
        assert _mapped_kb(path) < 6 * 1024
        assert copies == [v for k, v in raw_items(path) if k != b"__seqloader_meta__"]
    finally:
        reader.close()


def test_readahead_skips_blocks_already_cached(big_db):
    first = RangeReader(big_db, fault_in=False)
    try:
        for _ in first.read([(0, big_db.num_records)]):
            pass
    finally:
        first.close()
    with open(big_db.paths[0], "rb") as f:  # make sure all of it is in the page cache
        while f.read(1 << 20):
            pass
    second = RangeReader(big_db, fault_in=False)
    try:
        got = [bytes(v) for _, v in second.read([(0, big_db.num_records)])]
        pref = second._source.prefetcher
        assert pref.skipped > 0 and pref.read_bytes == 0
        assert pref.failed_key is None
    finally:
        second.close()
    want = [v for k, v in raw_items(big_db.paths[0]) if k != b"__seqloader_meta__"]
    assert got == want



def _cached_pages(path, offset: int, length: int) -> int:
    """How many pages of ``path[offset:offset + length]`` are in the page cache (the
    benchmarks' mincore probe)."""
    from seqloader.tools.bench.cache import resident_pages

    got = resident_pages(str(path), offset, offset + length)
    assert got is not None, f"mincore cannot see {path}"
    return got[0]


def test_readahead_reads_only_the_pages_not_cached(big_db):
    """A block the kernel evicted a few pages of (memory reclaim) costs those pages, not
    a whole 16 MiB re-read; the records are the same."""
    import os

    from seqloader.read.pages import LIBC, PAGE

    if LIBC is None:
        pytest.skip("no libc: mincore unavailable")
    path = big_db.paths[0]
    with open(path, "rb") as f:  # all of it in the page cache
        while f.read(1 << 20):
            pass
    size = os.path.getsize(path)
    # whole 2 MiB-aligned ranges: the page cache may hold a file read ahead in large
    # folios, and DONTNEED drops only folios wholly inside its range
    holes = [(8 << 20, 2 << 20), (16 << 20, 2 << 20)]
    assert size > 20 << 20
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages (a database written moments ago) are not dropped
        for off, n in holes:
            os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if any(_cached_pages(path, off, n) for off, n in holes):
        pytest.skip("the kernel kept the pages posix_fadvise(DONTNEED) should have dropped")
    reader = RangeReader(big_db, fault_in=False, io="buffered")
    try:
        got = [bytes(v) for _, v in reader.read([(0, big_db.num_records)])]
        pref = reader._source.prefetcher
        assert pref.failed_key is None
        # only the holes (as far as they hold records) -- not the 2-16 MiB blocks they
        # sit in (those would be 19 MiB here)
        assert 0 < pref.read_bytes <= sum(n for _, n in holes)
        assert all(_cached_pages(path, off, n) == n // PAGE for off, n in holes)
    finally:
        reader.close()
    want = [v for k, v in raw_items(path) if k != b"__seqloader_meta__"]
    assert got == want


def _spec(sample_nbytes: int, mean: float, batch_size: int = 256) -> BatchSpec:
    return BatchSpec(mode=CPUMode(), batch_size=batch_size, sample_shape=(sample_nbytes,),
                     sample_dtype="uint8", mean_record=mean)


def test_records_ride_at_the_end_of_the_samples_region():
    spec = _spec(602_112, 110_000)  # 3x224x224 float32 per sample, ImageNet-sized JPEGs
    assert spec.tail_nbytes == 1 << 20  # no separate input region
    rng = np.random.default_rng(0)
    sizes = rng.integers(20_000, 400_000, 256).tolist()
    start = spec.input_start(sizes)
    assert start is not None and start + sum(sizes) == spec.slot_nbytes
    ends = start + np.cumsum(sizes)
    for i in range(255):  # record i+1 begins after sample i ends
        assert ends[i] >= 8 * 256 + (i + 1) * 602_112
    assert spec.input_start([602_112 * 3] + [1000] * 255) is not None
    assert spec.input_start([1000] * 255 + [602_112 * 3]) is None  # a huge last record
    small = _spec(768, 110_000, batch_size=4)  # tiny outputs: the records need a tail
    assert small.tail_nbytes > 4 * 110_000
    assert small.input_start([110_000] * 4) is not None


def test_batches_that_do_not_fit_the_buffer_go_by_pipe(big_db):
    tf = T.Compose([T.RandomResizedCrop(8), T.ToTensor()])
    kw = dict(batch_size=4, shuffle=False, seed=3)
    pooled = Loader(big_db.paths[0], "train", tf, num_workers=2, **kw)
    spec = pooled.batch_spec
    sizes = [len(v) for k, v in raw_items(big_db.paths[0]) if k != b"__seqloader_meta__"]
    fits = [spec.input_start(sizes[i:i + 4]) is not None for i in range(0, len(sizes), 4)]
    assert any(fits) and not all(fits)  # both paths are exercised
    try:
        got = [(x.clone(), y) for x, y in pooled]
    finally:
        pooled.close()
    want = list(Loader(big_db.paths[0], "train", tf, num_workers=0, **kw))
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_extents_locate_records_and_both_read_paths_agree(big_db):
    """Files written now list every record's extent, and the reader then slices records
    from its own map without LMDB (NOTE [ record extents ]); files without extents
    (older writers) are walked through the B-tree: same records, same order."""
    path = big_db.paths[0]
    assert_extents_match(path)
    want = [v for k, v in raw_items(path) if k != META_KEY]
    n = big_db.num_records
    ranges = [(5, 50), (0, 5), (50, n)]
    order = list(range(5, 50)) + list(range(5)) + list(range(50, n))
    old = Database(big_db.paths, tuple(dataclasses.replace(m, extents=b"") for m in big_db.metas))
    for db, uses_lmdb in ((big_db, False), (old, True)):
        for fault_in in (True, False):
            reader = RangeReader(db, fault_in=fault_in)
            try:
                got = [(i, bytes(v)) for i, v in reader.read(ranges)]
                assert (reader._shards[0].env is not None) == uses_lmdb
                assert got == [(i, want[i]) for i in order]
                assert bytes(reader.get(7)) == want[7]
                assert reader.extents([(0, n)]).tolist() == \
                    np.frombuffer(big_db.metas[0].extents, EXTENT_DTYPE).tolist()
            finally:
                reader.close()


@pytest.mark.parametrize("damage", ["short", "beyond"])
def test_extents_that_do_not_fit_the_file_are_a_clear_error(big_db, damage):
    meta = big_db.metas[0]
    ext = np.frombuffer(meta.extents, EXTENT_DTYPE).copy()
    if damage == "short":  # e.g. metadata of another file
        ext = ext[:-1]
    else:  # e.g. a truncated copy
        ext[-1]["offset"] = big_db.paths[0].stat().st_size
    db = Database(big_db.paths, (dataclasses.replace(meta, extents=ext.tobytes()),))
    reader = RangeReader(db)
    with pytest.raises(FormatError, match=r"ILSVRC-train.lmdb.*extents do not fit.*re-copy"):
        next(reader.read([(0, 3)]))
    reader.close()


def test_spans_cover_every_record_and_skip_far_outliers(big_db):
    """LMDB now and then puts a value in reused free pages far earlier in the file: it
    gets a span of its own instead of one span over everything in between."""
    from seqloader.read.shard import Shard

    sh = Shard(str(big_db.paths[0]), big_db.metas[0], True)
    try:
        n = big_db.num_records

        def check(spans, ids):
            assert [int(i) for i in ids] == sorted(int(i) for i in ids)  # in record order
            for k in range(n):
                s, e = spans[ids[k]]
                assert s <= sh.offsets[k] and sh.offsets[k] + sh.lengths[k] <= e
                assert s % 4096 == 0 and (e % 4096 == 0 or e == sh.size)

        spans, ids = sh.spans(0, n)
        check(spans, ids)
        sh.offsets = sh.offsets.copy()
        sh.offsets[60] = 4096  # as if record 60 sat in reused pages near the file's start
        moved, moved_ids = sh.spans(0, n)
        check(moved, moved_ids)
        assert len(moved) == len(spans) + 2  # before it, itself, after it
        assert moved[moved_ids[60]] == (4096, 4096 + ((int(sh.lengths[60]) + 4095) // 4096) * 4096)
        assert sum(e - s for s, e in moved) <= sum(e - s for s, e in spans) + 2 * 4096 + \
            int(sh.lengths[60])
    finally:
        sh.close()


@pytest.mark.parametrize("io", ["buffered", "direct"])
def test_a_file_replaced_after_its_metadata_was_read_is_an_error(lmdb_dir, tmp_path, io):
    """Readers open the files by path when they start (a Loader's at every epoch without
    persistent workers): a file re-written or replaced since open_database would have
    its records elsewhere than the metadata says -- an error, not other records."""
    import shutil

    from seqloader.read.database import open_database
    from seqloader.errors import FormatError
    from seqloader.read.reader import RangeReader

    path = tmp_path / "ILSVRC-train.lmdb"
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", path)
    db = open_database(path)
    r = RangeReader(db, io=io)
    want = [bytes(v) for _, v in r.read([(0, db.num_records)])]
    r.close()
    r = RangeReader(db, io=io)  # the same file again: fine
    assert [bytes(v) for _, v in r.read([(0, db.num_records)])] == want
    r.close()
    shutil.copy(path, tmp_path / "new.lmdb")
    os.replace(tmp_path / "new.lmdb", path)  # as preprocess --overwrite does
    r = RangeReader(db, io=io)
    with pytest.raises(FormatError, match="changed since its metadata was read"):
        list(r.read([(0, 3)]))
    r.close()
    r = RangeReader(open_database(path), io=io)  # opened again: fine
    assert [bytes(v) for _, v in r.read([(0, db.num_records)])] == want
    r.close()


def test_a_file_cut_under_an_open_reader_is_named_and_a_replaced_one_kept(lmdb_dir, tmp_path):
    """Checked at each pass: a database cut in place (cp of a smaller copy over it)
    crashed the process with SIGBUS when its map was read past the new end -- a named
    error now (in a child process: a regression would be a crash).  One replaced under
    its name (preprocess --overwrite) is another file: an open loader goes on with the
    one it opened, a new loader opens the new one (it had been handed the old one)."""
    import shutil
    import subprocess
    import sys

    db = tmp_path / "db"
    db.mkdir()
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", db / "ILSVRC-train.lmdb")
    loader = Loader(db, "train", None, batch_size=4, num_workers=0)
    first = [bytes(r) for b, _ in loader for r in b]
    shutil.copy(lmdb_dir / "ILSVRC-val.lmdb", tmp_path / "other.lmdb")
    os.replace(tmp_path / "other.lmdb", db / "ILSVRC-train.lmdb")  # a new file, named so
    assert sorted(bytes(r) for b, _ in loader for r in b) == sorted(first)
    with pytest.raises(FormatError, match="holds split 'val'"):  # the new file, not the old
        Loader(db, "train", None, batch_size=4, num_workers=0)
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", db / "ILSVRC-train.lmdb")
    code = f"""
import os
from seqloader import Loader
from seqloader.errors import FormatError
path = {str(db / "ILSVRC-train.lmdb")!r}
loader = Loader(os.path.dirname(path), "train", None, batch_size=4, num_workers=0)
list(loader)
os.truncate(path, os.path.getsize(path) // 2)  # cut in place, same inode
try:
    list(loader)
except FormatError as e:
    print("named:", e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "named:" in p.stdout and "changed since its metadata was read" in p.stdout


def test_open_env_does_not_hand_out_a_replaced_files_environment(lmdb_dir, tmp_path):
    """Environments are shared per file: keyed by the name, a database re-created under
    the same name while one was open got the old (deleted) file's environment."""
    import shutil
    path = tmp_path / "ILSVRC-train.lmdb"
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", path)
    old = open_env(path)
    shutil.copy(lmdb_dir / "ILSVRC-val.lmdb", tmp_path / "new.lmdb")
    os.replace(tmp_path / "new.lmdb", path)
    new = open_env(path)
    try:
        assert new is not old
        assert open_env(path) is new  # still shared per file
        close_env(new)
    finally:
        close_env(new)
        close_env(old)


def test_lmdbdata_a_new_pass_ends_an_unfinished_one(lmdb_dir, tmp_path):
    """One pass at a time: an unfinished pass (its iterator kept) held the reader's
    buffers, and with direct I/O the next pass waited for them forever."""
    import subprocess
    import sys
    code = f"""
from seqloader import LMDBData
df = LMDBData({str(lmdb_dir)!r}, "train", io="direct", chunk_size=3, prefetch_bytes=1 << 16)
df.reset_state()
it = iter(df)
next(it)
print(sum(1 for _ in df), len(df))
try:
    next(it)
except RuntimeError as e:  # not a silent StopIteration: that would pass for a short epoch
    print("ended:", e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    counts, ended = p.stdout.split("\n", 1)
    a, b = counts.split()
    assert a == b
    assert ended.startswith("ended: this LMDBData pass was ended by a new iter()")


def test_raw_batches_are_the_stored_images_without_copies(big_db, monkeypatch):
    """``encoded`` (the Loader's raw batches): views of the file's map with extents (no
    copy), ``bytes`` from an older file (a view of LMDB's map would die with its
    transaction); the same images and labels as unpacking; pages a consumer maps by
    reading the views are unmapped at the next batch (NOTE [ raw batches ])."""
    import seqloader.read.raw as raw_mod
    from seqloader.format.records import unpack_record

    path = big_db.paths[0].resolve()
    want = [unpack_record(v) for k, v in raw_items(path) if k != META_KEY]
    ranges = [(30, 121), (0, 30)]
    order = list(range(30, 121)) + list(range(30))
    old = Database(big_db.paths, tuple(dataclasses.replace(m, extents=b"") for m in big_db.metas))
    for db, kind, layout in ((big_db, memoryview, True), (old, bytes, True), (big_db, bytes, False)):
        if not layout:  # another writer's layout: unpacked instead
            monkeypatch.setattr(raw_mod, "image_span", lambda head, n: None)
        reader = RangeReader(db, io="buffered")
        try:
            recs = list(reader.read(ranges))
            got = []
            for k in range(0, len(recs), 16):
                images, labels = reader.encoded(recs[k:k + 16])
                assert {type(x) for x in images} == {kind}
                got += [(bytes(x), y) for x, y in zip(images, labels)]  # maps their pages
            assert got == [(want[i].image, want[i].label) for i in order]
            images, _ = reader.encoded(recs)  # one batch of all, all read
            assert sum(len(bytes(x)) for x in images) > 20 << 20
            assert _mapped_kb(path) > 6 * 1024 or kind is bytes
            del images
            reader.encoded([])  # the next batch
            assert _mapped_kb(path) < 6 * 1024
        finally:
            reader.close()
