"""Loader.stats() and the diagnosis (seqloader/dataflow/stats.py, diagnosis.py), with real
workers: a slow transform is diagnosed as decoding, a slow byte source as reading, a
slow consumer as not data-bound, and the figures agree with an outside measurement."""
from __future__ import annotations

import os
import time
import warnings

import numpy as np
import pytest

import seqloader.transforms as T
from seqloader import Loader
from seqloader.dataflow.diagnosis import DataWaitWarning, Diagnose
from seqloader.dataflow.stats import STAT_KEYS, format_stats
from seqloader.read.buffered import BufferedSource


def _small(img, rng=None):  # a plain transform: a fixed 32 px crop, float32 CHW
    return np.ascontiguousarray(img[:32, :32].transpose(2, 0, 1), np.float32)


def _slow(img, rng=None):  # decoding that takes 30 ms a record (no CPU: a sleep)
    time.sleep(0.03)
    return _small(img)


def _burn(img, rng=None):  # decoding that takes 10 ms of CPU a record
    t = time.process_time()
    while time.process_time() - t < 0.01:
        pass
    return _small(img)


def _fused():
    return T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor()])


def _loader(db, transform, **kw):
    kw.setdefault("diagnose", Diagnose(share=0.10, window=4))
    return Loader(db.paths[0], "train", transform, batch_size=8, shuffle=True, num_workers=2,
                  cache=64, world_size=1, rank=0, io="buffered", **kw)


def _epoch(loader, consume_s: float = 0.0) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", DataWaitWarning)
        for _ in loader:
            if consume_s:
                time.sleep(consume_s)
    return [w for w in got if issubclass(w.category, DataWaitWarning)]


def test_a_slow_transform_is_diagnosed_as_decoding(big_db):
    with _loader(big_db, _slow) as loader:
        warned = _epoch(loader)
        found = loader.diagnosis()
        stats = loader.stats()
    assert found.stage == "decoding", found.message
    assert "2 workers at" in found.message and "raise num_workers" in found.message \
        or "every core" in found.message
    assert len(warned) == 1 and "decoding:" in str(warned[0].message)  # once per epoch
    assert stats["workers_busy"] > 0.75 and stats["wait_share"] > 0.5


def test_a_slow_byte_source_is_diagnosed_as_reading(big_db, monkeypatch):
    copy_into = BufferedSource.copy_into

    def slow_copy(self, value, out):  # a disk giving ~10 MB/s: 15 ms a record, no CPU
        time.sleep(0.015)
        copy_into(self, value, out)

    monkeypatch.setattr(BufferedSource, "copy_into", slow_copy)
    with _loader(big_db, _small) as loader:
        warned = _epoch(loader)
        found = loader.diagnosis()
        stats = loader.stats()
    assert found.stage == "reading", found.message
    assert "blocked on the disk" in found.message and "MB/s" in found.message
    assert len(warned) == 1 and "reading:" in str(warned[0].message)
    assert stats["read_blocked"] > 0.5 and stats["workers_busy"] < 0.5


def test_a_slow_consumer_is_not_data_bound(big_db):
    with _loader(big_db, _fused()) as loader:
        warned = _epoch(loader, consume_s=0.15)
        found = loader.diagnosis()
    assert warned == []
    assert found.wait_share < 0.10


@pytest.mark.slow  # (a real slow pipeline: seconds)
def test_the_warning_can_be_silenced(big_db):
    with _loader(big_db, _slow, diagnose=None) as loader:
        assert _epoch(loader) == []
        assert loader.diagnosis().stage == "decoding"  # (the diagnosis is still there)
    with pytest.raises(TypeError, match="Diagnose"):
        _loader(big_db, _slow, diagnose=0.1)
    with pytest.raises(ValueError, match="share"):
        Diagnose(share=1.5)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_stats_agree_with_an_outside_measurement(big_db):
    # no read-ahead into the next epoch: the bytes read are exactly the epoch's
    # waits of tens of ms (the workers burn CPU): the clocks' own distance is negligible
    with _loader(big_db, _burn, persistent_workers=False, diagnose=None) as loader:
        loader.pipeline.start()  # (before the clock: their start-up is not decoding)
        pids = loader.workers.pids
        cpu0 = sum(_cpu_seconds(p) for p in pids)
        waits, images, cpu = [], 0, 0.0
        t0 = time.perf_counter()
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                _, y = next(it)
            except StopIteration:  # (the epoch ends here; then the workers are stopped)
                wall = t - t0
                break
            waits.append(time.perf_counter() - t)
            cpu = sum(_cpu_seconds(p) for p in pids) - cpu0  # (they stop with the epoch)
            images += len(y)
            time.sleep(0.005)  # (a consumer that takes a little time)
        s = loader.stats()
    assert s["images"] == images and s["batches"] == len(waits)
    assert s["seconds"] == pytest.approx(wall, rel=0.10)
    assert s["images_per_s"] == pytest.approx(images / wall, rel=0.10)
    assert s["wait_s"] == pytest.approx(sum(waits), rel=0.10)
    assert s["wait_p50_ms"] == pytest.approx(1e3 * float(np.median(waits)), rel=0.10, abs=0.5)
    assert s["read_mb_per_s"] == pytest.approx(big_db.image_bytes / wall / 1e6, rel=0.10)
    if cpu > 0.5:  # (CPU times come in clock ticks: too few to compare on a fast machine)
        assert s["images_per_cpu_s"] == pytest.approx(images / cpu, rel=0.15)


def test_stats_are_a_flat_dict_of_numbers_printed_as_one_line(lmdb_dir):
    loader = Loader(lmdb_dir, "train", _fused(), batch_size=8, shuffle=True, num_workers=2,
                    world_size=1, rank=0)
    assert loader.stats() == {} and loader.diagnosis() is None  # (nothing iterated yet)
    with loader:
        it = iter(loader)
        next(it)
        s = loader.stats()
        line = format_stats(s)
        list(it)
        it = iter(loader)
        next(it)  # (epoch 1 in progress)
        last, now = loader.stats(last=True), loader.stats()
    assert all(isinstance(v, (int, float)) for v in s.values())
    assert set(s) <= set(STAT_KEYS) and s["epoch"] == 0 and s["batches"] == 1
    assert s["first_batch_s"] > 0 and 0 <= s["shuffle_fill"] <= 1
    assert "\n" not in line and "img/s" in line and "first batch" in line
    assert last["epoch"] == 0 and last["batches"] == len(loader)
    assert now["epoch"] == 1 and now["batches"] == 1
