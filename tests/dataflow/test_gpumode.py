"""The GPU decode mode's setup and its main-process part, without a GPU: a fake
torchvision.io (tests/fake_torchvision) records the real decode call and decodes on the
CPU, torch is made to report CUDA devices where the setup is tested, and everything
after the decode runs on CPU tensors (NOTE [ GPU setup ], NOTE [ GPU stream ])."""
import sys
import weakref
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (fake_torchvision)
from fake_torchvision import FakeTorchvision, ImageReadMode, force_cuda, no_torchvision  # noqa: E402

from seqloader import DeviceError, GPUOptions, Loader, RecordError  # noqa: E402
from seqloader.dataflow import gpumode  # noqa: E402
from seqloader.dataflow.gpudecode import REFUSED  # noqa: E402
from seqloader.dataflow.gpumode import GPUMode, resolve_device  # noqa: E402
from seqloader.transforms import (Compose, Normalize, RandomHorizontalFlip,  # noqa: E402
                                  RandomResizedCrop, ToTensor)
from seqloader.transforms.gpu import JpegDecoder, TensorRecipe  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRAIN = Compose([RandomResizedCrop(64), RandomHorizontalFlip(), ToTensor(), Normalize(MEAN, STD)])
KW = dict(batch_size=6, shuffle=True, num_workers=2, seed=4)


# ------------------------------------------------------------------ setup (at construction)

def test_the_device_gets_an_explicit_index(monkeypatch):
    force_cuda(monkeypatch, count=4, current=2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device("cuda") == torch.device("cuda", 2)
    assert resolve_device("cuda:3") == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda", rank=5, world_size=8) == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "7")
    with pytest.raises(ValueError, match=r"cuda:7, but 4 CUDA device\(s\).*LOCAL_RANK=7"):
        resolve_device("cuda")


def test_ranks_that_would_share_gpu_0_by_accident_are_an_error(monkeypatch):
    force_cuda(monkeypatch, count=2, current=0)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match=r"rank 1 of 2.*every rank would decode on cuda:0"):
        resolve_device("cuda", rank=1, world_size=2)
    assert resolve_device("cuda", rank=0, world_size=2) == torch.device("cuda", 0)
    assert resolve_device("cuda:1", rank=1, world_size=2) == torch.device("cuda", 1)


def test_the_loader_resolves_the_device_and_checks_torchvision_when_built(lmdb_dir, monkeypatch):
    force_cuda(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "1")
    fake = FakeTorchvision().install(monkeypatch)
    ld = Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cuda", **KW)
    assert ld.settings.device == torch.device("cuda", 1)
    assert len(fake.calls) == 1  # the tiny JPEG, decoded on the resolved device
    call = fake.calls[0]
    assert call["list"] and call["mode"] == ImageReadMode.RGB
    assert call["device"] == torch.device("cuda", 1)
    assert call["inputs"] == [(torch.uint8, "cpu", 1)]


@pytest.mark.parametrize("how, match", [
    ("missing", "needs torchvision, which cannot be imported"),
    ("old", r"needs torchvision >= 0.19.*found 0.18.1"),
    ("no nvjpeg", "could not decode a test JPEG on cuda:0.*without nvJPEG"),
    ("oom", "could not decode a test JPEG on cuda:0.*OutOfMemoryError"),
])
def test_a_broken_setup_is_a_device_error_when_the_loader_is_built(lmdb_dir, monkeypatch, how,
                                                                   match):
    """Not a RecordError of record 0 in the first batch (as on main): a DeviceError with
    the fix, before any worker starts."""
    force_cuda(monkeypatch)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if how == "missing":
        no_torchvision(monkeypatch)
    else:
        error = {"no nvjpeg": RuntimeError("torchvision not compiled with nvJPEG support"),
                 "oom": torch.OutOfMemoryError("CUDA out of memory")}.get(how)
        FakeTorchvision("0.18.1" if how == "old" else "0.19.0", error=error).install(monkeypatch)
    with pytest.raises(DeviceError, match=match) as e:
        Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cuda", **KW)
    assert not isinstance(e.value, RecordError)
    assert "decode='cpu'" in str(e.value)


# ------------------------------------------------------------------ the decode, forced CUDA

def _forced(lmdb_dir, monkeypatch, fake, options=None, **kw):
    """A Loader on CPU tensors whose decoder takes torchvision's CUDA branch (the fake)."""
    ld = Loader(lmdb_dir, "train", TRAIN, decode=options or "gpu", device="cpu", **{**KW, **kw})
    fake.install(monkeypatch)
    force_cuda(monkeypatch)
    ld.settings.decode.jpeg = JpegDecoder(torch.device("cuda", 1))
    fake.calls.clear()
    return ld


def _batches(ld):
    """Every batch of an epoch, copied; the loader closed (its workers stopped)."""
    with ld:
        return [(x.clone(), y.clone()) for x, y in ld]


