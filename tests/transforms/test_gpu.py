"""The recipes as tensor operations (seqloader.transforms.gpu) against the fused CPU path,
one sample at a time, on CPU tensors (NOTE [ GPU pixels ])."""
import cv2
import numpy as np
import pytest
import torch

from seqloader.transforms import (CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop,
                                  Resize, compile_fused)
from seqloader.transforms.gpu import TensorRecipe, decode_jpegs


def _photo(h, w, seed):
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), np.uint8), (0, 0), 1.5)
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()


def _render(recipe_t, data, seed):
    """(CPU fused sample, tensor-recipe sample) for one JPEG, the same draw."""
    fused = compile_fused(recipe_t, reduced_decode=False)
    out = np.empty(fused.out_shape, fused.out_dtype)
    fused(data, out, np.random.default_rng(seed))
    p = fused.prepare(data, np.random.default_rng(seed)).plan
    rec = TensorRecipe(fused)
    img, = decode_jpegs([torch.frombuffer(bytearray(data), dtype=torch.uint8)], torch.device("cpu"))
    w = p.window
    rh, rw = p.resized if p.resized is not None else (0, 0)
    batch = rec.render([img], np.array([[w.y0, w.x0, w.y1, w.x1, rh, rw]]))
    got = rec.finish(batch, torch.tensor([0]) if p.flip else None)[0].permute(2, 0, 1)
    return torch.from_numpy(out).permute(2, 0, 1).float(), got.float()


@pytest.mark.parametrize("recipe", [
    Compose([RandomResizedCrop(64), RandomHorizontalFlip()]),
    Compose([Resize(72), CenterCrop(64)]),
    Compose([Resize(40), CenterCrop((64, 48))]),  # padded: zeros outside the image
    Compose([RandomResizedCrop(48, interpolation="bicubic")]),
])
def test_tensor_recipe_is_near_the_fused_full_scale_path(recipe):
    """Full-scale decode on both sides: only the resize kernels differ (OpenCV's against
    torch's antialiased interpolate), < 1 grey level mean, a few at most."""
    for seed in range(6):
        cpu, gpu = _render(recipe, _photo(120 + 17 * seed, 160 - 9 * seed, seed), seed)
        assert cpu.shape == gpu.shape
        d = (cpu - gpu).abs()
        assert d.mean() < 1.0 and d.max() <= 8, (seed, d.mean(), d.max())
        if isinstance(recipe.transforms[0], Resize) and recipe.transforms[0].size == [40]:
            assert (gpu[:, :, :8] == 0).all() and (cpu[:, :, :8] == 0).all()


def test_unknown_modes_and_dtypes_are_refused():
    fused = compile_fused(Compose([RandomResizedCrop(8, interpolation="lanczos")]))
    with pytest.raises(ValueError, match="'lanczos'"):
        TensorRecipe(fused)
    with pytest.raises(ValueError, match="dtype"):
        TensorRecipe(compile_fused(Compose([RandomResizedCrop(8)])), dtype=torch.int32)


@pytest.mark.parametrize("mode, limit", [("bilinear", 94), ("bicubic", 47)])
def test_downscales_beyond_the_antialias_kernels_limit_go_in_steps(mode, limit, monkeypatch):
    """CUDA's antialiased interpolate refuses a kernel over 48 KB of shared memory
    (bilinear beyond ~94x, bicubic beyond ~47x): such a downscale is done in steps that
    each stay below it (NOTE [ antialias limit ]), close to the one-step result."""
    import seqloader.transforms.gpu as G

    recipe = TensorRecipe(compile_fused(Compose([RandomResizedCrop(24, interpolation=mode)])))
    rng = np.random.default_rng(0)
    img = torch.from_numpy(cv2.GaussianBlur(rng.integers(0, 256, (30, 24 * 120, 3), np.uint8),
                                            (0, 0), 40)).permute(2, 0, 1).contiguous()
    calls = []
    real = G.F.interpolate

    def recorded(x, size=None, **kw):
        calls.append(max(x.shape[2] / size[0], x.shape[3] / size[1]))
        return real(x, size=size, **kw)

    monkeypatch.setattr(G.F, "interpolate", recorded)
    got = recipe.render([img], np.array([[0, 0, 30, 24 * 120, 0, 0]]))  # (120x narrower)
    assert len(calls) >= 2 and max(calls) < limit, calls
    one = real(img.unsqueeze(0).float(), size=(24, 24), mode=mode, antialias=True,
               align_corners=False)[0]
    assert (got[0] - one).abs().mean() < 1.0


def test_the_device_decoder_checks_torchvision_and_decodes_a_test_jpeg(monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fake_torchvision import FakeTorchvision

    from seqloader.errors import DeviceError
    from seqloader.transforms.gpu import JpegDecoder

    fake = FakeTorchvision("0.20.0+cu124").install(monkeypatch)
    dec = JpegDecoder(torch.device("cuda", 0))
    assert [c["device"] for c in fake.calls] == [torch.device("cuda", 0)]
    data = [torch.frombuffer(bytearray(_photo(40, 50, s)), dtype=torch.uint8) for s in (1, 2)]
    assert [tuple(x.shape) for x in dec(data)] == [(3, 40, 50)] * 2
    FakeTorchvision("0.9.0").install(monkeypatch)  # (0.9 < 0.19, not "9" > "1")
    with pytest.raises(DeviceError, match="0.19"):
        JpegDecoder(torch.device("cuda", 0))
