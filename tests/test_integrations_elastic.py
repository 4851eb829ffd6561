"""Lightning and accelerate: a mid-epoch checkpoint of 2 CPU processes (gloo) resumed on 1
process trains each record of that epoch exactly once over the two runs, and the next
epoch is a fresh 1-process one (NOTE [ elastic resume ]).  Real processes, real libraries;
skipped without them."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

COMMON = r"""
import hashlib, json, os, sys, warnings
import torch
from seqloader import Loader
warnings.filterwarnings("ignore")
db, out, mode, ckpt = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def ident(raw):
    return [hashlib.md5(bytes(b)).hexdigest()[:12] for b in raw]

def loader():
    return Loader(db, "train", None, batch_size=4, shuffle=True, num_workers=1, seed=3, cache=16)
"""

ACCELERATE = COMMON + r"""
import accelerate
acc = accelerate.Accelerator(cpu=True)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = loader()
model, opt, data = acc.prepare(model, opt, data)
acc.register_for_checkpointing(data)
seen = {}
if mode == "resume":
    acc.load_state(ckpt)
for epoch in range(data.epoch, 2):
    data.set_epoch(epoch)
    for j, (raw, y) in enumerate(data):
        seen.setdefault(epoch, []).extend(ident(raw))
        acc.backward(model(y.float()[:, None]).sum())
        opt.step()
        opt.zero_grad()
        if mode == "first" and j == 2:  # preempted after 3 batches
            acc.save_state(ckpt)
            break
    if mode == "first":
        break
json.dump(seen, open(f"{out}.{acc.process_index}", "w"))
data.close()
acc.wait_for_everyone()
os._exit(0)  # (a gloo race at finalization: NOTE in tests/test_loader.py's DDP script)
"""

LIGHTNING = COMMON + r"""
import lightning.pytorch as pl

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)
        self.seen = {}

    def training_step(self, batch, batch_idx):
        raw, y = batch
        self.seen.setdefault(self.current_epoch, []).extend(ident(raw))
        return self.net(y.float()[:, None]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):  # (after Lightning made the process group)
        return loader()

from lightning.pytorch.callbacks import ModelCheckpoint
first = mode == "first"
cb = [ModelCheckpoint(ckpt, "mid-{step}", every_n_train_steps=3, save_top_k=-1)] if first else []
world = int(os.environ.get("WORLD_SIZE", 1))
trainer = pl.Trainer(max_epochs=2, max_steps=3 if first else -1, accelerator="cpu",
                     devices=world, strategy="ddp" if world > 1 else "auto", logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=first, callbacks=cb, default_root_dir=ckpt)
model = Tiny()
trainer.fit(model, ckpt_path=None if first else os.path.join(ckpt, "mid-step=3.ckpt"))
json.dump(model.seen, open(f"{out}.{trainer.global_rank}", "w"))
os._exit(0)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(script, world, db, out, mode, ckpt):
    """``world`` processes as torchrun starts them (the env:// variables)."""
    port = _port()
    procs = []
    for r in range(world):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        if world > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                       RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world), NODE_RANK="0",
                       GROUP_RANK="0")
        procs.append(subprocess.Popen([sys.executable, "-c", script, str(db), str(out), mode,
                                       str(ckpt)], env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-4000:]
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


def _fresh_epoch(db, epoch):
    import hashlib

    from seqloader import Loader
    loader = Loader(db, "train", None, batch_size=4, shuffle=True, num_workers=0, seed=3,
                    cache=16, world_size=1)
    loader.set_epoch(epoch)
    out = [hashlib.md5(bytes(b)).hexdigest()[:12] for raw, _ in loader for b in raw]
    loader.close()
    return out


def _check(db, first, then):
    """Each record of epoch 0 once over both runs; epoch 1 a fresh 1-process epoch."""
    before = [i for rank in first for i in rank.get("0", [])]
    assert len(before) == 2 * 3 * 4  # 3 batches of 4 on each of the 2 ranks
    rest = then[0]["0"]
    everything = _fresh_epoch(db, 0)
    assert sorted(before + rest) == sorted(everything)  # 1 process: nothing dropped
    assert then[0]["1"] == _fresh_epoch(db, 1)


@pytest.mark.slow
@pytest.mark.needs("accelerate")
def test_accelerate_two_processes_resumed_on_one(lmdb_dir, tmp_path):
    first = _launch(ACCELERATE, 2, lmdb_dir, tmp_path / "a", "first", tmp_path / "ckpt")
    then = _launch(ACCELERATE, 1, lmdb_dir, tmp_path / "b", "resume", tmp_path / "ckpt")
    _check(lmdb_dir, first, then)


@pytest.mark.slow
@pytest.mark.needs("lightning")
def test_lightning_two_processes_resumed_on_one(lmdb_dir, tmp_path):
    first = _launch(LIGHTNING, 2, lmdb_dir, tmp_path / "a", "first", tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "mid-step=3.ckpt").exists()
    then = _launch(LIGHTNING, 1, lmdb_dir, tmp_path / "b", "resume", tmp_path / "ckpt")
    _check(lmdb_dir, first, then)
