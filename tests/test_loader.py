"""Loader semantics with real worker processes: len, coverage, drop_last, epochs, resume."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import read_records
from seqloader import Loader, open_database
from seqloader.format.files import shard_path

REPO = Path(__file__).resolve().parents[1]


def _mean_color(img, rng=None):
    """A user transform: a fixed-size array from any image (not a seqloader transform)."""
    return np.asarray(img, np.float32).mean(axis=(0, 1))


def _ids(loader):
    """Per epoch: batches as lists of record fingerprints (raw mode)."""
    return [[bytes(b[:64]) + bytes(b[-64:]) for b in raw] for raw, _ in loader]


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_len_equals_batches_yielded_and_coverage(lmdb_dir, nw, drop_last, shuffle):
    n = open_database(lmdb_dir, "train").num_records
    B = 5
    loader = Loader(lmdb_dir, "train", None, batch_size=B, shuffle=shuffle, num_workers=nw,
                    drop_last=drop_last, cache=7)
    batches = _ids(loader)
    assert len(batches) == len(loader) == (n // B if drop_last else -(-n // B))
    sizes = [len(b) for b in batches]
    assert all(s == B for s in sizes[:-1]) and (sizes[-1] == B or not drop_last)
    flat = [x for b in batches for x in b]
    assert len(set(flat)) == len(flat)
    if not drop_last:
        assert len(flat) == n
    if not shuffle:
        want = [r.image for _, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")]
        assert flat == [w[:64] + w[-64:] for w in want][:len(flat)]
    loader.close()


def test_each_for_is_a_new_epoch_and_seed_reproduces(lmdb_dir):
    a = Loader(lmdb_dir, "train", None, batch_size=4, shuffle=True, num_workers=2, seed=1, cache=8)
    e0, e1 = _ids(a), _ids(a)
    assert e0 != e1 and sorted(sum(e0, [])) == sorted(sum(e1, []))
    a.set_epoch(0)
    assert _ids(a) == e0
    b = Loader(lmdb_dir, "train", None, batch_size=4, shuffle=True, num_workers=2, seed=1, cache=8)
    assert _ids(b) == e0
    a.close(), b.close()


def test_user_transform_batches_and_labels(lmdb_dir):
    recs = read_records(lmdb_dir / "ILSVRC-val.lmdb")
    loader = Loader(lmdb_dir, "val", _mean_color, batch_size=4, num_workers=2,
                    target_transform=lambda y: y * 10)
    out = list(loader)
    images = torch.cat([x for x, _ in out])
    labels = torch.cat([y for _, y in out])
    assert images.dtype == torch.float32 and images.shape == (len(recs), 3)
    assert labels.dtype == torch.int64 and labels.tolist() == [r.label * 10 for _, r in recs]
    loader.close()


def _boom(img):
    raise ZeroDivisionError("boom in my transform")


@pytest.mark.parametrize("nw", [0, 2])
def test_a_transform_failing_on_record_0_names_it(lmdb_dir, nw):
    """The caller runs the transform on record 0 to learn the sample shape; a failure
    there is named like any other record's (it was a bare exception)."""
    from seqloader.errors import RecordError
    recs = read_records(lmdb_dir / "ILSVRC-train.lmdb")
    loader = Loader(lmdb_dir, "train", _boom, batch_size=4, num_workers=nw)
    with pytest.raises(RecordError) as ei:
        list(loader)
    assert str(ei.value).startswith(f"record 0 ({recs[0][1].path}): ZeroDivisionError: boom")


def _noisy_crop(img):
    """A plain callable drawing from the global generators, as third-party transforms do."""
    import random
    j = random.randrange(4) + int(np.random.randint(4)) + int(torch.randint(4, ()))
    return np.ascontiguousarray(img[j:j + 8, :8])


