"""Direct I/O (NOTE [ direct I/O ]): the same records as the page-cache path, in the same
order, through every corner of the block stream; clear errors; fallbacks; the Loader."""
from __future__ import annotations

import dataclasses
import errno
import functools
import os
import shutil
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import seqloader.read.direct as direct
import seqloader.read.shard as shard_mod
import seqloader.transforms as T
from seqloader import Loader
from seqloader.read.database import Database, open_database
from seqloader.format.keys import META_KEY
from seqloader.errors import FormatError
from seqloader.read.reader import RangeReader

from conftest import raw_items

KB = 1 << 10


def _small_blocks(monkeypatch, block: int = 64 * KB, window: int = 192 * KB) -> None:
    """Make the Loader's/reader's direct stream use tiny blocks and a tiny ring, so a
    ~25 MB test file exercises records spanning blocks and records larger than the ring."""
    stream = direct.DirectStream
    monkeypatch.setattr(direct, "DirectStream",
                        lambda _window: stream(window, block=block, depth=2))


def _records(db: Database) -> list[bytes]:
    return [v for k, v in raw_items(db.paths[0]) if k != META_KEY]


def _read(db, ranges, io, **kw) -> tuple[list[tuple[int, bytes]], RangeReader]:
    r = RangeReader(db, io=io, fault_in=False, **kw)
    try:
        got = [(i, bytes(v)) for i, v in r.read(ranges)]
        r.last_stream = r._source  # (close() drops it)
        return got, r
    finally:
        r.close()


@pytest.mark.parametrize("block,window", [(16 << 20, 128 << 20), (64 * KB, 192 * KB),
                                          (4 * KB, 12 * KB)])
def test_direct_reads_the_same_records_in_the_same_order(big_db, monkeypatch, block, window):
    """Default blocks (the whole file in one block); blocks smaller than a record (every
    record spans several); a ring smaller than the 4 MB record (read on its own)."""
    _small_blocks(monkeypatch, block, window)
    n = big_db.num_records
    want = _records(big_db)
    ranges = [(70, n), (5, 40), (0, 5), (40, 41), (41, 70)]
    order = [i for a, b in ranges for i in range(a, b)]
    got, r = _read(big_db, ranges, "direct")
    assert r.direct
    assert got == [(i, want[i]) for i in order]
    buffered, rb = _read(big_db, ranges, "buffered")
    assert not rb.direct and buffered == got
    stream = r.last_stream
    if block == 64 * KB:  # ~170 KB records in a 3-block ring: both ways a record is taken
        assert 0 < stream.oversized < n  # some joined from 2-3 blocks, some read on their own
    elif block == 4 * KB:
        assert stream.oversized == n  # every record is larger than the 12 KB ring
    else:
        assert stream.oversized == 0


def test_direct_follows_records_into_separate_spans(big_db, monkeypatch):
    """With no gap allowed, every record is a span of its own (as if LMDB had scattered
    them over reused pages): the stream still hands each record its own bytes."""
    _small_blocks(monkeypatch)
    monkeypatch.setattr(shard_mod, "GAP", 0)
    r = RangeReader(big_db, io="direct", fault_in=False)
    try:
        spans, _ = r._open()[0].spans(0, big_db.num_records)
        assert len(spans) > big_db.num_records // 2
        got = [bytes(v) for _, v in r.read([(0, big_db.num_records)])]
    finally:
        r.close()
    assert got == _records(big_db)


def test_release_leaves_private_copies_alone(big_db, monkeypatch):
    """The Feeder releases used values (madvise DONTNEED on the map); a direct-I/O value
    is private heap memory, which that would zero -- release must skip it."""
    _small_blocks(monkeypatch)
    r = RangeReader(big_db, io="direct", fault_in=False)
    try:
        values = [v for _, v in r.read([(0, 30)])]
        r.release(values)
        assert [bytes(v) for v in values] == _records(big_db)[:30]
    finally:
        r.close()


def test_breaking_off_and_closing_leave_no_reads_or_threads(big_db, monkeypatch):
    _small_blocks(monkeypatch)
    want = _records(big_db)
    r = RangeReader(big_db, io="direct", fault_in=False)
    it = r.read([(0, big_db.num_records)])
    for _ in range(3):
        next(it)
    it.close()  # cut short: its reads are waited for or cancelled, buffers returned
    stream = r._source
    assert len(stream._free) == stream.nbuf
    assert [bytes(v) for _, v in r.read([(10, 20)])] == want[10:20]  # a new pass is clean
    r.close()
    deadline = time.monotonic() + 10  # idle threads leave as soon as they see the shutdown
    while [t for t in threading.enumerate() if t.name.startswith("seqloader-direct")]:
        assert time.monotonic() < deadline, "direct-I/O threads outlived close()"
        time.sleep(0.01)


def test_a_file_truncated_while_read_is_a_clear_error(big_db, tmp_path, monkeypatch):
    _small_blocks(monkeypatch)
    path = tmp_path / "ILSVRC-train.lmdb"
    shutil.copy(big_db.paths[0], path)
    db = open_database(path)
    r = RangeReader(db, io="direct", fault_in=False)
    it = r.read([(0, db.num_records)])
    next(it)
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(FormatError, match=r"ILSVRC-train.lmdb: ends at byte \d+.*truncated.*verify"):
        for _ in it:
            pass
    r.close()


