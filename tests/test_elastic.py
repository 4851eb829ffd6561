"""Elastic mid-epoch resume with real Loaders (NOTE [ elastic resume ]): a checkpoint of
W ranks resumes on W' ranks, or at another batch size, and the records delivered before
and after are the epoch's records exactly once (minus the stated drop); the next epoch
is a fresh run's on the new settings.  Ranks are Loaders with explicit rank/world_size
in this process, and, in one test, gloo process groups of real processes."""
from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from seqloader import Loader, write_dataset

REPO = Path(__file__).resolve().parents[1]
N = 403  # records; the label of record i is i


class Tiny:
    """``N`` 8x8 images; the target is the index (a record's identity)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full((8, 8, 3), i % 251, np.uint8), i


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    out = tmp_path_factory.mktemp("elastic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_dataset(Tiny(), out, workers=2, progress=False, image_format="pixels")
    return out


def _loader(db, world, rank, batch, cache=48, workers=0):
    return Loader(db, "train", None, batch_size=batch, shuffle=True, num_workers=workers,
                  cache=cache, seed=9, chunk_size=32, rank=rank, world_size=world)


def _labels(it, k=None):
    """The labels of the batches of ``it`` (its first ``k``: no more is taken)."""
    return [y.tolist() for _, y in (it if k is None else itertools.islice(it, k))]


def _checkpoint(db, world, batch, position, epoch=1, cache=48):
    """Every rank reads ``position`` batches of ``epoch``; (delivered labels, the state)."""
    seen, states = [], []
    for r in range(world):
        loader = _loader(db, world, r, batch, cache)
        loader.set_epoch(epoch)
        it = iter(loader)
        seen += sum(_labels(it, position), [])
        states.append(loader.state_dict())
        loader.close()
    assert all(s == states[0] for s in states)  # rank 0's is the whole checkpoint
    return seen, states[0]


def _resume(db, world, batch, state, cache=48, workers=0):
    """Every new rank loads the state and reads the rest of the epoch, then the next."""
    rest, nxt = [], []
    for r in range(world):
        loader = _loader(db, world, r, batch, cache, workers)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            loader.load_state_dict(state)
        it = iter(loader)
        n = len(it)
        got = _labels(it)
        assert len(got) == n
        rest.append(got)
        nxt.append(_labels(loader))
        loader.close()
    return rest, nxt, [str(x.message) for x in w]


def _fresh(db, world, batch, epoch):
    out = []
    for r in range(world):
        loader = _loader(db, world, r, batch)
        loader.set_epoch(epoch)
        out.append(_labels(loader))
        loader.close()
    return out


@pytest.mark.parametrize("old, new, position, workers", [
    pytest.param((4, 8), (2, 8), 1, 0, id="4->2 in the first buffer fill"),
    pytest.param((2, 8), (3, 8), 7, 2, id="2->3 mid-epoch, 2 workers"),
    pytest.param((1, 8), (4, 8), 50, 0, id="1->4 before the last batch"),
    pytest.param((2, 32), (2, 48), 3, 0, id="batch 32->48"),
    pytest.param((4, 8), (2, 8), 12, 0, id="4->2 before the last batch"),
])
def test_resume_on_other_settings_delivers_the_rest_once(db, old, new, position, workers):
    seen, state = _checkpoint(db, *old, position)
    assert len(pickle.dumps(state)) < 4096
    rest, nxt, said = _resume(db, *new, state, workers=workers)
    assert len({len(r) for r in rest}) == 1  # every rank the same number of batches
    got = [i for r in rest for b in r for i in b]
    everything = seen + got
    assert len(everything) == len(set(everything))  # nothing twice
    dropped = N - len(everything)
    assert 0 <= dropped <= new[0] - 1  # training's even rule
    assert bool(said) == bool(dropped) and (not said or f"{dropped} of them dropped" in said[0])
    assert nxt == _fresh(db, *new, epoch=2)  # the next epoch: a fresh run's


def test_a_rest_checkpointed_again_resumes_on_a_third_setting(db):
    seen, state = _checkpoint(db, 4, 8, 3)
    mid, states = [], []
    for r in range(2):  # 4 -> 2 ranks: 2 batches of the rest, checkpoint again
        loader = _loader(db, 2, r, 8, cache=20)
        with pytest.warns(UserWarning, match="307 records of it left, 1 of them dropped"):
            loader.load_state_dict(state)
        mid += sum(_labels(iter(loader), 2), [])
        states.append(loader.state_dict())
        loader.close()
    assert states[0] == states[1] and len(states[0]["before"]) == 1
    rest, _, _ = _resume(db, 3, 16, states[0])  # -> 3 ranks of batch 16
    everything = seen + mid + [i for r in rest for b in r for i in b]
    assert len(everything) == len(set(everything)) and N - len(everything) <= 2
    # the same settings as the rest's continue that rest exactly
    rest2, _, _ = _resume(db, 2, 8, states[0], cache=20)
    full, _, _ = _resume(db, 2, 8, state, cache=20)
    assert [sum(r, []) for r in rest2] == [sum(r[2:], []) for r in full]


def test_a_checkpoint_after_the_last_batch_starts_the_next_epoch_on_the_new_settings(db):
    _, state = _checkpoint(db, 4, 8, 13)  # all 13 batches of epoch 1
    assert (state["epoch"], state["position"]) == (2, 0)
    rest, _, _ = _resume(db, 2, 8, state)
    assert rest == _fresh(db, 2, 8, epoch=2)


def test_another_seed_or_database_is_refused(db, tmp_path):
    _, state = _checkpoint(db, 2, 8, 2)
    other = Loader(db, "train", None, batch_size=8, shuffle=True, num_workers=0, seed=10,
                   rank=0, world_size=1)
    with pytest.raises(ValueError, match="seed is 9, this loader's 10"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="the database is not the one"):
        _loader(db, 1, 0, 8).load_state_dict({**state, "fingerprint": "x", "num_records": 5})


DDP = r"""
import json, os, sys, torch.distributed as dist
from seqloader import Loader
rank, world, init, db, state_in, out = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                        sys.argv[4], sys.argv[5], sys.argv[6])
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
loader = Loader(db, "train", None, batch_size=8, shuffle=True, num_workers=1, cache=48,
                seed=9, chunk_size=32)