def test_num_workers_0_leaves_the_callers_global_generators_alone(lmdb_dir):
    """With num_workers=0 the transforms run in the caller, and their global generators
    are seeded per batch (for reproducible third-party transforms); the training loop's
    own draws must still follow the user's seed -- they were reset by every batch."""
    import random

    def draws():
        return (random.random(), float(np.random.rand()), float(torch.rand(())))

    kw = dict(batch_size=4, shuffle=True, seed=3)
    ref = [x.clone() for x, _ in Loader(lmdb_dir, "train", _noisy_crop, num_workers=2, **kw)]
    seen = []
    for seed in (1, 2):
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        want = draws()
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        got = [x for x, _ in Loader(lmdb_dir, "train", _noisy_crop, num_workers=0, **kw)]
        assert draws() == want  # as if the loader had not run
        assert all(torch.equal(a, b) for a, b in zip(got, ref)) and len(got) == len(ref)
        seen.append(want)
    assert seen[0] != seen[1]


def test_target_transform_must_return_an_integer(lmdb_dir):
    """Batch labels are int64: a float label was truncated silently (0.5 -> 0)."""
    from seqloader.errors import RecordError
    ok = Loader(lmdb_dir, "val", _mean_color, batch_size=4, num_workers=0,
                target_transform=lambda y: np.int16(y) + True)
    recs = read_records(lmdb_dir / "ILSVRC-val.lmdb")
    assert torch.cat([y for _, y in ok]).tolist() == [r.label + 1 for _, r in recs]
    bad = Loader(lmdb_dir, "val", _mean_color, batch_size=4, num_workers=0,
                 target_transform=lambda y: y + 0.5)
    with pytest.raises(RecordError, match=r"record 0 .*target_transform returned 0\.5 \(float\)"):
        list(bad)


@pytest.mark.parametrize("nw", [0, 2])
def test_resume_mid_epoch_continues_exactly(lmdb_dir, nw):
    kw = dict(batch_size=3, shuffle=True, num_workers=nw, seed=5, cache=9, chunk_size=4)
    ref = Loader(lmdb_dir, "train", None, **kw)
    full = [_ids(ref) for _ in range(2)]
    ref.close()
    run = Loader(lmdb_dir, "train", None, **kw)
    list(run)  # epoch 0
    it = iter(run)  # epoch 1: consume 4 batches, checkpoint
    seen = [[bytes(b[:64]) + bytes(b[-64:]) for b in next(it)[0]] for _ in range(4)]
    state = run.state_dict()
    assert (state["epoch"], state["position"]) == (1, 4)
    run.close()
    resumed = Loader(lmdb_dir, "train", None, **kw)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # the usual loop calls this; it keeps the resume position
    rest = _ids(resumed)
    assert seen + rest == full[1]
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["position"] == 0
    resumed.close()
    other_workers = Loader(lmdb_dir, "train", None, **{**kw, "num_workers": 2 - nw})
    other_workers.load_state_dict(state)  # workers only decode: the order does not change
    assert _ids(other_workers) == rest
    # another batch size or warm-up: the rest of the epoch, each record once, other batches
    for other in ({"batch_size": 4}, {"warmup": 2}):
        elastic = Loader(lmdb_dir, "train", None, **{**kw, **other})
        elastic.load_state_dict(state)
        rest = _ids(elastic)
        assert sorted(sum(seen + rest, [])) == sorted(sum(full[1], [])), other
        elastic.close()
    # the seed and the database cannot change
    with pytest.raises(ValueError, match="seed is 5, this loader's 6"):
        Loader(lmdb_dir, "train", None, **{**kw, "seed": 6}).load_state_dict(state)
    with pytest.raises(ValueError, match="fingerprint"):
        resumed.load_state_dict({**state, "fingerprint": "another database"})
    old = {k: v for k, v in state.items() if k not in ("warmup", "shard_sizes", "fingerprint")}
    resumed.load_state_dict(old)  # checkpoints from before these keys still load


