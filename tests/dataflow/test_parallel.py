"""Worker lifecycle with real processes: errors, deaths, breaks, leaks, start methods."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import seqloader.transforms as T
from seqloader import Loader
from seqloader.errors import WorkerDiedError, WorkerError, RecordError

SMALL = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])

REPO = Path(__file__).resolve().parents[2]


def _shm():
    return set(os.listdir("/dev/shm"))


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pids, seconds=10):
    deadline = time.time() + seconds
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_raw_eval_yields_every_record_once_in_file_order(lmdb_dir):
    from conftest import read_records
    recs = read_records(lmdb_dir / "ILSVRC-train.lmdb")
    loader = Loader(lmdb_dir, "train", None, batch_size=5, shuffle=False, num_workers=2)
    batches = [raw for raw, _ in loader]
    loader.close()
    # bytes, not views of the reader's map: they outlive the loader and pickle
    assert {type(b) for raw in batches for b in raw} == {bytes}
    assert [b for raw in batches for b in raw] == [r.image for _, r in recs]
    assert len(loader) == -(-len(recs) // 5)


def _bad_label(label):
    if label == 2:
        raise ValueError("label two is cursed")
    return label


def test_exception_in_worker_reaches_caller_with_traceback_and_record(lmdb_dir):
    loader = Loader(lmdb_dir, "train", SMALL, batch_size=4, num_workers=2,
                    target_transform=_bad_label)
    with pytest.raises(WorkerError) as ei:
        for _ in loader:
            pass
    msg = str(ei.value)
    assert "label two is cursed" in msg and "record " in msg and "Worker traceback" in msg
    assert "_bad_label" in msg  # the worker's own frame
    # the pool survives a record error: the next epoch runs (and fails again, same way)
    with pytest.raises(WorkerError):
        list(loader)
    loader.close()
    inline = Loader(lmdb_dir, "train", SMALL, batch_size=4, num_workers=0,
                    target_transform=_bad_label)
    with pytest.raises(RecordError, match=r"record \d+ \(.*JPEG\): ValueError: label two"):
        list(inline)


def test_killed_worker_is_reported_quickly_not_a_hang(lmdb_dir):
    loader = Loader(lmdb_dir, "train", SMALL, batch_size=2, num_workers=2, cache=4)
    it = iter(loader)
    next(it)
    pids = loader.workers.pids
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.time()
    with pytest.raises(WorkerDiedError, match=rf"worker 1 \(pid {pids[1]}\) was killed by SIGKILL"):
        for _ in it:
            pass
    assert time.time() - t0 < 5
    assert not _wait_dead(pids)
    # iterating again starts a fresh pool
    assert sum(len(y) for _, y in loader) > 0
    loader.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_break_mid_epoch_leaves_nothing_behind(lmdb_dir, method):
    fds = []
    for _ in range(2):  # the 1st round may open multiprocessing's own helpers (forkserver)
        loader = Loader(lmdb_dir, "train", SMALL, batch_size=2, num_workers=2,
                        start_method=method, shuffle=True, cache=8)
        n = len(loader)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        pids = loader.workers.pids
        names = set(loader.workers.shared_memory_names)
        assert len(names) == 4 and not names & _shm()  # unlinked as soon as workers attach
        # the next epoch after a break is complete and exact
        assert sum(1 for _ in loader) == n
        loader.close()
        assert not _wait_dead(pids)
        assert not names & _shm()
        fds.append(_fds())
    assert fds[1] <= fds[0], "file descriptors leaked"


def test_del_and_gc_stop_workers(lmdb_dir):
    loader = Loader(lmdb_dir, "train", SMALL, batch_size=2, num_workers=2)
    next(iter(loader))
    pids = loader.workers.pids
    del loader
    import gc
    gc.collect()
    assert not _wait_dead(pids)


def test_non_persistent_workers_stop_after_each_epoch(lmdb_dir):
    loader = Loader(lmdb_dir, "train", SMALL, batch_size=4, num_workers=2, persistent_workers=False)
    list(loader)
    assert loader.workers is None
    list(loader)
    loader.close()


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    # NOTE: a Python started with SIGINT ignored keeps it ignored (no KeyboardInterrupt),
    # and a non-interactive shell starts every `cmd &` so -- e.g. pytest run in the
    # background next to a CPU hog, and this child with it.  Ask for Ctrl-C semantics.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import seqloader.transforms as T
    from seqloader import Loader
    tf = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])
    loader = Loader(sys.argv[1], "train", tf, batch_size=1, num_workers=2, timeout=30)
    it = iter(loader)
    next(it)
    print(" ".join(map(str, loader.workers.pids)), flush=True)
    print(" ".join(loader.workers.shared_memory_names), flush=True)
    if sys.argv[2] == "int":
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in it:
                time.sleep(0.01)
            print("not interrupted", flush=True)
            sys.exit(4)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["kill", "int"])
def test_parent_killed_or_interrupted_leaves_no_orphans(lmdb_dir, tmp_path, how):
    err = tmp_path / "stderr"
    with open(err, "w") as f:  # a file, not a pipe: nothing blocks on a full pipe
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(lmdb_dir), how],
                                stdout=subprocess.PIPE, stderr=f, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        names = set(proc.stdout.readline().split())
        assert len(pids) == 2 and len(names) == 4, f"child stderr:\n{err.read_text()}"
        if how == "kill":
            proc.kill()
        else:
            line = proc.stdout.readline().strip()
            assert line == "interrupted", f"child printed {line!r}; its stderr:\n{err.read_text()}"
        proc.wait(30)
        assert proc.returncode == (-signal.SIGKILL if how == "kill" else 3), \
            f"child exited with {proc.returncode}; its stderr:\n{err.read_text()}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not _wait_dead(pids, 10), "orphaned workers"
    assert not names & _shm(), "leaked shared memory"


FORK_AFTER_THREADS = textwrap.dedent("""
    import sys, numpy as np, cv2
    cv2.setNumThreads(4)
    cv2.resize(np.zeros((3000, 3000, 3), np.uint8), (1500, 1500))  # wakes OpenCV's pool
    import seqloader.transforms as T
    from seqloader import Loader
    tf = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])
    loader = Loader(sys.argv[1], "train", tf, batch_size=4, num_workers=2, start_method="fork")
    print(sum(len(y) for _, y in loader), cv2.getNumThreads(), flush=True)
    loader.close()
