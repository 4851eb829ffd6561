"""A tiny Lightning training on CPU with the real library and real worker processes:
Lightning epoch k reads Loader epoch k, and a resume from Lightning's own checkpoints
(mid-epoch, end of epoch, with and without ``limit_train_batches``) sees exactly the
batches of the uninterrupted run.  Skipped without ``lightning`` (``pip install
seqloader[integrations]``)."""
import warnings

import pytest
import torch

pytestmark = pytest.mark.needs("lightning")
pl = pytest.importorskip("lightning.pytorch")

from seqloader import Loader, transforms as T

KW = dict(batch_size=4, shuffle=True, num_workers=2, seed=3, cache=16)


def _loader(lmdb_dir):
    return Loader(lmdb_dir, "train", T.Compose([T.RandomResizedCrop(8), T.ToTensor()]), **KW)


def _key(images, labels):
    """A batch, comparably: its labels and a checksum of its pixels."""
    return tuple(labels.tolist()), round(float(images.double().sum()), 4)


class Tiny(pl.LightningModule):
    """Records (epoch, batch_idx, batch key) of every training step."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(3 * 8 * 8, 4)
        self.seen = []

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.seen.append((self.current_epoch, batch_idx, _key(images, labels)))
        return torch.nn.functional.cross_entropy(self.net(images.flatten(1)), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(loader, max_epochs, limit, ckpt_path=None, callbacks=(), root=None):
    model = Tiny()
    trainer = pl.Trainer(max_epochs=max_epochs, limit_train_batches=limit, accelerator="cpu",
                         devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=bool(callbacks),
                         callbacks=list(callbacks), default_root_dir=root)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="lightning")  # (few workers, no val loader)
        trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    loader.close()
    return model.seen


def _expected(lmdb_dir, epochs, limit):
    """The batches of Loader epochs 0..epochs-1 read directly, each cut to ``limit``."""
    ref, out = _loader(lmdb_dir), []
    for e in range(epochs):
        ref.set_epoch(e)
        for j, (x, y) in enumerate(ref):
            if limit is not None and j == limit:
                break
            out.append((e, j, _key(x, y)))
    ref.close()
    return out


def _checkpoints(tmp_path, every):
    """Lightning's own: every ``every`` steps (when given) and at each epoch's end."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    end = ModelCheckpoint(tmp_path, "end-{epoch}", every_n_epochs=1, save_top_k=-1,
                          save_on_train_epoch_end=True)
    if every is None:
        return [end]
    return [ModelCheckpoint(tmp_path, "mid-{step}", every_n_train_steps=every, save_top_k=-1),
            end]


def _resume_matches(lmdb_dir, tmp_path, epochs, limit, every, only=None):
    full = _fit(_loader(lmdb_dir), epochs, limit, callbacks=_checkpoints(tmp_path, every),
                root=tmp_path)
    # Lightning's iter() check takes no batch (it used up epoch 0): epoch k is Loader's k
    assert full == _expected(lmdb_dir, epochs, limit)
    ckpts = sorted(tmp_path.glob("*.ckpt"))
    assert {p.name.split("-")[0] for p in ckpts} == ({"end"} if every is None else {"mid", "end"})
    for ckpt in ckpts if only is None else [tmp_path / only]:
        state = torch.load(ckpt, weights_only=False)
        assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"], "loader state saved"
        done = state["global_step"]  # batches trained before the checkpoint
        rest = _fit(_loader(lmdb_dir), epochs, limit, ckpt_path=str(ckpt))
        assert rest == full[done:], ckpt.name


def test_lightning_epochs_and_resume_after_a_cut_short_epoch(lmdb_dir, tmp_path):
    """The end-of-epoch checkpoint of an epoch cut short by limit_train_batches resumes
    the next epoch (it continued the cut-short one)."""
    _resume_matches(lmdb_dir, tmp_path, epochs=2, limit=3, every=None, only="end-epoch=0.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize("limit, every", [(3, 4), (None, 5)])
def test_lightning_resume_from_every_checkpoint(lmdb_dir, tmp_path, limit, every):
    """Mid-epoch checkpoints resume the rest of their epoch, end-of-epoch ones the next,
    with and without limit_train_batches."""
    _resume_matches(lmdb_dir, tmp_path, epochs=3, limit=limit, every=every)