def test_resume_edges(lmdb_dir):
    """A resumed iterator's len is what it yields; loaded positions are range-checked;
    set_epoch to another epoch warns that it drops the position; a checkpoint of the
    old default warm-up (one batch, before splits that fit in the buffer were read
    whole) resumes its own sequence; a database mismatch says so in words."""
    kw = dict(batch_size=3, shuffle=True, num_workers=0, seed=5, chunk_size=4)
    n = open_database(lmdb_dir, "train").num_records
    run = Loader(lmdb_dir, "train", None, cache=n, **kw)
    it = iter(run)
    for _ in range(2):
        next(it)
    state = run.state_dict()
    resumed = Loader(lmdb_dir, "train", None, cache=n, **kw)
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert len(it) == len(resumed) - 2 == sum(1 for _ in it)
    for bad in (-1, len(run) + 1, 1.5, True):
        with pytest.raises(ValueError, match=rf"position is {bad!r}, not a batch index"):
            resumed.load_state_dict({**state, "position": bad})
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(3\) discards the position loaded for "
                                         r"epoch 0 \(batch 2\)"):
        resumed.set_epoch(3)
    with pytest.raises(ValueError, match="not the one the checkpoint was written with"):
        resumed.load_state_dict({**state, "fingerprint": "another database"})
    # the checkpoint of a loader with the old default warm-up (one batch)
    want = _ids(Loader(lmdb_dir, "train", None, cache=n, warmup=3, **kw))  # epoch 0
    old = Loader(lmdb_dir, "train", None, cache=n, warmup=3, **kw)
    it = iter(old)
    next(it)
    state = old.state_dict()
    fresh = Loader(lmdb_dir, "train", None, cache=n, **kw)  # default warm-up: n now
    fresh.load_state_dict(state)
    assert _ids(fresh) == want[1:]  # the rest of epoch 0, in the old warm-up's order
    assert fresh.state_dict()["warmup"] == 3  # and it stays the checkpoint's
    other = Loader(lmdb_dir, "train", None, cache=n, warmup=5, **kw)  # an explicit one:
    other.load_state_dict(state)  # the rest of the epoch on its own warm-up
    assert sorted(sum(_ids(other), [])) == sorted(sum(want[1:], []))
    # checkpoints from before the "warmup" key all used the old default (one batch)
    older = Loader(lmdb_dir, "train", None, cache=n, **kw)
    older.load_state_dict({k: v for k, v in state.items() if k != "warmup"})
    assert _ids(older) == want[1:]
    # adopting stops the epoch in progress (its next() raises: not a short epoch), and a
    # later checkpoint of the new default is adopted back
    busy = Loader(lmdb_dir, "train", None, cache=n, **kw)
    it = iter(busy)
    next(it)
    new_default = busy.state_dict()
    busy.load_state_dict(state)
    with pytest.raises(RuntimeError, match="load_state_dict that changed the shuffle warm-up"):
        next(it)
    busy.load_state_dict(new_default)
    assert busy.state_dict()["warmup"] == n
    # the rule looks at a rank's share: with 2 ranks a buffer of half the split holds it
    half = -(-n // 2)
    for rank in (0, 1):
        assert Loader(lmdb_dir, "train", None, cache=half, rank=rank, world_size=2,
                      **kw).state_dict()["warmup"] == half
    assert Loader(lmdb_dir, "train", None, cache=half - 1, rank=0, world_size=2,
                  **kw).state_dict()["warmup"] == 3


def test_a_launcher_without_a_process_group_is_an_error(lmdb_dir, monkeypatch):
    """torchrun sets WORLD_SIZE; a Loader made before init_process_group read the whole
    split on every rank, silently."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=2 is set .*init_process_group\(\) "
                                         r"before creating the Loader"):
        Loader(lmdb_dir, "train", None, num_workers=0)
    ld = Loader(lmdb_dir, "train", None, num_workers=0, rank=1, world_size=2)  # explicit: fine
    assert (ld.rank, ld.world_size) == (1, 2)
    ld = Loader(lmdb_dir, "train", None, num_workers=0, world_size=1)  # (as the error advises)
    assert (ld.rank, ld.world_size) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert Loader(lmdb_dir, "train", None, num_workers=0).world_size == 1


def test_direct_path_and_shards(synth_tree, tmp_path):
    import warnings
    from seqloader import WriteOptions, preprocess
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, tmp_path, splits=["train"],
                   options=WriteOptions(shards=3, progress=False))
    n = open_database(tmp_path, "train").num_records
    for where in (tmp_path, shard_path(tmp_path / "ILSVRC-train.lmdb", 1, 3)):
        loader = Loader(where, "train", None, batch_size=4, shuffle=True, num_workers=2)
        assert sum(len(r) for r, _ in loader) == n
        loader.close()
    with pytest.raises(FileNotFoundError, match="ILSVRC-val"):
        Loader(tmp_path, "val", None)


DDP = r"""
import os, sys, torch, torch.distributed as dist
from seqloader import Loader
rank = int(sys.argv[1]); path = sys.argv[2]; shuffle = sys.argv[3] == "1"
dist.init_process_group("gloo", init_method=f"file://{sys.argv[4]}", rank=rank, world_size=2)
loader = Loader(path, "train", None, batch_size=3, shuffle=shuffle, num_workers=2, cache=6,
                io=sys.argv[5])
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
ids = []
for raw, labels in loader:
    loss = model(labels.float()[:, None]).sum()
    loss.backward()  # a collective per batch: unequal batch counts would hang here
    ids.extend(bytes(b[:64]) + bytes(b[-64:]) for b in raw)
print(len(loader), flush=True)
print(" ".join(i.hex() for i in ids), flush=True)
loader.close()
dist.destroy_process_group()
# NOTE: exit without finalizing the interpreter.  DDP keeps the gloo process group alive
# past destroy_process_group(), and a gloo worker thread may still be dropping its last
# allreduce, which holds a Python object, when the interpreter finalizes: the thread dies
# taking the GIL and the rank aborts after all its output ("terminate called without an
# active exception", SIGABRT; a torch race, cf. pytorch/pytorch#38228, not the loader's).
os._exit(0)
"""


@pytest.mark.parametrize("shuffle,io", [(True, "auto"),
                                        pytest.param(False, "auto", marks=pytest.mark.slow),
                                        pytest.param(False, "direct", marks=pytest.mark.slow)])
def test_ddp_two_ranks_disjoint_and_equal(lmdb_dir, tmp_path, shuffle, io):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    init = tmp_path / "init"
    errs = [tmp_path / f"rank{r}.stderr" for r in range(2)]
    procs = []
    try:
        for r in range(2):
            with open(errs[r], "w") as f:  # files, not pipes: a rank never blocks on stderr
                procs.append(subprocess.Popen([sys.executable, "-c", DDP, str(r), str(lmdb_dir),
                                               str(int(shuffle)), str(init), io],
                                              stdout=subprocess.PIPE, stderr=f, text=True, env=env))
        outs = [p.communicate(timeout=120)[0].splitlines() for p in procs]
    finally:
        for p in procs:  # a timeout leaves no rank behind
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(
        f"rank {r} exited with {p.returncode}; stderr:\n{e.read_text()[-3000:]}"
        for r, (p, e) in enumerate(zip(procs, errs)))
    lens = [int(o[0]) for o in outs]
    ids = [o[1].split() if len(o) > 1 else [] for o in outs]
    assert not set(ids[0]) & set(ids[1])
    n = open_database(lmdb_dir, "train").num_records
    if shuffle:
        assert lens[0] == lens[1]
        assert n - 1 <= len(ids[0]) + len(ids[1]) <= n
    else:  # evaluation: every record once overall
        assert len(ids[0]) + len(ids[1]) == n


def test_held_batches_are_never_overwritten(lmdb_dir):
    """Batches are zero-copy views of shared buffers (leased until garbage-collected):
    holding every batch of an epoch must not let a later batch overwrite an earlier one."""
    import seqloader.transforms as T
    tf = T.Compose([T.Resize(24), T.CenterCrop(24), T.ToTensor()])
    inline = Loader(lmdb_dir, "train", tf, batch_size=3, num_workers=0)
    want = [x.clone() for x, _ in inline]
    pooled = Loader(lmdb_dir, "train", tf, batch_size=3, num_workers=2, prefetch=2)
    held = list(pooled)  # keeps all batches alive
    assert len(held) == len(want)
    for (x, _), w in zip(held, want):
        assert torch.equal(x, w)
    views = [x[:1] for x, _ in held]  # a view outlives its batch tensor
    del held
    import gc
    gc.collect()
    again = list(pooled)
    assert torch.equal(views[0], want[0][:1]) and len(again) == len(want)
    pooled.close()


HELD_AFTER_STOP = r"""
import gc, os, sys
import torch
import seqloader.transforms as T
from seqloader import Loader

def maps():  # this process's mappings of (unlinked) seqloader batch buffers
    with open("/proc/self/maps") as f:
        return sum("/psm_" in line for line in f)

tf = T.Compose([T.Resize(24), T.CenterCrop(24), T.ToTensor()])
db, case = sys.argv[1], sys.argv[2]

def make(workers=2, **kw):
    return Loader(db, "train", tf, batch_size=3, num_workers=workers, **kw)

ref = [x.clone() for x, _ in make(workers=0)]  # the same batches, decoded in this process

if case == "epoch-end":  # persistent_workers=False: the pool stops at the epoch's end
    loader = make(persistent_workers=False)
    for x, _ in loader:
        pass
    held = [x]
elif case == "close":
    loader = make()
    held = [next(iter(loader))[0]]
    loader.close()
elif case == "collected":  # a function's loader, gone when it returns
    held = [next(iter(make()))[0]]
x = None  # (the epoch-end case's loop variable)
want = [ref[-1] if case == "epoch-end" else ref[0]]
gc.collect()
print("held", int(maps() > 0), flush=True)
# reading a batch whose buffer was unmapped crashed here (SIGSEGV)
print("same", int(all(torch.equal(b, w) for b, w in zip(held, want))), flush=True)
del held, x
gc.collect()
print("left", maps(), flush=True)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
@pytest.mark.parametrize("case", [pytest.param("epoch-end", marks=pytest.mark.slow), "close",
                                  pytest.param("collected", marks=pytest.mark.slow)])
def test_held_batch_outlives_its_pool(lmdb_dir, case):
    """A zero-copy batch stays readable after its worker pool stops, and its buffer is
    unmapped when the batch goes (run in a child: the old failure was a segfault)."""
    p = subprocess.run([sys.executable, "-c", HELD_AFTER_STOP, str(lmdb_dir), case],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-2000:]}"
    assert p.stdout.split() == ["held", "1", "same", "1", "left", "0"], p.stdout
    assert "Exception ignored" not in p.stderr, p.stderr


