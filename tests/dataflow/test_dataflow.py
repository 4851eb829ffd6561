import os

import numpy as np
import pytest
import torch  # noqa: F401 -- loaded before the map workers fork, as in a training script

from conftest import read_records
from seqloader import (BatchData, LMDBData, LocallyShuffleData, MapData, MapDataComponent,
                       MultiProcessMapData, WorkerDiedError, WorkerError)


def _label_plus_one(dp):
    return [dp[0], dp[1] + 1]


def _fail_on_three(dp):
    if dp[1] == 3:
        raise KeyError("three")
    return dp


def test_lmdbdata_reads_every_record_once_per_epoch(lmdb_dir):
    recs = read_records(lmdb_dir / "ILSVRC-train.lmdb")
    df = LMDBData(lmdb_dir, "train", shuffle=True, chunk_size=7, seed=1)
    df.reset_state()
    assert len(df) == len(recs)
    e0 = [bytes(img) for img, _ in df]
    e1 = [bytes(img) for img, _ in df]
    want = sorted(r.image for _, r in recs)
    assert sorted(e0) == sorted(e1) == want and e0 != e1
    plain = LMDBData(lmdb_dir / "ILSVRC-train.lmdb")
    plain.reset_state()
    assert [label for _, label in plain] == [r.label for _, r in recs]


def test_lmdbdata_ranks_are_disjoint(lmdb_dir):
    parts = []
    for r in range(3):
        df = LMDBData(lmdb_dir, "train", rank=r, world_size=3, chunk_size=4, shuffle=True)
        df.reset_state()
        parts.append([bytes(i) for i, _ in df])
        assert len(parts[-1]) == len(df)
    flat = [x for p in parts for x in p]
    assert len(flat) == len(set(flat)) == len(read_records(lmdb_dir / "ILSVRC-train.lmdb"))


def test_lmdbdata_needs_reset_state(lmdb_dir):
    with pytest.raises(RuntimeError, match="reset_state"):
        next(iter(LMDBData(lmdb_dir, "train")))