got = []
if state_in == "-":  # the first run: 3 batches of epoch 0, then rank 0 saves the state
    it = iter(loader)
    got = [next(it)[1].tolist() for _ in range(3)]
    if rank == 0:
        json.dump(loader.state_dict(), open(out + ".state", "w"))
else:
    loader.load_state_dict(json.load(open(state_in)))
    got = [y.tolist() for _, y in loader]
nxt = [y.tolist() for _, y in loader] if state_in != "-" else []
json.dump({"got": got, "next": nxt}, open(f"{out}.{rank}", "w"))
loader.close()
dist.barrier()
os._exit(0)  # (NOTE in tests/test_loader.py's DDP script: a gloo race at finalization)
"""


def _ranks(world, db, state_in, out, tmp_path):
    init = tmp_path / f"init-{world}-{out.name}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", DDP, str(r), str(world), str(init), str(db),
                               str(state_in), str(out)], env=env, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    import json
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


@pytest.mark.slow
def test_gloo_ranks_2_resumed_on_3(db, tmp_path):
    first = _ranks(2, db, "-", tmp_path / "a", tmp_path)
    then = _ranks(3, db, tmp_path / "a.state", tmp_path / "b", tmp_path)
    seen = [i for r in first for b in r["got"] for i in b]
    got = [i for r in then for b in r["got"] for i in b]
    assert len({len(r["got"]) for r in then}) == 1
    everything = seen + got
    assert len(everything) == len(set(everything)) and N - len(everything) <= 2
    assert [r["next"] for r in then] == _fresh(db, 3, 8, epoch=1)