def test_uint8_device_path_matches_float_path(lmdb_dir):
    import seqloader.transforms as T
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    kw = dict(batch_size=4, shuffle=True, num_workers=2, seed=3)
    ref = Loader(lmdb_dir, "train", tf, **kw)
    fast = Loader(lmdb_dir, "train", tf, output="uint8", device="cpu", **kw)
    for (a, ya), (b, yb) in zip(ref, fast):
        assert b.dtype == torch.float32 and b.shape == a.shape
        assert b.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(ya, yb) and (a - b).abs().max() < 0.02
    raw_u8 = Loader(lmdb_dir, "train", tf, output="uint8", **kw)
    x, _ = next(iter(raw_u8))
    assert x.dtype == torch.uint8 and x.shape[1:] == (32, 32, 3)
    for loader in (ref, fast, raw_u8):
        loader.close()
    with pytest.raises(ValueError, match="output='uint8' needs"):
        next(iter(Loader(lmdb_dir, "train", _mean_color, output="uint8", num_workers=0)))


@pytest.mark.needs("jpegtran")
def test_restart_marked_database_gives_the_same_batches(synth_tree, lmdb_dir, tmp_path):
    """A database written with --restart-markers (decoded in restart windows by the
    workers) yields exactly the batches of the plain one."""
    import warnings
    from seqloader import WriteOptions, preprocess, transforms as T
    from seqloader.format.jpeg import restart_grid
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, tmp_path, splits=["train"],
                   options=WriteOptions(restart_markers=True, progress=False, workers=2))
    assert all(restart_grid(r.image) for _, r in read_records(tmp_path / "ILSVRC-train.lmdb"))
    tf = T.Compose([T.RandomResizedCrop(24, scale=(0.05, 0.3)), T.RandomHorizontalFlip(),
                    T.ToTensor()])
    got = []
    for where in (lmdb_dir, tmp_path):
        loader = Loader(where, "train", tf, batch_size=8, shuffle=True, num_workers=2, seed=3)
        got.append([(x.clone(), y) for _ in range(2) for x, y in loader])
        loader.close()
    assert len(got[0]) == len(got[1]) > 0
    for (xa, ya), (xb, yb) in zip(*got):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def _tiny_fused():
    from seqloader import transforms as T
    return T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])


