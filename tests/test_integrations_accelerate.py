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


def _steps(acc, model, opt, batches, epochs=2):
    """The batch indices at which ``accumulate`` steps the optimizer, per epoch."""
    out = []
    for epoch in range(epochs):
        if hasattr(batches, "set_epoch"):
            batches.set_epoch(epoch)
        steps = []
        for j, (x, y) in enumerate(batches):
            with acc.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x.float().flatten(1)), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    steps.append(j)
                opt.step()
                opt.zero_grad()
        out.append(steps)
    return out


def test_gradient_accumulation_steps_at_the_loaders_epoch_end(tmp_path):
    """accumulate() ends its window at the Loader's last batch, as at a prepared
    DataLoader's (NOTE [ accelerate's gradient window ]): 15 batches, 4 a window."""
    import numpy as np
    from seqloader import write_dataset

    images = [(np.full((8, 8, 3), i, np.uint8), i % 4) for i in range(45)]
    write_dataset(images, tmp_path, workers=1, progress=False)
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
    model = torch.nn.Linear(3 * 8 * 8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = Loader(tmp_path, "train", T.Compose([T.RandomResizedCrop(8), T.ToTensor()]),
                    batch_size=3, shuffle=True, num_workers=2, seed=1)
    assert len(loader) == 15
    data = torch.utils.data.TensorDataset(torch.rand(45, 3, 8, 8), torch.randint(0, 4, (45,)))
    model, opt, prepared, ref = acc.prepare(model, opt, loader,
                                            torch.utils.data.DataLoader(data, batch_size=3))
    assert prepared is loader and len(ref) == 15
    want = _steps(acc, model, opt, ref)
    assert want == [[3, 7, 11, 14]] * 2
    assert _steps(acc, model, opt, loader) == want
    assert not acc.gradient_state.in_dataloader  # (unregistered at each epoch's end)
    loader.close()