def test_composed_pipeline_with_exact_lengths(lmdb_dir):
    n = len(read_records(lmdb_dir / "ILSVRC-train.lmdb"))
    df = LMDBData(lmdb_dir, "train")
    df = LocallyShuffleData(df, 10, seed=3)
    df = MapDataComponent(df, len, 0)
    df = MapData(df, _label_plus_one)
    df = BatchData(df, 8, remainder=True)
    df.reset_state()
    batches = list(df)
    assert len(batches) == len(df) == -(-n // 8)
    sizes, labels = batches[0]
    assert isinstance(sizes, np.ndarray) and sizes.shape == (8,) and labels.min() >= 1
    no_rem = BatchData(LMDBData(lmdb_dir, "train"), 8)
    no_rem.reset_state()
    assert len(list(no_rem)) == len(no_rem) == n // 8


def test_a_pass_ended_by_a_new_one_raises_instead_of_looking_finished(lmdb_dir):
    """Stages are not reentrant; a consumer that starts a second pass of a pipeline
    while holding the first gets an error from the first, not a silently short epoch."""
    df = BatchData(LocallyShuffleData(LMDBData(lmdb_dir, "train"), 10, seed=3), 4)
    df.reset_state()
    old = iter(df)
    next(old)
    assert len(list(df)) == len(df)  # the new pass is whole
    with pytest.raises(RuntimeError, match="ended by a new iter"):
        next(old)
    df.close()


def test_multiprocess_map_keeps_order_and_reports_errors(lmdb_dir):
    base = LMDBData(lmdb_dir, "train")
    df = MultiProcessMapData(base, 2, _label_plus_one)
    df.reset_state()
    plain = LMDBData(lmdb_dir, "train")
    plain.reset_state()
    assert [l for _, l in df] == [l + 1 for _, l in plain]
    df.close()
    bad = MultiProcessMapData(LMDBData(lmdb_dir, "train"), 2, _fail_on_three)
    bad.reset_state()
    with pytest.raises(WorkerError, match="failed on datapoint") as ei:
        list(bad)
    assert "three" in str(ei.value.__cause__)
    bad.close()


def test_mapdata_refuses_none():
    from seqloader.dataflow.stages import DataFlow

    class Items(DataFlow):
        def __iter__(self):
            return iter([1, 2])

        def __len__(self):
            return 2

    with pytest.raises(ValueError, match="does not filter"):
        list(MapData(Items(), lambda x: None))


class _Unrebuildable(Exception):
    def __init__(self, a, b):  # pickles, but cannot be rebuilt from its args alone
        super().__init__(f"{a}/{b}")


def _raise_unrebuildable(dp):
    raise _Unrebuildable("x", dp[1])


def _die_on_three(dp):
    if dp[1] == 3:
        os._exit(3)
    return dp[1]


def test_multiprocess_map_errors_name_the_datapoint_and_a_broken_pool_restarts(lmdb_dir):
    """An exception the parent cannot rebuild still arrives as the function's error (not
    as a 'dead worker'); a worker that really dies is named as such, and reset_state()
    starts a new pool."""
    df = MultiProcessMapData(LMDBData(lmdb_dir, "val"), 2, _raise_unrebuildable)
    df.reset_state()
    with pytest.raises(WorkerError, match=r"failed on datapoint 0: .*_Unrebuildable: x/"):
        list(df)
    df.close()
    df = MultiProcessMapData(LMDBData(lmdb_dir, "val"), 2, _die_on_three)
    df.reset_state()
    with pytest.raises(WorkerDiedError, match=r"worker \d \(pid \d+\) exited with code 3"):
        list(df)
    df.fn = _label_plus_one
    df.reset_state()  # the broken pool is replaced
    assert len(list(df)) == len(df)
    df.close()


def test_close_releases_descriptors_and_threads(lmdb_dir):
    """Each LMDBData holds descriptors and a readahead thread once reset: close() (down a
    pipeline of stages) or dropping it returns them."""
    import gc
    import threading

    def fds():
        return len(os.listdir("/proc/self/fd"))

    before, threads = fds(), threading.active_count()
    for i in range(6):
        df = BatchData(LMDBData(lmdb_dir, "train"), 4)
        df.reset_state()
        next(iter(df))
        if i % 2:
            df.close()
        del df
        gc.collect()
    assert fds() <= before and threading.active_count() <= threads


@pytest.mark.parametrize("kw", [dict(rank=2, world_size=2), dict(rank=-1, world_size=2),
                                dict(chunk_size=0), dict(world_size=0)])
def test_lmdbdata_arguments_are_checked(lmdb_dir, kw):
    with pytest.raises(ValueError, match="rank|chunk_size|world_size"):
        LMDBData(lmdb_dir, "train", **kw)


def _draws(dp):
    """A 'random augmentation' drawing from every global generator a transform may use."""
    import random

    import torch

    import seqloader.transforms as T
    return (float(T.get_default_rng().random()), random.random(), float(np.random.rand()),
            float(torch.rand(())))


def test_multiprocess_map_seeds_each_datapoint(lmdb_dir):
    """Forked workers inherited one generator state and repeated each other's draws;
    each call is seeded from (seed, epoch, index): different everywhere, the same for
    any number of workers, new each epoch."""
    def run(num_proc, seed=0, epochs=1):
        df = MultiProcessMapData(LMDBData(lmdb_dir, "train"), num_proc, _draws, seed=seed)
        df.reset_state()
        out = [list(df) for _ in range(epochs)]
        df.close()
        return out
    e0, e1 = run(2, epochs=2)
    assert len(set(e0)) == len(e0) and all(len(set(d)) == 4 for d in e0)
    assert e0 == run(1)[0] and not set(e0) & set(e1)
    assert not set(run(2, seed=1)[0]) & set(e0)


def test_batch_and_shuffle_sizes_must_be_integers_and_shapes_agree(lmdb_dir):
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 2.5"):
        BatchData(LMDBData(lmdb_dir, "train"), 2.5)
    with pytest.raises(ValueError, match="buffer_size must be an integer >= 1, got 2.5"):
        LocallyShuffleData(LMDBData(lmdb_dir, "train"), 2.5)
    from seqloader.transforms import decode_rgb
    df = BatchData(MapDataComponent(LMDBData(lmdb_dir, "train"), decode_rgb, 0), 4)
    df.reset_state()
    with pytest.raises(ValueError, match=r"component 0 of the datapoints has shapes .*fixed-size crop"):
        list(df)


def test_multiprocess_map_workers_die_with_the_parent(lmdb_dir, tmp_path):
    """A killed parent left its map workers blocked forever (reparented to init)."""
    import signal
    import subprocess
    import sys
    import time
    code = (f"import os, time\nfrom seqloader import LMDBData, MultiProcessMapData\n"
            f"df = MultiProcessMapData(LMDBData({str(lmdb_dir)!r}, 'train'), 2, len)\n"
            "df.reset_state()\n"
            "print(*df._pm.group.pids, flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in p.stdout.readline().split()]
    assert len(pids) == 2
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"