def test_the_real_call_gets_cpu_uint8_tensors_mode_rgb_and_the_resolved_device(lmdb_dir,
                                                                                monkeypatch):
    want = _batches(Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cpu", **KW))
    fake = FakeTorchvision()
    got = _batches(_forced(lmdb_dir, monkeypatch, fake))
    assert len(got) == len(want) and all(torch.equal(a, c) and torch.equal(b, d)
                                         for (a, b), (c, d) in zip(got, want))
    assert fake.calls and all(c["list"] and c["mode"] == ImageReadMode.RGB
                              and c["device"] == torch.device("cuda", 1) for c in fake.calls)
    assert all(set(c["inputs"]) == {(torch.uint8, "cpu", 1)} for c in fake.calls)


def test_an_image_the_device_refuses_is_decoded_on_the_cpu_and_counted(lmdb_dir, monkeypatch):
    """nvJPEG refusing an image (e.g. its chroma subsampling) is a counted CPU fallback,
    not a RecordError; the batch is the same."""
    from conftest import read_records

    want = _batches(Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cpu", **KW))
    recs = [r for _, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")]
    refuse = {r.image for r in recs[:5]}
    ld = _forced(lmdb_dir, monkeypatch, FakeTorchvision(refuse=refuse))
    got = _batches(ld)
    assert all(torch.equal(a, c) for (a, _), (c, _) in zip(got, want))
    on_device = {r.image for r in recs} - refuse
    refused = ld.decode_stats.fallback.get(REFUSED, 0)
    assert 0 < refused <= 5 and ld.decode_stats.images == sum(len(y) for _, y in got)
    assert ld.decode_stats.on_gpu <= len(on_device)


def test_the_device_running_out_of_memory_is_a_device_error_not_a_record_error(lmdb_dir,
                                                                               monkeypatch):
    fake = FakeTorchvision()
    ld = _forced(lmdb_dir, monkeypatch, fake)
    fake.error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with ld, pytest.raises(DeviceError, match=r"batch \d+ .*out of memory.*decoded_bytes") as e:
        next(iter(ld))
    assert not isinstance(e.value, RecordError)


def test_decoded_bytes_bound_each_call_and_keep_the_batches(lmdb_dir, monkeypatch):
    want = _batches(Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cpu", **KW))
    fake = FakeTorchvision()
    budget = 3 * 90 * 120 * 3  # (a few of the tree's images at full resolution)
    ld = _forced(lmdb_dir, monkeypatch, fake, options=GPUOptions(decoded_bytes=budget))
    got = _batches(ld)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, want))
    sizes = ld.settings.decode.stats
    assert sizes.images == sum(len(y) for _, y in got)
    assert len(fake.calls) > len(got)  # (batches decoded in parts)
    with pytest.raises(ValueError, match="decoded_bytes"):
        GPUOptions(decoded_bytes=0)


# ------------------------------------------------------------------ the main process's part

def test_the_streams_are_made_after_the_workers_start(lmdb_dir, monkeypatch):
    seen = []
    real = gpumode.GPUDecoder

    def made(spec, device, **kw):
        seen.append(ld.workers is not None and ld.workers.started)
        return real(spec, device, **kw)

    monkeypatch.setattr(gpumode, "GPUDecoder", made)
    ld = Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cpu", **KW)
    with ld:
        next(iter(ld))
    assert seen == [True]


def test_the_callers_previous_batch_makes_no_third_live_batch(lmdb_dir, monkeypatch):
    """Rendering happens in the next() that hands a batch out: while the caller holds
    its previous batch, at most that one and the new one live."""
    live: list = []
    most = []
    finish = TensorRecipe.finish

    def counted(self, out, flip):
        most.append(sum(r() is not None for r in live))
        images = finish(self, out, flip)
        live.append(weakref.ref(images))
        return images

    monkeypatch.setattr(TensorRecipe, "finish", counted)
    ld = Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cpu", **KW)
    n = 0
    with ld:
        for images, labels in ld:
            n += 1
    assert n == len(most) > 2 and max(most) <= 1


def test_collate_fn_does_not_wait_for_the_device_labels(lmdb_dir, monkeypatch):
    """labels.tolist() of a CUDA tensor synchronises the host: the samples' targets come
    from the labels' host copy."""
    def collate(batch):
        return torch.stack([img for img, _ in batch]), torch.tensor([t for _, t in batch])

    with Loader(lmdb_dir, "train", TRAIN, collate_fn=collate, **KW) as ld:
        want = next(iter(ld))[1]

    def no_tolist(self):
        raise AssertionError("tolist() of a device tensor")

    monkeypatch.setattr(torch.Tensor, "tolist", no_tolist)
    with Loader(lmdb_dir, "train", TRAIN, decode="gpu", device="cpu", collate_fn=collate,
                **KW) as ld:
        images, labels = next(iter(ld))
    assert torch.equal(labels, want) and images.shape == (6, 3, 64, 64)


def test_the_workers_get_the_gathering_without_torch_or_device_state():
    import pickle

    from seqloader.dataflow.gpugather import GatherMode

    mode = GPUMode(GPUOptions(gray=True), torch.device("cpu"))
    back = pickle.loads(pickle.dumps(mode))
    assert type(back) is GatherMode and back.options == mode.options and back.keeps_inputs
    assert not hasattr(back, "jpeg") and back.stats is None
