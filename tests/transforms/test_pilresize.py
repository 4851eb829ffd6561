"""interpolation="pil-bilinear": Pillow's bilinear resample, bit for bit (NOTE [ exact PIL
bilinear ] in seqloader/transforms/pilresize.py), through the unfused and fused transforms."""
from __future__ import annotations

import numpy as np
import pytest
from test_eval_pixels import detailed_jpeg
from test_transforms import _run

from seqloader.transforms import (CenterCrop, Compose, RandomResizedCrop, Resize, compile_fused,
                                  decode_rgb)
from seqloader.transforms.pilresize import pil_coeffs, pil_resize, pil_resize_top

Image = pytest.importorskip("PIL.Image")


def _pil(img: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """Pillow's resize, one axis at a time: horizontal, then vertical (the order every
    Pillow up to 12 uses for both at once; Pillow 13 may run vertical first when the
    height shrinks much more, see :func:`pil_resize`)."""
    im = Image.fromarray(img)
    if ow != img.shape[1]:
        im = im.resize((ow, img.shape[0]), Image.BILINEAR, reducing_gap=None)
    if oh != img.shape[0]:
        im = im.resize((ow, oh), Image.BILINEAR, reducing_gap=None)
    return np.asarray(im)


#: (h, w) -> (out_h, out_w): Resize(256) of ImageNet-like photos, odd sizes, strong
#: shrinks, RandomResizedCrop-like crops -> 224, upscales (2 taps), one axis only, 1 px
CASES = [((375, 500), (256, 341)), ((500, 375), (341, 256)), ((333, 500), (256, 384)),
         ((900, 1200), (256, 341)), ((301, 257), (224, 224)), ((119, 403), (224, 224)),
         ((77, 100), (256, 332)), ((37, 251), (224, 224)), ((375, 500), (375, 341)),
         ((375, 500), (128, 500)), ((1, 1), (3, 5)), ((7, 5), (1, 1)), ((999, 777), (91, 63))]


@pytest.mark.parametrize("src,dst", CASES)
def test_pil_resize_is_pillows_resample(src, dst):
    img = decode_rgb(detailed_jpeg(*src, seed=src[0] + dst[1])) if min(src) > 16 else (
        np.random.default_rng(1).integers(0, 256, src + (3,), np.uint8))
    ref = _pil(img, *dst)
    out = pil_resize(img, *dst)
    assert out.shape == ref.shape and np.array_equal(out, ref), (src, dst)
    one = np.asarray(Image.fromarray(img).resize(dst[::-1], Image.BILINEAR))
    assert np.abs(one.astype(np.int16) - out).mean() < 0.5  # any Pillow's pass order
    grey = pil_resize(np.ascontiguousarray(img[..., 1]), *dst)  # HW and HWC agree
    assert np.array_equal(grey, out[..., 1])


def test_coefficients_and_input_checks():
    idx, k = pil_coeffs(500, 341)
    assert idx.shape[1] == 3 and np.all(np.abs(k.sum(axis=1) - (1 << 22)) <= 2)
    assert pil_coeffs(500, 341)[0] is idx and not k.flags.writeable  # cached, shared
    up_idx, up_k = pil_coeffs(100, 333)
    assert up_idx.shape[1] == 2 and (up_k >= 0).all()  # upscaling: one tap each side
    with pytest.raises(ValueError, match="uint8"):
        pil_resize(np.zeros((4, 4, 3), np.float32), 2, 2)
    with pytest.raises(ValueError, match=r"\(0, 2\)"):
        pil_resize(np.zeros((4, 4, 3), np.uint8), 0, 2)


def test_top_rows_equal_the_whole_images():
    img = np.random.default_rng(3).integers(0, 256, (601, 433, 3), np.uint8)
    for oh, ow in ((256, 184), (500, 360), (700, 505)):
        whole = pil_resize(img, oh, ow)
        for cut in (300, 301, 457):
            top = pil_resize_top(img[:cut], 601, oh, ow)
            assert 0 < len(top) < oh and np.array_equal(top, whole[:len(top)])
            assert len(top) >= int(oh * (cut - 4) / 601) - 2  # all but the filter's reach


def test_fused_training_path_equals_the_unfused_transforms():
    """No reduced decode nor in-place warp for pil-bilinear: the fused RandomResizedCrop
    renders the unfused crop + resize exactly."""
    recipe = Compose([RandomResizedCrop(224, interpolation="pil-bilinear")])
    pipe = compile_fused(recipe, output="uint8")
    for i, (h, w) in enumerate([(375, 500), (500, 375), (900, 1200)]):
        data = detailed_jpeg(h, w, 70 + i)
        for seed in range(3):
            want = recipe(decode_rgb(data), rng=np.random.default_rng(seed))
            assert np.array_equal(_run(pipe, data, seed), want), (h, w, seed)


def test_eval_recipe_is_pil_exactly():
    recipe = Compose([Resize(256, interpolation="pil-bilinear"), CenterCrop(224)])
    img = decode_rgb(detailed_jpeg(375, 500, 9))
    ref = _pil(img, 256, 341)[16:240, 58:282]  # torchvision's crop: round((341-224)/2)
    assert np.array_equal(recipe(img), ref)
