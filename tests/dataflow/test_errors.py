"""One error contract: a failing function raises the same exported exception type,
RecordError, with num_workers 0 and 2, in the Loader, the DataFlow stages, the writer
and verify -- naming the record, its source, the original exception and its traceback."""
import os
import signal

import numpy as np
import pytest

import seqloader
from conftest import read_records
from seqloader import (BatchData, LMDBData, Loader, MapData, MultiProcessMapAndBatchData,
                       MultiProcessMapData, RecordError, WorkerDiedError, WriteOptions)
from seqloader.write.scan import scan_class_tree


def _cursed(label):
    if label == 2:
        raise ZeroDivisionError("label two is cursed")
    return label


def _zeros(img, rng=None):
    return np.zeros(2, np.float32)


def _cursed_dp(dp):
    return [dp[0], _cursed(dp[1])]


def _check(e: RecordError, nw: int, path_ok, fn_name: str) -> None:
    assert type(e) is RecordError  # the same type, whatever the worker count
    assert isinstance(e, seqloader.WorkerError) and isinstance(e, seqloader.SeqloaderError)
    assert isinstance(e, RuntimeError)  # (what `except` clauses caught before)
    assert e.exc_type == "ZeroDivisionError" and "cursed" in e.exc_message
    assert path_ok(e.path), e.path
    assert fn_name in e.worker_traceback
    assert (e.worker is None) == (nw == 0)
    if nw:  # the worker's traceback shows under the error
        assert "Worker traceback" in str(e) and fn_name in str(e.__cause__)


@pytest.fixture(scope="module")
def cursed(lmdb_dir):
    """(global index, path) of the records labelled 2, in file order."""
    return {i: r.path for i, r in read_records(lmdb_dir / "ILSVRC-val.lmdb") if r.label == 2}


@pytest.mark.parametrize("nw", [0, 2])
def test_loader(lmdb_dir, cursed, nw):
    loader = Loader(lmdb_dir, "val", _zeros,
                    batch_size=4, num_workers=nw, target_transform=_cursed)
    with pytest.raises(RecordError) as ei:
        list(loader)
    loader.close()
    e = ei.value
    assert e.index == min(cursed) and e.path == cursed[e.index]
    assert str(e).startswith(f"record {e.index} ({e.path}): ZeroDivisionError: label two")
    _check(e, nw, lambda p: p.endswith(".JPEG"), "_cursed")


@pytest.mark.parametrize("nw", [0, 2])
def test_dataflow_map_and_batch(lmdb_dir, cursed, nw):
    df = MultiProcessMapAndBatchData(BatchData(LMDBData(lmdb_dir, "val"), 4, remainder=True),
                                     nw, _zeros, target_transform=_cursed)
    df.reset_state()
    with pytest.raises(RecordError) as ei:
        list(df)
    df.close()
    assert ei.value.index == min(cursed)
    _check(ei.value, nw, lambda p: p == cursed[min(cursed)], "_cursed")


@pytest.mark.parametrize("nw", [0, 2])
def test_dataflow_map(lmdb_dir, cursed, nw):
    """MapData is MultiProcessMapData's num_workers=0."""
    src = LMDBData(lmdb_dir, "val")
    df = MapData(src, _cursed_dp) if nw == 0 else MultiProcessMapData(src, nw, _cursed_dp)
    df.reset_state()
    with pytest.raises(RecordError, match=r"_cursed_dp failed on datapoint \d+: "
                                          r"ZeroDivisionError: label two") as ei:
        list(df)
    df.close()
    assert ei.value.index == min(cursed)  # (the datapoint's position: val is in file order)
    _check(ei.value, nw, lambda p: p is None, "_cursed")


def _quiet(fn, *a, **kw):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


@pytest.mark.parametrize("nw", [0, 2])
def test_writer(synth_tree, tmp_path, monkeypatch, nw):
    """An unexpected failure of the image preparation (not a bad image: those are
    bad-files rows) -- in this process (reading only: threads) or in the decode
    check's worker processes."""
    from seqloader.write import shardwriter as shard, writer

    real = shard.prepare_image

    def prepare(data, **kw):
        if bytes(data[-64:]) in bad:
            _cursed(2)
        return real(data, **kw)

    scan = scan_class_tree(synth_tree.root / "val")
    paths = [p for p in scan.paths if str(p).startswith(scan.classes[2])]
    bad = {(scan.root / paths[0]).read_bytes()[-64:]}
    monkeypatch.setattr(shard, "prepare_image", prepare)
    with pytest.raises(RecordError) as ei:
        _quiet(writer.write_split, scan, tmp_path / "ILSVRC-val.lmdb", "val",
               WriteOptions(progress=False, workers=2, shuffle=False, verify=nw > 0))
    assert ei.value.path == str(scan.root / paths[0])
    _check(ei.value, nw, lambda p: True, "_cursed")


@pytest.mark.parametrize("nw", [0, 2])
def test_verify(lmdb_dir, cursed, monkeypatch, nw):
    from seqloader.tools.dbtools import verify

    real = verify.check_stored
    target = {bytes(r.image[-64:]) for i, r in read_records(lmdb_dir / "ILSVRC-val.lmdb")
              if i == min(cursed)}

    def check_stored(image):
        if bytes(image[-64:]) in target:
            _cursed(2)
        return real(image)

    monkeypatch.setattr(verify, "check_stored", check_stored)
    with pytest.raises(RecordError) as ei:
        verify.verify_database(lmdb_dir, "val", workers=max(1, nw), progress=False)
    assert ei.value.index == min(cursed)
    _check(ei.value, nw, lambda p: p.endswith("ILSVRC-val.lmdb"), "_cursed")


def _die(dp):
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_worker_is_the_same_error_in_every_pool(lmdb_dir):
    df = MultiProcessMapData(LMDBData(lmdb_dir, "val"), 2, _die)
    df.reset_state()
    with pytest.raises(WorkerDiedError, match="was killed by SIGKILL") as ei:
        list(df)
    df.close()
    assert ei.value.exitcode == -signal.SIGKILL and ei.value.pid and ei.value.worker is not None


def test_errors_pickle_with_their_fields():
    import pickle
    e = RecordError("record 3 (a.JPEG): ValueError: x", 3, "tb", path="a.JPEG",
                    exc_type="ValueError", exc_message="x", worker=1)
    f = pickle.loads(pickle.dumps(e))
    assert (type(f), str(f), f.index, f.path, f.exc_type, f.exc_message, f.tb, f.worker) == \
        (RecordError, str(e), 3, "a.JPEG", "ValueError", "x", "tb", 1)
    d = pickle.loads(pickle.dumps(seqloader.WorkerTimeoutError("m", worker=0, pid=5)))
    assert isinstance(d, TimeoutError) and isinstance(d, WorkerDiedError) and d.pid == 5