""")


def test_fork_after_parent_used_opencv_threads_does_not_hang(lmdb_dir):
    out = subprocess.run([sys.executable, "-c", FORK_AFTER_THREADS, str(lmdb_dir)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    count, threads = out.stdout.split()
    assert int(count) > 0 and int(threads) == 4  # the parent's setting is restored


def test_draw_then_decode_changes_no_sample_and_names_the_failing_record(lmdb_dir):
    """NOTE [ draw, then decode ]: a batch's fused samples are drawn a run at a time and
    then decoded -- the same samples as one record at a time, and a record that fails
    while decoding (here the 21st of 40, in the second run) is the one named."""
    import numpy as np
    from conftest import read_records
    from seqloader.format.records import pack_record
    from seqloader.dataflow.batch import BatchSpec
    from seqloader.dataflow.cpumode import CPUMode
    from seqloader.dataflow.decode import _RUN, batch_rng, decode_batch
    recs = [r for _, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")][:40]
    assert len(recs) == 40 and _RUN < 21 < 2 * _RUN
    fused = T.compile_fused(T.Compose([T.RandomResizedCrop(24, scale=(0.05, 0.5)),
                                       T.RandomHorizontalFlip(), T.ToTensor()]))
    spec = BatchSpec(mode=CPUMode(), batch_size=40, fused=fused, sample_shape=fused.out_shape,
                     sample_dtype=str(fused.out_dtype))
    values = [pack_record(r) for r in recs]
    labels = np.empty(40, np.int64)
    samples = np.empty((40, *fused.out_shape), fused.out_dtype)
    decode_batch(spec, values, range(100, 140), labels, samples, batch_rng(0, 1, 0, 7))
    rng = batch_rng(0, 1, 0, 7)
    one = np.empty(fused.out_shape, fused.out_dtype)
    for i, r in enumerate(recs):  # one record at a time, the same generator
        fused(r.image, one, rng)
        assert np.array_equal(one, samples[i]) and labels[i] == r.label, i

    class FailsOn21st:  # prepares everything; the 21st decode fails
        def __init__(self):
            self.n = 0

        def prepare(self, data, rng):
            return fused.prepare(data, rng)

        def finish(self, prep, out):
            self.n += 1
            if self.n == 21:
                raise ValueError("cannot decode JPEG (damaged)")
            fused.finish(prep, out)

    spec.fused = FailsOn21st()
    with pytest.raises(RecordError, match=r"record 120 \(.*JPEG\): ValueError: cannot decode"):
        decode_batch(spec, values, range(100, 140), labels, samples, batch_rng(0, 1, 0, 7))
    assert spec.fused.n == 21  # and nothing after it was decoded


def _stuck_on_64px(img, rng=None):
    import numpy as np
    if img.shape[0] == 64:
        time.sleep(10 ** 6)  # a transform stuck for good (a deadlock, a hung mount, ...)
    return np.zeros(1, np.float64)


@pytest.mark.parametrize("stop", ["timeout", pytest.param("break", marks=pytest.mark.slow)])
def test_a_stuck_worker_behind_a_full_pipe_times_out_not_hangs(tmp_path, stop):
    """A batch too big for its shared buffer goes through the worker's pipe; if that
    worker is stuck, the reader thread blocks in the send.  A timeout (or a break)
    must still end promptly: the stuck worker is killed, not asked to stop through the
    full pipe."""
    import warnings

    from conftest import _noise_jpeg
    from seqloader import WriteOptions, preprocess

    d = tmp_path / "tree" / "train" / "n00000000"
    d.mkdir(parents=True)
    for i in range(12):  # in file order: record 4 gets stuck, record 6 (~2 MB) is inline
        _noise_jpeg(d / f"img_{i:02d}.JPEG", {4: 64, 6: 1400}.get(i, 48), i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(tmp_path / "tree", tmp_path / "db",
                   options=WriteOptions(progress=False, workers=1, shuffle=False))
    loader = Loader(tmp_path / "db", "train", _stuck_on_64px, batch_size=1, shuffle=False,
                    num_workers=2, timeout=2, cache=8)
    import faulthandler
    faulthandler.dump_traceback_later(120, exit=True)  # a regression hangs: fail loudly
    it = iter(loader)
    next(it)
    pids = loader.workers.pids
    t0 = time.time()
    if stop == "timeout":
        with pytest.raises(TimeoutError, match="sent nothing for 2 s"):
            for _ in it:
                pass
    else:
        for _ in range(3):
            next(it)
        time.sleep(1)  # the reader is blocked sending record 6 to the stuck worker
        del it  # a break: the epoch is cancelled
    loader.close()
    faulthandler.cancel_dump_traceback_later()
    assert time.time() - t0 < 45  # the reader gets 30 s to stop, then the worker is killed
    assert not _wait_dead(pids)


def _dies_on_flag(img, rng=None):
    import zlib

    import numpy as np
    if os.path.exists(os.environ["SEQLOADER_TEST_FLAG"]):
        os._exit(3)
    return np.full(4, zlib.crc32(np.ascontiguousarray(img).tobytes()), np.float64)


def test_batches_held_across_a_worker_death_do_not_free_the_new_pools_buffers(lmdb_dir, tmp_path,
                                                                              monkeypatch):
    """Zero-copy batches held from before a worker died must not, when collected, hand
    back buffers of the restarted pool (same slot numbers): that would let two batches
    share a buffer."""
    import gc

    flag = tmp_path / "die"
    monkeypatch.setenv("SEQLOADER_TEST_FLAG", str(flag))
    loader = Loader(lmdb_dir, "train", _dies_on_flag, batch_size=2, shuffle=False, cache=8,
                    num_workers=2, prefetch=4)
    it = iter(loader)
    old = [next(it) for _ in range(3)]  # held: zero-copy views, leased (at most 8 batches
    # are decoded ahead, and the split has 23: the flag below is sure to kill a worker)
    old_want = [x.clone() for x, _ in old]
    flag.touch()
    with pytest.raises(WorkerDiedError):
        for _ in it:
            pass
    flag.unlink()
    loader.set_epoch(0)
    held = list(loader)  # the restarted pool; every batch held
    want = [x.clone() for x, _ in held]
    # the old batches are intact: the dead pool's close left their buffers mapped
    assert all(torch.equal(x, w) for (x, _), w in zip(old, old_want))
    leased = loader.workers.leased
    del old, it
    gc.collect()  # the old batches' finalizers run
    assert loader.workers.leased == leased
    for _ in loader:  # another epoch through the pool's circulating buffers
        pass
    assert all((x == w).all() for (x, _), w in zip(held, want))
    loader.close()