def _epoch_batches(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


def test_workers_read_into_the_next_epoch_without_changing_it(lmdb_dir):
    """NOTE [ worker lifecycle ]: after an epoch, persistent workers are already decoding
    the next one; that epoch -- or any other the caller asks for instead -- is exactly
    what a fresh loader yields."""
    import time
    kw = dict(batch_size=5, shuffle=True, num_workers=2, seed=4, cache=16)
    fresh = {}
    for e in range(4):
        ref = Loader(lmdb_dir, "train", _tiny_fused(), **kw)
        ref.set_epoch(e)
        fresh[e] = _epoch_batches(ref)
        ref.close()
    a = Loader(lmdb_dir, "train", _tiny_fused(), **kw)
    assert _same(_epoch_batches(a), fresh[0])
    pool = a.workers
    deadline = time.monotonic() + 10
    while pool.free_slots == pool.num_slots and time.monotonic() < deadline:
        time.sleep(0.05)  # the reader hands epoch 1's first batches to the workers
    assert pool.ahead is not None and pool.free_slots < pool.num_slots
    assert _same(_epoch_batches(a), fresh[1])  # continued
    a.set_epoch(3)  # not the one read ahead (2): cancelled, then epoch 3 from the start
    assert _same(_epoch_batches(a), fresh[3])
    for _ in a:  # epoch 4 (epoch 5 ahead of it): break, then resume epoch 2 at batch 1
        break
    a.load_state_dict({**a.state_dict(), "epoch": 2, "position": 1})
    assert _same(_epoch_batches(a), fresh[2][1:])
    assert _same(_epoch_batches(a), fresh[3])  # and straight on
    a.close()
    b = Loader(lmdb_dir, "train", _tiny_fused(), persistent_workers=False, **kw)
    assert _same(_epoch_batches(b), fresh[0])
    assert b.workers is None or not b.workers.started  # stopped after the epoch: nothing ahead
    b.close()


def _slow_mean_color(img, rng=None):
    import time
    time.sleep(0.13)
    return _mean_color(img)


def test_a_read_ahead_failure_is_the_next_epochs_error(lmdb_dir, monkeypatch):
    """Reading ahead into epoch 1 fails: epoch 0 still completes, and epoch 1 raises the
    reader's error (with its traceback) instead of hanging."""
    from seqloader.dataflow.stages import BatchData
    from seqloader.errors import WorkerError
    real = BatchData.batches

    def batches(self, plan, first=0, **kw):
        if plan.epoch == 1:
            raise OSError("disk gone while reading epoch 1")
        yield from real(self, plan, first, **kw)

    monkeypatch.setattr(BatchData, "batches", batches)
    # batches slower than the pool's 1-second liveness poll, so that the consumer of
    # epoch 0 does look at the reader's state while the reader is already in epoch 1
    loader = Loader(lmdb_dir, "train", _slow_mean_color, batch_size=10, shuffle=True,
                    num_workers=2, seed=4, cache=16, timeout=60)
    assert len([y for _, y in loader]) == len(loader)
    with pytest.raises(WorkerError, match="(?s)reader thread failed.*disk gone while reading "
                                          "epoch 1.*Reader traceback"):
        list(loader)
    loader.close()


def test_close_does_not_wait_for_a_read_ahead(lmdb_dir, monkeypatch):
    """close() after an epoch stops the reader in the middle of reading the next epoch's
    first batch (here made 0.2 s per record: ~8 s for its 40) instead of waiting."""
    import time
    from seqloader.read.reader import RangeReader
    calls = []
    real = RangeReader.read

    def read(self, *a, **kw):  # one call per epoch: epoch 1's crawls
        calls.append(None)
        slow = len(calls) > 1
        for rec in real(self, *a, **kw):
            if slow:
                time.sleep(0.2)
            yield rec

    monkeypatch.setattr(RangeReader, "read", read)
    loader = Loader(lmdb_dir, "train", _tiny_fused(), batch_size=40, shuffle=True,
                    num_workers=2, seed=4, cache=40)
    assert len(list(loader)) == len(loader)
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the reader is now filling epoch 1's shuffle buffer
    assert len(calls) == 2
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 4


@pytest.mark.parametrize("bad", [
    dict(batch_size=0), dict(batch_size=2.5), dict(batch_size=True), dict(num_workers=-1),
    dict(num_workers=1.5), dict(cache=0), dict(seed=-1), dict(prefetch=0), dict(timeout=-1),
    dict(timeout=float("nan")),  # (a NaN deadline is never passed: no limit, silently)
    dict(prefetch_bytes=0), dict(warmup=-5), dict(start_method="bogus"), dict(output="f16"),
    dict(io="bogus"),
])
def test_bad_arguments_are_named_when_the_loader_is_made(lmdb_dir, bad):
    """Not at the first iteration, and not only with workers: the constructor names the
    argument and its value."""
    (name, value), = bad.items()
    import re
    with pytest.raises(ValueError, match=rf"{name}.*{re.escape(repr(value))}"):
        Loader(lmdb_dir, "train", None, **{"num_workers": 0, **bad})


def test_a_superseded_iterator_raises_instead_of_looking_finished(lmdb_dir):
    loader = Loader(lmdb_dir, "train", None, batch_size=4, num_workers=0)
    first = iter(loader)
    next(first)
    second = iter(loader)  # a new epoch: the first iteration ends
    assert len(second) == len(loader)  # as DataLoader's iterators
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(first)
    assert sum(1 for _ in second) == len(loader)
    with pytest.raises(RuntimeError, match="newer iter"):
        list(zip(loader, loader))
    it = iter(loader)
    next(it)
    loader.close()  # close() ends it too, as a finished epoch
    assert list(it) == []


def test_an_iterator_uses_its_epoch_at_its_first_batch(lmdb_dir):
    """NOTE [ epochs and iterators ]: an iter() that yields nothing (a trainer checking
    the loader) uses no epoch; an epoch cut short holds until the next iter(); the
    trainer's sampler.set_epoch ends a loaded cut-short epoch without a warning."""
    import warnings
    kw = dict(batch_size=4, shuffle=True, num_workers=2, seed=2, cache=8)
    ref = Loader(lmdb_dir, "train", None, **kw)
    want = [_ids(ref) for _ in range(3)]
    ref.close()
    a = Loader(lmdb_dir, "train", None, **kw)
    iter(a)  # checked, not iterated
    it = iter(a)
    assert len(it) == len(a) and a.epoch == 0
    assert [[bytes(b[:64]) + bytes(b[-64:]) for b in next(it)[0]] for _ in range(2)] == want[0][:2]
    state = a.state_dict()
    assert (state["epoch"], state["position"]) == (0, 2)  # cut short, until the next iter()
    it = iter(a)
    assert (a.state_dict()["epoch"], a.state_dict()["position"]) == (1, 0)
    assert _ids(a) == want[1]  # (the iterator above yielded nothing: epoch 1 is this one)
    # a loaded position is taken by the iterator that yields, not by the one made first
    b = Loader(lmdb_dir, "train", None, **kw)
    iter(b)
    b.load_state_dict(state)
    it = iter(b)
    b.sampler.set_epoch(0)  # the loaded epoch: kept (trainers call it after iter())
    assert len(it) == len(b) - 2 and _ids_of(it) == want[0][2:]
    # a trainer starting epoch 1 after a checkpoint of cut-short epoch 0 ends it
    c = Loader(lmdb_dir, "train", None, **kw)
    c.load_state_dict(state)
    it = iter(c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.sampler.set_epoch(1)
    assert len(it) == len(c) and _ids_of(it) == want[1]
    c.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(1\) discards the position"):
        c.set_epoch(1)  # called directly: more likely a wrong epoch counter
    with pytest.raises(AttributeError, match="register_for_checkpointing"):
        c.dataset  # accelerate's skip_first_batches reads it
    a.close(), b.close(), c.close()


def _ids_of(it):
    return [[bytes(b[:64]) + bytes(b[-64:]) for b in raw] for raw, _ in it]


def test_a_database_file_of_another_split_is_refused(lmdb_dir):
    """A direct path to a .lmdb file with a split that is not the file's own (e.g. the
    train file passed for 'val') was silently used: validation on the training set."""
    from seqloader.dataflow.stages import LMDBData
    from seqloader.errors import FormatError
    train = lmdb_dir / "ILSVRC-train.lmdb"
    with pytest.raises(FormatError, match=r"holds split 'train', not 'val'"):
        Loader(train, "val", None, batch_size=4, num_workers=0)
    with pytest.raises(FormatError, match=r"holds split 'train', not 'val'"):
        LMDBData(train, "val")
    assert len(Loader(train, "train", None, batch_size=4, num_workers=0)) > 0