def test_a_failed_read_names_the_file_and_offset(big_db, monkeypatch):
    _small_blocks(monkeypatch)
    real = direct._read_block

    def failing(fd, buf, offset):
        if offset >= 512 * KB:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, buf, offset)

    monkeypatch.setattr(direct, "_read_block", failing)
    r = RangeReader(big_db, io="direct", fault_in=False)
    with pytest.raises(OSError, match=r"ILSVRC-train.lmdb: reading \d+ bytes at offset \d+ "
                                      r"failed: Input/output error; check the disk") as e:
        list(r.read([(0, big_db.num_records)]))
    assert e.value.errno == errno.EIO
    r.close()


def test_loader_rejects_an_unknown_io_mode(big_db):
    with pytest.raises(ValueError, match="io must be one of .*got 'odirect'"):
        Loader(big_db.paths[0], "train", io="odirect")


def test_older_files_and_other_file_systems_fall_back_to_the_page_cache(big_db, monkeypatch):
    want = _records(big_db)
    old = Database(big_db.paths, tuple(dataclasses.replace(m, extents=b"") for m in big_db.metas))
    with pytest.warns(UserWarning, match="has no record extents.*page cache instead"):
        got, r = _read(old, [(0, 20)], "direct")
    assert not r.direct and [v for _, v in got] == want[:20]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto falls back silently
        got, r = _read(old, [(0, 20)], "auto")
    # a file system that refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE mounts):
    # open(O_DIRECT) fails with EINVAL there
    real_open = os.open

    def no_direct(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(direct.os, "open", no_direct)
    assert direct.open_direct(str(big_db.paths[0])) is None
    with pytest.warns(UserWarning, match="ILSVRC-train.lmdb does not support O_DIRECT"):
        got, r = _read(big_db, [(0, 20)], "direct")
    assert not r.direct and [v for _, v in got] == want[:20]


def test_loader_batches_are_identical_with_direct_io(big_db, monkeypatch):
    """The real Loader with 2 worker processes: direct and page-cache reads give the same
    batches, epoch after epoch (the shuffle depends on positions, not on how bytes came)."""
    _small_blocks(monkeypatch)
    tf = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    out = {}
    for io in ("buffered", "direct"):
        with Loader(big_db.paths[0], "train", tf, batch_size=16, shuffle=True, num_workers=2,
                    cache=40, seed=3, io=io) as ld:
            out[io] = [[(x.clone(), y.clone()) for x, y in ld] for _ in range(2)]
            assert ld.pipeline.source.reader.direct == (io == "direct")
    assert len(out["direct"][0]) == len(out["buffered"][0]) > 0
    for ea, eb in zip(out["buffered"], out["direct"]):
        for (xa, ya), (xb, yb) in zip(ea, eb):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(out["direct"][0][0][1], out["direct"][1][0][1])  # new epoch, new order


def test_raw_loader_with_direct_io_in_file_order(big_db, monkeypatch):
    """transform=None, shuffle=False: every record once, in file order, as stored."""
    _small_blocks(monkeypatch)
    from seqloader.format.records import unpack_record

    want = [unpack_record(v) for v in _records(big_db)]
    with Loader(big_db.paths[0], "train", None, batch_size=7, num_workers=0, io="direct") as ld:
        got = [(bytes(b), int(y)) for imgs, labels in ld for b, y in zip(imgs, labels)]
    assert got == [(w.image, w.label) for w in want]
    assert np.sum([len(g[0]) for g in got]) == sum(len(w.image) for w in want)


def test_dataflow_reader_with_direct_io(big_db, monkeypatch):
    """``LMDBData(io='direct')``: the same [image, label] stream as the page-cache path."""
    _small_blocks(monkeypatch)
    from seqloader.dataflow.stages import LMDBData

    got = {}
    for io in ("buffered", "direct"):
        df = LMDBData(big_db.paths[0], shuffle=True, chunk_size=16, seed=5, io=io)
        df.reset_state()
        got[io] = [(bytes(img), label) for img, label in df]
        assert df._reader.direct == (io == "direct")
        df._reader.close()
    assert len(got["direct"]) == big_db.num_records and got["direct"] == got["buffered"]


def test_records_larger_than_the_ring_come_from_the_file_as_opened(big_db, monkeypatch,
                                                                    tmp_path):
    """A record larger than the ring is read on its own -- from the reader's open
    descriptor, not by path: a file renamed or replaced meanwhile must not change it."""
    import shutil

    from seqloader.read.database import open_database

    _small_blocks(monkeypatch, 4 * KB, 12 * KB)  # every record larger than the ring
    path = tmp_path / "ILSVRC-train.lmdb"
    shutil.copy(big_db.paths[0], path)
    db = open_database(path)
    r = RangeReader(db, io="direct", fault_in=False)
    try:
        r._open()
        if not r.direct:
            pytest.skip("no O_DIRECT on this file system")
        path.rename(tmp_path / "moved.lmdb")  # the path now names nothing
        got = [bytes(v) for _, v in r.read([(0, 8)])]
    finally:
        r.close()
    assert got == _records(big_db)[:8]
