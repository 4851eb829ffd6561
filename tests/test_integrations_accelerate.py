"""A tiny Hugging Face accelerate training on CPU with the real library and real worker
processes: ``prepare()`` passes the Loader through, and ``save_state``/``load_state``
with ``register_for_checkpointing(loader)`` resume exactly the batches not yet seen (the
supported resume: ``skip_first_batches`` needs a torch DataLoader, and says what to do
instead).  Skipped without ``accelerate`` (``pip install seqloader[integrations]``)."""
import pytest
import torch

pytestmark = pytest.mark.needs("accelerate")
accelerate = pytest.importorskip("accelerate")

from seqloader import Loader, transforms as T

KW = dict(batch_size=4, shuffle=True, num_workers=2, seed=7, cache=16)
EPOCHS = 2


def _key(images, labels):
    return tuple(labels.tolist()), round(float(images.double().sum()), 4)


def _setup(lmdb_dir):
    acc = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(3 * 8 * 8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = Loader(lmdb_dir, "train", T.Compose([T.RandomResizedCrop(8), T.ToTensor()]), **KW)
    model, opt, prepared = acc.prepare(model, opt, loader)
    assert prepared is loader  # (not a torch DataLoader: passed through as it is)
    acc.register_for_checkpointing(loader)
    return acc, model, opt, loader


def _train(acc, model, opt, loader, save_at=None, save_dir=None):
    """The usual loop, from the loader's epoch (the checkpoint's after load_state)."""
    seen = []
    for epoch in range(loader.epoch, EPOCHS):
        loader.set_epoch(epoch)  # (keeps a loaded position of this epoch)
        for images, labels in loader:
            seen.append((epoch, _key(images, labels)))
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1)), labels)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if len(seen) == save_at:
                acc.save_state(save_dir)
    loader.close()
    return seen


def test_accelerate_save_state_resumes_mid_epoch(lmdb_dir, tmp_path):
    full = _train(*_setup(lmdb_dir), save_at=3, save_dir=tmp_path / "ckpt")
    per_epoch = len(full) // EPOCHS
    assert [e for e, _ in full] == [0] * per_epoch + [1] * per_epoch
    acc, model, opt, loader = _setup(lmdb_dir)
    acc.load_state(tmp_path / "ckpt")
    assert (loader.epoch, loader.state_dict()["position"]) == (0, 3)
    assert _train(acc, model, opt, loader) == full[3:]
    with pytest.raises(AttributeError, match=r"register_for_checkpointing\(loader\)"):
        acc.skip_first_batches(loader, 3)
