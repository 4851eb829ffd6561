"""seqloader.transforms: torchvision semantics, determinism, pickling, fused fast path."""
from __future__ import annotations

import math
import pickle
import shutil
import subprocess
import threading

import cv2
import numpy as np
import pytest

import seqloader.transforms as T
from seqloader.transforms import (CenterCrop, Compose, DeviceNormalize, Normalize,
                                  RandomHorizontalFlip, RandomResizedCrop, Resize, ToTensor,
                                  adapt, compile_fused, decode_rgb)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def smooth_rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth photo-like RGB image with a few sharp shapes."""
    rng = np.random.default_rng(seed)
    img = np.zeros((h, w, 3), np.float32)
    for octave, amp in ((4, 70), (16, 30), (48, 12)):
        noise = rng.standard_normal((octave, octave, 3)).astype(np.float32)
        img += cv2.resize(noise, (w, h), interpolation=cv2.INTER_CUBIC) * amp
    img = np.clip(img + 128, 0, 255).astype(np.uint8)
    for _ in range(3):
        c = (int(rng.integers(w)), int(rng.integers(h)))
        cv2.circle(img, c, int(rng.integers(5, max(6, min(h, w) // 4))),
                   [int(v) for v in rng.integers(0, 255, 3)], -1, cv2.LINE_AA)
    return img


def jpeg(img_rgb: np.ndarray, quality: int = 92) -> bytes:
    bgr = img_rgb if img_rgb.ndim == 2 else cv2.cvtColor(img_rgb, cv2.COLOR_RGB2BGR)
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


# (h, w, gray): ImageNet-typical, portrait, large photo, gray, small (upscaling)
SHAPES = [(375, 500, False), (500, 375, False), (900, 1200, False), (300, 400, True),
          (120, 90, False)]


@pytest.fixture(scope="module")
def jpegs() -> list[bytes]:
    out = []
    for n, (h, w, gray) in enumerate(SHAPES):
        img = smooth_rgb(h, w, seed=n)
        out.append(jpeg(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY) if gray else img))
    return out


def train_recipe(**kw) -> Compose:
    return Compose([RandomResizedCrop(224, **kw), RandomHorizontalFlip(), ToTensor(),
                    Normalize(MEAN, STD)])


def val_recipe(resize: int = 256, crop: int = 224, norm: bool = True) -> Compose:
    tail = [ToTensor(), Normalize(MEAN, STD)] if norm else []
    return Compose([Resize(resize), CenterCrop(crop)] + tail)


# ------------------------------------------------------------------ single transforms

def test_decode_rgb_order_and_gray():
    img = np.zeros((32, 48, 3), np.uint8)
    img[..., 0] = 200  # red in RGB
    out = decode_rgb(jpeg(img))
    assert out.shape == (32, 48, 3) and out[..., 0].mean() > 190 and out[..., 2].mean() < 10
    gray = decode_rgb(memoryview(jpeg(smooth_rgb(40, 30)[..., 1])))
    assert gray.shape == (40, 30, 3)
    assert np.array_equal(gray[..., 0], gray[..., 1]) and np.array_equal(gray[..., 0], gray[..., 2])
    with pytest.raises(ValueError, match="cannot decode"):
        decode_rgb(b"not an image")


@pytest.mark.parametrize("hw,size,max_size,expected", [
    ((375, 500), 256, None, (256, 341)), ((500, 375), 256, None, (341, 256)),
    ((100, 100), 64, None, (64, 64)), ((375, 500), [256], None, (256, 341)),
    ((375, 500), (100, 50), None, (100, 50)), ((100, 1000), 64, 300, (30, 300)),
    ((375, 500), None, 200, (150, 200)), ((333, 500), 224, None, (224, 336)),
])
def test_resize_sizes(hw, size, max_size, expected):
    img = smooth_rgb(*hw)
    assert Resize(size, max_size=max_size)(img).shape == expected + (3,)


def test_resize_values_match_numpy_reference():
    img = smooth_rgb(64, 96)
    down = Resize((32, 48))(img)  # antialiased 2x downscale == 2x2 box mean
    ref = img.reshape(32, 2, 48, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert np.abs(down - ref).max() <= 1
    up = Resize((128, 192), antialias=False)(img)
    assert np.array_equal(up, cv2.resize(img, (192, 128), interpolation=cv2.INTER_LINEAR))
    assert Resize(64)(img) is img  # already the right size: returned as is
    mixed = Resize((32, 200))(img)  # shrink rows, grow columns
    assert mixed.shape == (32, 200, 3) and abs(float(mixed.mean()) - float(img.mean())) < 2
    chw = Resize(32)(ToTensor()(img))
    assert chw.shape == (3, 32, 48) and chw.dtype == np.float32


@pytest.mark.parametrize("hw,out", [((97, 131), (40, 57)), ((96, 130), (40, 57)),
                                    ((999, 1001), (224, 224)), ((1000, 1000), (224, 224))])
def test_antialiased_downscale_of_odd_sizes_is_not_stretched(hw, out):
    """2x halvings of an odd length keep its last row/column and the final resample maps
    the output onto the source's true extent: odd sizes are as close to PIL's
    antialiased bilinear resize as even ones (dropping the odd row stretched the image:
    3.98 vs 1.12 grey levels here at 97x131, 1.66 vs 0.27 at 999 px)."""
    Image = pytest.importorskip("PIL.Image")
    img = smooth_rgb(*hw, seed=2)
    ours = Resize(out)(img).astype(np.float64)
    pil = np.asarray(Image.fromarray(img).resize(out[::-1], Image.BILINEAR), np.float64)
    err = np.abs(ours - pil).mean(axis=(1, 2))
    assert err.mean() < (1.3 if hw[0] < 200 else 0.4)
    assert err[-len(err) // 4:].mean() < err.mean() + 0.3  # no error growing to the far edge


@pytest.mark.parametrize("out", [(2000, 100), (100, 2000)])
def test_box_resize_averages_the_shrinking_axis_when_the_other_grows(out):
    """PIL's BOX averages the axis that shrinks whatever the other does; OpenCV's
    INTER_AREA only when neither axis grows (else it interpolates: aliased noise)."""
    Image = pytest.importorskip("PIL.Image")
    img = np.random.default_rng(4).integers(0, 256, (1000, 1500, 3), np.uint8)
    ours = Resize(out, interpolation="box")(img).astype(np.float64)
    pil = np.asarray(Image.fromarray(img).resize(out[::-1], Image.BOX), np.float64)
    assert ours.shape == pil.shape
    # was 57 / 50 grey levels (aliased); what is left is the growing axis, which OpenCV
    # interpolates where PIL's box samples (pure upscales differ the same way)
    assert np.abs(ours - pil).mean() < 5 and abs(ours.std() - pil.std()) < 3.5


def test_bad_inputs_and_outputs_are_named():
    """A uint8 CHW array (torchvision.io.read_image's layout) is not taken as HWC (a crop
    cut the wrong axes); a strided `out` is refused before OpenCV fails on it."""
    chw = np.zeros((3, 300, 500), np.uint8)
    with pytest.raises(ValueError, match=r"looks like CHW.*permute\(1, 2, 0\)"):
        CenterCrop(224)(chw)
    with pytest.raises(ValueError, match="1, 3 or 4 channels"):
        Resize(64)(np.zeros((300, 500, 7), np.uint8))
    fused = T.compile_fused(Compose([RandomResizedCrop(32), ToTensor()]))
    strided = np.empty((3, 32, 64), np.float32)[:, :, ::2]
    with pytest.raises(ValueError, match="not C-contiguous"):
        fused(jpeg(smooth_rgb(64, 64)), strided, np.random.default_rng(0))


def _tv_center_crop(img: np.ndarray, ch: int, cw: int) -> np.ndarray:
    """torchvision.transforms.functional.center_crop, transcribed."""
    h, w = img.shape[:2]
    if cw > w or ch > h:
        left, top = ((cw - w) // 2 if cw > w else 0), ((ch - h) // 2 if ch > h else 0)
        right, bottom = ((cw - w + 1) // 2 if cw > w else 0), ((ch - h + 1) // 2 if ch > h else 0)
        img = np.pad(img, ((top, bottom), (left, right), (0, 0)))
        h, w = img.shape[:2]
        if (h, w) == (ch, cw):
            return img
    top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
    return img[top:top + ch, left:left + cw]


@pytest.mark.parametrize("hw,size", [((10, 10), 3), ((9, 9), 4), ((11, 8), (5, 7)),
                                     ((5, 7), (8, 4)), ((5, 7), (9, 12)), ((4, 4), 4),
                                     ((375, 500), 224), ((223, 300), 224), ((1, 1), 2),
                                     ((6, 9), (7, 9)), ((6, 9), (5, 10))])
def test_center_crop_rounding_and_padding(hw, size):
    img = np.random.default_rng(0).integers(1, 255, hw + (3,), dtype=np.uint8)
    ch, cw = (size, size) if isinstance(size, int) else size
    assert np.array_equal(CenterCrop(size)(img), _tv_center_crop(img, ch, cw))


def test_flip():
    img = smooth_rgb(20, 30)
    rng = np.random.default_rng(0)
    assert np.array_equal(RandomHorizontalFlip(1.0)(img, rng), img[:, ::-1])
    assert RandomHorizontalFlip(0.0)(img, rng) is img
    chw = ToTensor()(img)
    assert np.array_equal(RandomHorizontalFlip(1.0)(chw, rng), chw[:, :, ::-1])
    flips = [RandomHorizontalFlip(0.3)(img, rng) is not img for _ in range(2000)]
    assert 0.25 < np.mean(flips) < 0.35


def test_to_tensor_and_normalize():
    img = smooth_rgb(20, 30)
    x = ToTensor()(img)
    assert x.shape == (3, 20, 30) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    assert np.array_equal(x, img.transpose(2, 0, 1).astype(np.float32) / np.float32(255))
    assert ToTensor()(img[..., 0]).shape == (1, 20, 30)
    y = Normalize(MEAN, STD)(x)
    ref = (x - np.float32(MEAN).reshape(3, 1, 1)) / np.float32(STD).reshape(3, 1, 1)
    assert y is not x and np.allclose(y, ref, atol=1e-6)
    z = x.copy()
    assert Normalize(MEAN, STD, inplace=True)(z) is z and np.allclose(z, ref, atol=1e-6)
    with pytest.raises(TypeError, match="ToTensor"):
        Normalize(MEAN, STD)(img)
    # a float HWC image was a numpy broadcasting error that named nothing
    with pytest.raises(ValueError, match=r"CHW array with 3 channel.*got shape \(20, 30, 3\) "
                                         r"-- an HWC image\? apply ToTensor first"):
        Normalize(MEAN, STD)(img.astype(np.float32))
    with pytest.raises(ValueError, match=r"got shape \(1, 20, 30\)"):
        Normalize(MEAN, STD)(x[:1])
    assert Normalize(0.5, 0.25)(x[:1]).shape == (1, 20, 30)  # one mean: any channel count
    # other dtypes are only transposed, as torchvision's ToTensor does with arrays
    assert ToTensor()(img.astype(np.int32)).dtype == np.int32


@pytest.mark.parametrize("make", [
    lambda: Resize(0), lambda: Resize(-3), lambda: CenterCrop((0, 3)), lambda: Resize(None),
    lambda: Resize((10, 20), max_size=30), lambda: Resize(256, max_size=200),
    lambda: RandomResizedCrop(224, scale=(0.9, 0.1)), lambda: RandomResizedCrop(224, ratio=(0, 1)),
    lambda: RandomHorizontalFlip(1.5), lambda: Normalize(MEAN, (1.0, 0.0, 1.0)),
    lambda: Resize(10, interpolation="hamming"),
    lambda: compile_fused(train_recipe(), output="f16"),
])
def test_bad_arguments_raise_valueerror(make):
    with pytest.raises(ValueError):
        make()


def test_interpolation_accepts_enum_like_values():
    class Mode:
        value = "bicubic"
    assert RandomResizedCrop(8, interpolation=Mode()).interpolation == "bicubic"
    assert Resize(8, interpolation="NEAREST").interpolation == "nearest"
    # PIL's constants (Image.NEAREST 0, LANCZOS 1, BILINEAR 2, BICUBIC 3, BOX 4)
    assert [Resize(8, interpolation=i).interpolation for i in (0, 1, 2, 3, 4)] == [
        "nearest", "lanczos", "bilinear", "bicubic", "box"]
    for bad in (5, True, 2.0):  # HAMMING is PIL-only; bools and floats are not modes
        with pytest.raises(ValueError, match="interpolation"):
            Resize(8, interpolation=bad)


def test_bad_images_and_arguments_are_named():
    rng = np.random.default_rng(0)
    hwc_float = rng.random((20, 30, 3), dtype=np.float32)  # HWC float: not a CHW tensor
    for t in (RandomResizedCrop(8), Resize(8), CenterCrop(8), RandomHorizontalFlip(1.0)):
        with pytest.raises(ValueError, match=r"CHW.*\(20, 30, 3\)"):
            t(hwc_float, rng)
    for dtype in (np.int32, np.bool_, np.int64):
        with pytest.raises(ValueError, match=f"dtype {np.dtype(dtype)}.*uint8"):
            Resize(8)(np.zeros((20, 30, 3), dtype), rng)
    with pytest.raises(TypeError, match="list"):
        Resize(8)([[1, 2], [3, 4]])
    chw = ToTensor()(smooth_rgb(20, 30))  # CHW float still works, and PIL-like inputs too
    assert Resize(8)(chw).shape == (3, 8, 12)

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return smooth_rgb(20, 30)
    assert Resize(8)(ArrayLike()).shape == (8, 12, 3)
    with pytest.raises(ValueError, match="size='12'"):
        RandomResizedCrop("12")
    with pytest.raises(ValueError, match="scale=0.5"):
        RandomResizedCrop(8, scale=0.5)
    x = ToTensor()(smooth_rgb(4, 5))
    assert np.allclose(Normalize(0.5, 0.25)(x), (x - 0.5) / 0.25)  # numbers broadcast
    with pytest.raises(ValueError, match="zero in float32"):
        Normalize(MEAN, [1e-50] * 3)(x)
    with pytest.raises(ValueError, match="shorter side 0 px.*max_size"):
        Resize(None, max_size=64)(np.zeros((8, 2000, 3), np.uint8))
    pipe = compile_fused(Compose([Resize(None, max_size=64), CenterCrop(32)]))
    with pytest.raises(ValueError, match="shorter side 0 px"):
        _run(pipe, jpeg(np.zeros((8, 2000, 3), np.uint8)), 0)


@pytest.mark.parametrize("hw,size", [((500, 200), (256, 256)), ((120, 300), (160, 150)),
                                     ((375, 500), (400, 300))])
def test_fused_resize_crop_that_upscales_one_axis_matches_unfused(hw, size):
    """Resize((h, w)) + CenterCrop that upscales one axis and downscales the other: the
    fused path resizes the whole image and cuts the crop (a box rounded to whole source
    pixels would shift the upscaled axis by up to half a source pixel)."""
    data = jpeg(smooth_rgb(*hw))
    recipe = Compose([Resize(size), CenterCrop(224), ToTensor()])
    pipe = compile_fused(recipe)
    assert pipe.plan(*hw, np.random.default_rng(0)).resized == size
    assert np.array_equal(_run(pipe, data, 0), recipe(decode_rgb(data), np.random.default_rng(0)))


# ------------------------------------------------------------------ RandomResizedCrop

def _tv_rrc_params(h, w, scale, ratio, rng):
    """torchvision RandomResizedCrop.get_params, transcribed (torch RNG -> numpy)."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        cw = int(round(math.sqrt(target_area * aspect)))
        chh = int(round(math.sqrt(target_area / aspect)))
        if 0 < cw <= w and 0 < chh <= h:
            return int(rng.integers(0, h - chh + 1)), int(rng.integers(0, w - cw + 1)), chh, cw
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, chh = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        chh, cw = h, int(round(h * max(ratio)))
    else:
        cw, chh = w, h
    return (h - chh) // 2, (w - cw) // 2, chh, cw


@pytest.mark.parametrize("hw", [(375, 500), (500, 375), (50, 1000), (1000, 40), (7, 9)])
def test_rrc_params_follow_torchvision(hw):
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    for seed in range(200):
        got = RandomResizedCrop.get_params(hw, scale, ratio, np.random.default_rng(seed))
        assert got == _tv_rrc_params(*hw, scale, ratio, np.random.default_rng(seed))
        i, j, h, w = got
        assert 0 <= i and 0 <= j and i + h <= hw[0] and j + w <= hw[1] and h > 0 and w > 0
        if hw == (375, 500):  # never falls back here: bounds hold up to rounding
            assert 0.08 * 0.97 <= h * w / (375 * 500) <= 1.0
            assert 3 / 4 * 0.97 <= w / h <= 4 / 3 * 1.03


def test_rrc_fallback_is_central_crop():
    rng = np.random.default_rng(0)
    assert RandomResizedCrop.get_params((100, 1000), (2.0, 3.0), (3 / 4, 4 / 3), rng) == \
        (0, (1000 - 133) // 2, 100, 133)
    assert RandomResizedCrop.get_params((300, 300), (2.0, 3.0), (3 / 4, 4 / 3), rng) == \
        (0, 0, 300, 300)


def test_rrc_output_and_reproducibility():
    img = smooth_rgb(375, 500)
    t = RandomResizedCrop((100, 120))
    a = t(img, np.random.default_rng(5))
    assert a.shape == (100, 120, 3) and a.dtype == np.uint8
    assert np.array_equal(a, t(img, np.random.default_rng(5)))
    i, j, h, w = t.get_params(img, t.scale, t.ratio, np.random.default_rng(5))
    assert np.array_equal(a, Resize((100, 120))(img[i:i + h, j:j + w]))


# ------------------------------------------------------------------ Compose, pickling

class _Recorder:
    accepts_rng = True

    def __init__(self):
        self.seen = []

    def __call__(self, img, rng=None):
        self.seen.append(rng)
        return img


def test_compose_passes_rng_and_is_deterministic():
    rec, plain = _Recorder(), []
    t = Compose([rec, lambda im: plain.append(1) or im])
    rng = np.random.default_rng(0)
    t(np.zeros((4, 4, 3), np.uint8), rng)
    assert rec.seen == [rng] and plain == [1]
    img, recipe = smooth_rgb(375, 500), train_recipe()
    a = recipe(img, np.random.default_rng(1))
    assert np.array_equal(a, recipe(img, np.random.default_rng(1)))
    assert not np.array_equal(a, recipe(img, np.random.default_rng(2)))
    T.seed_default(3)
    b = recipe(img)
    T.seed_default(3)
    assert np.array_equal(b, recipe(img))
    T.seed_default(None)


def test_pickle_round_trip(jpegs):
    img = smooth_rgb(375, 500)
    fused = compile_fused(train_recipe())
    out = np.empty(fused.out_shape, fused.out_dtype)
    fused(jpegs[0], out, np.random.default_rng(0))  # scratch buffers exist now
    for obj in [train_recipe(), val_recipe(), Resize(100, max_size=200), CenterCrop(5),
                DeviceNormalize(MEAN, STD), fused, adapt(np.fliplr)]:
        clone = pickle.loads(pickle.dumps(obj))
        assert repr(clone) == repr(obj)
    clone = pickle.loads(pickle.dumps(train_recipe()))
    assert np.array_equal(clone(img, np.random.default_rng(4)),
                          train_recipe()(img, np.random.default_rng(4)))
    out2 = np.empty_like(out)
    pickle.loads(pickle.dumps(fused))(jpegs[0], out2, np.random.default_rng(0))
    assert np.array_equal(out, out2)


# ------------------------------------------------------------------ fused fast path

def _run(pipe, data, seed):
    out = np.empty(pipe.out_shape, pipe.out_dtype)
    pipe(data, out, np.random.default_rng(seed))
    return out


def test_compile_fused_recognises_only_standard_recipes():
    assert compile_fused(train_recipe()).out_shape == (3, 224, 224)
    assert compile_fused(train_recipe(), output="uint8").out_shape == (224, 224, 3)
    assert compile_fused(val_recipe()).out_dtype == np.float32
    u8 = compile_fused(Compose([RandomResizedCrop((160, 128))]))
    assert u8.out_shape == (160, 128, 3) and u8.out_dtype == np.uint8
    assert compile_fused(Compose([RandomResizedCrop(8), ToTensor()])).device_normalize() is None
    for other in [Compose([CenterCrop(224), ToTensor()]), RandomResizedCrop(224),
                  Compose([RandomResizedCrop(224), ToTensor(), RandomHorizontalFlip()]),
                  Compose([RandomResizedCrop(224), Normalize(MEAN, STD)]),
                  Compose([Resize(256), ToTensor()]), Compose([]), lambda img: img]:
        assert compile_fused(other) is None


@pytest.mark.parametrize("kind", ["train", "val", "val_small"])
def test_fused_matches_unfused(jpegs, kind):
    recipe = {"train": train_recipe(), "val": val_recipe(),
              "val_small": val_recipe(128, 112)}[kind]
    pipe = compile_fused(recipe)
    diffs = {1: [], 2: []}
    for data in jpegs:
        img = decode_rgb(data)
        h, w, _ = img.shape
        for seed in range(8):
            plan = pipe.plan(h, w, np.random.default_rng(seed))
            if kind == "train":  # identical crop box and flip for the same rng state
                rng = np.random.default_rng(seed)
                i, j, ch, cw = RandomResizedCrop.get_params((h, w), (0.08, 1.0), (3 / 4, 4 / 3),
                                                            rng)
                win = plan.window
                assert (win.y0, win.x0, win.y1 - win.y0, win.x1 - win.x0) == (i, j, ch, cw)
                assert plan.flip == (rng.random() < 0.5)
            fused = _run(pipe, data, seed)
            ref = recipe(img, np.random.default_rng(seed))
            assert fused.shape == ref.shape and fused.dtype == ref.dtype
            diffs[1 if plan.k == 1 else 2].append(float(np.abs(fused - ref).mean()))
            if kind == "train" and plan.k == 1:
                assert np.array_equal(fused, ref)  # same pixels in, same arithmetic
    # units: normalised (1 grey level ~ 0.017); full decode differs only by crop rounding
    assert diffs[1] and max(diffs[1]) < 0.03
    if diffs[2]:
        assert max(diffs[2]) < 0.06 and np.mean(diffs[2]) < 0.04


def test_reduced_decode_used_only_when_allowed(jpegs):
    big, small = jpegs[2], jpegs[0]  # 1200x900, 500x375
    rng = np.random.default_rng
    approx = {"eval_mode": "approximate"}
    assert compile_fused(val_recipe(128, 112), **approx).plan(900, 1200, rng(0)).k == 4
    assert compile_fused(val_recipe(128, 112), reduced_decode=False,
                         **approx).plan(900, 1200, rng(0)).k == 1
    assert compile_fused(val_recipe(128, 112)).plan(900, 1200, rng(0)).k == 1  # exact: never
    for recipe in (val_recipe(), train_recipe()):
        pipe = compile_fused(recipe, **approx)
        assert all(pipe.plan(375, 500, rng(s)).k == 1 for s in range(100))
    pipe = compile_fused(train_recipe())
    ks = [pipe.plan(900, 1200, rng(s)) for s in range(300)]
    assert any(p.k == 2 for p in ks)
    for p in ks:  # never lowers the output resolution
        w = p.window
        assert w.x1 - w.x0 >= p.k * 224 and w.y1 - w.y0 >= p.k * 224
    no_aa = compile_fused(train_recipe(antialias=False))
    assert all(no_aa.plan(900, 1200, rng(s)).k == 1 for s in range(50))
    # reduced decode changes the pixels only slightly
    red, full = (compile_fused(val_recipe(128, 112), **approx),
                 compile_fused(val_recipe(128, 112), reduced_decode=False, **approx))
    assert np.abs(_run(red, big, 0) - _run(full, big, 0)).mean() < 0.05
    red, full = (compile_fused(val_recipe(), **approx),
                 compile_fused(val_recipe(), reduced_decode=False, **approx))
    assert np.array_equal(_run(red, small, 0), _run(full, small, 0))


def _variants(index: bool = False) -> dict[str, bytes]:
    """Sequential JPEGs of every chroma layout, with restart markers, grey, and a
    progressive one (decoded whole), at sizes that are not whole MCU rows; with
    ``index``, also each one whose markers tile it with a restart index added
    (``<name>+index``: NOTE [ restart index ])."""
    img = smooth_rgb(1001, 1337, seed=7)
    bgr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    sf = cv2.IMWRITE_JPEG_SAMPLING_FACTOR
    params = {"420": [], "422": [sf, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422],
              "444": [sf, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444],
              "restart": [cv2.IMWRITE_JPEG_RST_INTERVAL, 5],
              # restart markers at MCU-row starts (NOTE [ restart windows ]): 1337 px are
              # 84 MCUs of 16 px (4:2:0) or 168 of 8 px (4:4:4)
              "restart-row": [cv2.IMWRITE_JPEG_RST_INTERVAL, 84],
              "restart-2rows-444": [sf, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
                                    cv2.IMWRITE_JPEG_RST_INTERVAL, 2 * 168],
              # ... and every few MCUs, dividing a row's 84: columns can be left out too
              "restart-4mcu": [cv2.IMWRITE_JPEG_RST_INTERVAL, 4],
              "restart-7mcu-422": [sf, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
                                   cv2.IMWRITE_JPEG_RST_INTERVAL, 7],
              "progressive": [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]}
    # fine grain where restart windows start, so that a decoder or resampling margin
    # one row too small shows in the sample
    grain = np.random.default_rng(9).normal(0, 24, bgr.shape)
    noisy = np.clip(bgr + grain, 0, 255).astype(np.uint8)
    out = {name: cv2.imencode(".jpg", noisy if name.startswith("restart-") else bgr,
                              [cv2.IMWRITE_JPEG_QUALITY, 90] + extra)[1].tobytes()
           for name, extra in params.items()}
    gray = cv2.cvtColor(noisy, cv2.COLOR_BGR2GRAY)
    out["gray"] = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2GRAY))[1].tobytes()
    for name, interval in (("gray-restart-row", 168), ("gray-restart-6mcu", 6)):
        out[name] = cv2.imencode(".jpg", gray, [cv2.IMWRITE_JPEG_RST_INTERVAL, interval])[1].tobytes()
    out["small"] = jpeg(smooth_rgb(90, 70, seed=8))  # upscaled: the warpAffine branch
    if index:
        from seqloader.format.jpeg import add_restart_index
        indexed = {f"{n}+index": add_restart_index(d) for n, d in out.items()}
        out.update({n: d for n, d in indexed.items() if d != out[n[:-len("+index")]]})
    return out


@pytest.mark.skipif(shutil.which("cjpeg") is None, reason="needs cjpeg (libjpeg-turbo-progs)")
def test_grey_jpeg_with_sampling_factors_has_one_block_mcus():
    """A one-component scan is not interleaved: its MCU is one 8x8 block even when the
    header gives the component 2x2 sampling (cjpeg -grayscale -sample 2x2).  A 16 px MCU
    made the restart grid wrong, so such files were always decoded whole."""
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import jpeg_frame, restart_layout

    grey = smooth_rgb(301, 333, seed=3)[..., 1]
    pgm = cv2.imencode(".pgm", grey)[1].tobytes()
    data = subprocess.run(["cjpeg", "-grayscale", "-sample", "2x2", "-restart", "6B",
                           "-quality", "90"], input=pgm, capture_output=True, check=True).stdout
    frame = jpeg_frame(data)
    assert data[frame.offset + 11] == 0x22  # the header's sampling factors: 2x2
    assert (frame.mcu_height, frame.mcu_width) == (8, 8)
    buf, local = np.frombuffer(data, np.uint8), threading.local()
    full = _jw.decode_jpeg(buf, frame, 1, _jw.Region(0, 301, 0, 333), local)[0].copy()
    reg, scan = _jw.restart_window(buf, frame, 1, _jw.Region(100, 250, 120, 200), 1)
    assert scan is not None and restart_layout(frame, scan)[1] == 7  # 42 MCUs: 7 groups of 6
    img, got = _jw.decode_jpeg(buf, frame, 1, reg, local, scan)
    assert got == reg and reg.right - reg.left < 333
    assert np.array_equal(img[:, :reg.right - reg.left - 1],
                          full[reg.top:reg.bottom, reg.left:reg.right - 1])


def test_jpeg_frame_reports_mcu_rows():
    from seqloader.format.jpeg import jpeg_frame
    v = _variants()
    frames = {name: jpeg_frame(data) for name, data in v.items()}
    assert {n: f.mcu_height for n, f in frames.items()} == {
        "420": 16, "422": 8, "444": 8, "restart": 16, "restart-row": 16, "restart-2rows-444": 8,
        "restart-4mcu": 16, "restart-7mcu-422": 8, "progressive": 16, "gray": 8,
        "gray-restart-row": 8, "gray-restart-6mcu": 8, "small": 16}
    assert frames["422"].mcu_width == 16 and frames["444"].mcu_width == 8
    assert frames["progressive"].marker == 0xC2 and frames["420"].marker == 0xC0
    assert frames["420"][:3] == (1001, 1337, 3) and frames["gray"].components == 1
    off = frames["420"].offset
    assert v["420"][off:off + 2] == b"\xff\xc0"


@pytest.mark.parametrize("recipe", [
    train_recipe(),
    pytest.param(Compose([RandomResizedCrop(64), RandomHorizontalFlip()]), marks=pytest.mark.slow),
    pytest.param(Compose([RandomResizedCrop(112, interpolation="bicubic"), ToTensor()]),
                 marks=pytest.mark.slow),
    val_recipe(), val_recipe(128, 112), val_recipe(300, 288, norm=False),
    Compose([Resize(200, interpolation="lanczos"), CenterCrop(180)]),
    # upscaled (the images are 1001 px high): the box is sampled in place (warpAffine),
    # whose kernel reaches past it -- NOTE [ render reach ]
    pytest.param(Compose([Resize(1100, interpolation="lanczos"), CenterCrop(1024)]),
                 marks=pytest.mark.slow),
    Compose([Resize(1050, interpolation="bicubic"), CenterCrop((900, 1000))]),
], ids=["train224", "rrc64", "rrc112-bicubic", "val", "val128", "val-pad", "val-lanczos",
        "upscale-lanczos", "upscale-bicubic"])
def test_partial_decode_never_changes_a_pixel(recipe, capfd):
    """NOTEs [ row-limited decode ] and [ restart windows ]: stopping the decoder below
    the crop, and starting it at a restart marker above it, give exactly the full
    decode's sample, at every scale, chroma layout and resampling kernel."""
    from seqloader.format.jpeg import jpeg_frame
    approx = {"eval_mode": "approximate"}  # (the exact one: test_exact_eval_*)
    part, whole = (compile_fused(recipe, **approx),
                   compile_fused(recipe, partial_decode=False, **approx))
    stopped = started = narrowed = warped = 0
    for name, data in _variants(index=True).items():
        frame = jpeg_frame(data)
        buf = np.frombuffer(data, np.uint8)
        # (Resize + CenterCrop draws nothing: one seed says it all)
        for seed in range(12 if isinstance(recipe.transforms[0], RandomResizedCrop) else 1):
            plan = part.plan(frame.height, frame.width, np.random.default_rng(seed))
            reg, scan = part.decode_window(buf, frame, plan)
            rows = reg.bottom
            warped += part.warps(plan) and scan is not None
            if "restart" in name:  # (large images: only the upscales sample in place)
                assert part.warps(plan) == (np.max(recipe.transforms[0].size) > 1000)
            stopped += rows < frame.height
            started += reg.top > 0
            narrowed += reg.right - reg.left < frame.width
            if name == "progressive":
                assert rows == frame.height
            if "restart-" not in name:
                assert reg == (0, rows, 0, frame.width), name  # no markers: from the top
            assert np.array_equal(_run(part, data, seed), _run(whole, data, seed)), (name, seed)
    if isinstance(recipe.transforms[0], RandomResizedCrop):
        assert stopped > 24  # many random crops end well above the bottom
        assert started > 12  # and start well below the top
        assert narrowed > 6  # and leave columns out where the markers allow it
    elif np.max(recipe.transforms[0].size) > 1000:  # upscales: sampled in place, which a
        # window would shift (NOTE [ render reach ]): rows from the top, stopped below
        assert warped == 0 and started == 0 and narrowed == 0 and stopped >= 6
    assert capfd.readouterr().err == ""  # the skipped tail is not reported as corrupt data


@pytest.mark.parametrize("reach", [1, pytest.param(6, marks=pytest.mark.slow)],
                         ids=["slice-reach", "warp-reach"])
def test_restart_window_matches_full_decode(reach):
    """NOTE [ restart windows ]: a decode of the restart segments around a crop equals
    the full decode from ``reach`` decoded px outside the crop inwards (NOTE [ render
    reach ]) -- for crops starting on, just before and just after every kind of segment
    boundary, at every scale."""
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import jpeg_frame
    local = threading.local()
    checked = narrowed = 0
    variants = _variants(index=True)
    assert sum(n.endswith("+index") for n in variants) == 6  # the ones whose markers tile
    for name, data in variants.items():
        if "restart-" not in name:
            continue
        buf, frame = np.frombuffer(data, np.uint8), jpeg_frame(data)
        for k in (1, 2, 4, 8):
            full = _jw.decode_jpeg(buf, frame, k, _jw.Region(0, frame.height, 0, frame.width),
                                   local)[0].copy()
            for d in (-1, 0, 1, 6, 7, 12, 13, 24, 25, 48, 49):
                y0, x0, x1 = 48 + d, 64 + d, 960 + d
                want = _jw.Region(y0, 800, x0, x1)
                reg, scan = _jw.restart_window(buf, frame, k, want, reach)
                if scan is None:
                    continue
                img, got = _jw.decode_jpeg(buf, frame, k, reg, local, scan)
                assert got == reg and reg.top % frame.mcu_height == 0
                assert reg.left % frame.mcu_width == 0 and reg.right >= x1
                narrowed += reg.right - reg.left < frame.width
                # decoded rows/columns the render may read, minus the bottom MCU row
                # (decoded_rows()'s margin) and the right edge's SPLICE_EDGE decoded px
                # of chroma context (when it is not the image's edge)
                t, l = (y0 - reach * k) // k, (x0 - reach * k) // k
                e = _jw.SPLICE_EDGE  # decoded px a spliced edge changes
                assert reg.top == 0 or reg.top // k <= t - e
                assert reg.left == 0 or reg.left // k <= l - e
                b = (800 - frame.mcu_height) // k
                r = -(-reg.right // k) - (e if reg.right < frame.width else 0)
                assert r >= -(-(x1 + reach * k) // k)
                sub = img[t - reg.top // k:b - reg.top // k, l - reg.left // k:r - reg.left // k]
                assert np.array_equal(sub, full[t:b, l:r]), (name, k, d)
                checked += 1
    assert checked > 200 and narrowed > 100


def test_partial_decode_same_samples_without_simplejpeg(monkeypatch):
    """Without simplejpeg every image is decoded whole by OpenCV: same samples."""
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import jpeg_frame
    data = _variants()["420"]
    pipe = compile_fused(train_recipe())
    want = [_run(pipe, data, s) for s in range(6)]
    monkeypatch.setattr(_jw, "simplejpeg", None)
    frame = jpeg_frame(data)
    assert _jw.decoded_rows(frame, 1, 10.0) == frame.height
    assert all(np.array_equal(_run(pipe, data, s), w) for s, w in enumerate(want))


def test_partial_decode_survives_damaged_and_odd_jpegs():
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import jpeg_frame
    data = _variants()["420"]
    pipe = compile_fused(Compose([RandomResizedCrop(64)]))
    with pytest.raises(ValueError, match="cannot decode JPEG"):
        _run(pipe, data[:400], 0)  # headers only: nothing to decode
    damaged = bytearray(data)
    damaged[len(data) // 2:len(data) // 2 + 64] = bytes(64)  # corrupt entropy data
    out = _run(pipe, bytes(damaged), 0)  # decodes with warnings, like OpenCV
    assert out.shape == (64, 64, 3)
    frame = jpeg_frame(data)
    img, reg = _jw.decode_jpeg(np.frombuffer(data, np.uint8), frame, 2,
                               _jw.Region(0, 64, 0, frame.width), threading.local())
    assert reg == (0, 64, 0, frame.width) and img.shape == (32, -(-frame.width // 2), 3)


def test_uint8_output_equals_float_before_normalisation(jpegs):
    f32 = compile_fused(train_recipe())
    u8 = compile_fused(train_recipe(), output="uint8")
    dn = u8.device_normalize()
    assert isinstance(dn, DeviceNormalize) and dn.mean == MEAN
    for data in jpegs:
        for seed in range(3):
            a, b = _run(u8, data, seed), _run(f32, data, seed)
            assert np.array_equal(Normalize(MEAN, STD)(ToTensor()(a)), b)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bicubic", "box", "lanczos"])
def test_fused_other_interpolations(jpegs, mode):
    recipe = Compose([RandomResizedCrop(160, interpolation=mode), RandomHorizontalFlip()])
    assert compile_fused(recipe).can_reduce == (mode not in ("nearest", "nearest-exact"))
    pipe = compile_fused(recipe, reduced_decode=False)
    img = decode_rgb(jpegs[0])
    for seed in range(4):  # full decode: exactly the unfused pixels
        assert np.array_equal(_run(pipe, jpegs[0], seed), recipe(img, np.random.default_rng(seed)))


def test_exif_orientation_is_ignored():
    from PIL import Image
    import io

    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW" - PIL (torchvision's loader) does not apply it
    buf = io.BytesIO()
    Image.fromarray(smooth_rgb(60, 100)).save(buf, "JPEG", exif=exif.tobytes())
    assert decode_rgb(buf.getvalue()).shape == (60, 100, 3)
    pipe = compile_fused(Compose([Resize(30), CenterCrop(30)]))
    assert _run(pipe, buf.getvalue(), 0).shape == (30, 30, 3)


def test_fused_is_thread_safe(jpegs):
    from concurrent.futures import ThreadPoolExecutor

    pipe = compile_fused(train_recipe())
    jobs = [(data, seed) for seed in range(4) for data in jpegs]
    expected = [_run(pipe, data, seed) for data, seed in jobs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda job: _run(pipe, *job), jobs))
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_fused_gray_padding_png_and_errors(jpegs):
    gray = _run(compile_fused(train_recipe(), output="uint8"), jpegs[3], 0)
    assert np.array_equal(gray[..., 0], gray[..., 1]) and np.array_equal(gray[..., 1], gray[..., 2])
    # Resize(100) -> 100x133, CenterCrop(128) pads rows; flip p=1 mirrors the padded image
    recipe = Compose([Resize(100), CenterCrop(128), RandomHorizontalFlip(1.0), ToTensor(),
                      Normalize(MEAN, STD)])
    pipe = compile_fused(recipe)
    img = decode_rgb(jpegs[0])
    ref, got = recipe(img, np.random.default_rng(0)), _run(pipe, memoryview(jpegs[0]), 0)
    assert np.array_equal(got[:, :14], ref[:, :14])  # zero padding, normalised
    assert np.abs(got - ref).mean() < 0.03
    ok, png = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    u8 = compile_fused(train_recipe(), output="uint8")
    assert np.array_equal(_run(u8, png.tobytes(), 1), _run(u8, jpegs[0], 1))
    with pytest.raises(ValueError, match="cannot decode"):
        _run(u8, b"garbage", 0)
    with pytest.raises(ValueError, match="shape"):
        u8(jpegs[0], np.empty((3, 224, 224), np.float32), np.random.default_rng(0))


# ------------------------------------------------------------------ device, interop

def test_device_normalize_cpu_equals_normalize():
    torch = pytest.importorskip("torch")
    imgs = [smooth_rgb(24, 32, seed=s) for s in range(3)]
    batch = torch.from_numpy(np.stack(imgs))
    out = DeviceNormalize(MEAN, STD)(batch)
    assert out.shape == (3, 3, 24, 32) and out.dtype == torch.float32
    assert out.is_contiguous(memory_format=torch.channels_last)
    ref = np.stack([Normalize(MEAN, STD)(ToTensor()(im)) for im in imgs])
    assert np.allclose(out.numpy(), ref, atol=1e-5)
    assert torch.equal(pickle.loads(pickle.dumps(DeviceNormalize(MEAN, STD)))(batch), out)


class FakeTV:
    """Looks like a torchvision transform to ``adapt`` (module name only)."""

    def __init__(self, result="pil"):
        self.result = result

    def __call__(self, img):
        from PIL import Image
        assert isinstance(img, Image.Image) and img.mode == "RGB"
        if self.result == "torch":
            import torch
            return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        return img.transpose(Image.FLIP_LEFT_RIGHT)


FakeTV.__module__ = "torchvision.transforms.transforms"


def test_adapt():
    img = smooth_rgb(10, 12)
    t = RandomHorizontalFlip()
    assert adapt(t) is t
    assert np.array_equal(adapt(lambda im: im[::-1].tolist())(img, None), img[::-1])
    assert np.array_equal(adapt(FakeTV())(img, np.random.default_rng(0)), img[:, ::-1])
    pytest.importorskip("torch")
    assert np.array_equal(adapt(FakeTV("torch"))(img, None), img.transpose(2, 0, 1))
    import torch
    assert np.array_equal(adapt(lambda im: torch.from_numpy(im) * 1)(img, None), img)


def test_compile_fused_converts_torchvision_v1_recipes():
    def fake(name, **attrs):
        cls = type(name, (), {})
        cls.__module__ = "torchvision.transforms.transforms"
        obj = cls()
        obj.__dict__.update(attrs)
        return obj

    class Mode:
        value = "bilinear"
    tv = fake("Compose", transforms=[
        fake("RandomResizedCrop", size=(224, 224), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
             interpolation=Mode(), antialias=True),
        fake("RandomHorizontalFlip", p=0.5), fake("ToTensor"),
        fake("Normalize", mean=list(MEAN), std=list(STD), inplace=False)])
    assert compile_fused(tv).out_shape == (3, 224, 224)
    tv.transforms.append(fake("ColorJitter"))
    assert compile_fused(tv) is None


def test_real_torchvision_interop(jpegs):
    try:
        tv = pytest.importorskip("torchvision.transforms")
    except pytest.skip.Exception:
        raise
    except Exception as exc:  # installed but broken (e.g. C ops fail to load)
        pytest.skip(f"torchvision not usable: {exc}")
    img = decode_rgb(jpegs[0])
    recipe = tv.Compose([tv.Resize(256), tv.CenterCrop(224), tv.ToTensor(),
                         tv.Normalize(MEAN, STD)])
    ours = val_recipe()(img)
    theirs = adapt(recipe)(img, np.random.default_rng(0))
    assert theirs.shape == ours.shape and np.abs(theirs - ours).mean() < 0.03
    pipe = compile_fused(recipe)
    assert pipe is not None and np.abs(_run(pipe, jpegs[0], 0) - ours).mean() < 0.03


def test_restart_windows_survive_damaged_markers():
    """A JPEG whose restart markers are not where its header says (a marker overwritten,
    bytes cut out) is decoded whole instead (with libjpeg's warnings, like any damaged
    JPEG), or fails with the usual error -- never a crash or a hang."""
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import jpeg_frame, jpeg_scan
    data = _variants()["restart-4mcu"]
    frame = jpeg_frame(data)
    scan = jpeg_scan(data, frame)
    body = np.frombuffer(data, np.uint8)[scan.offset:]
    marks = np.flatnonzero((body[:-1] == 0xFF) & (body[1:] >= 0xD0) & (body[1:] <= 0xD7))
    one_gone = bytearray(data)
    one_gone[scan.offset + marks[len(marks) // 2]] = 0x00  # one marker less
    cut = data[:scan.offset + marks[100]] + data[scan.offset + marks[300]:]  # segments lost
    pipe = compile_fused(Compose([RandomResizedCrop(64, scale=(0.05, 0.2))]))
    windows = 0
    for damaged in (bytes(one_gone), cut):
        buf = np.frombuffer(damaged, np.uint8)
        assert _jw._splice(buf, frame, scan, _jw.Region(320, 640, 256, 768)) is None
        for seed in range(10):
            plan = pipe.plan(frame.height, frame.width, np.random.default_rng(seed))
            reg, _ = pipe.decode_window(buf, frame, plan)
            windows += reg.top > 0 or reg.right - reg.left < frame.width
            try:
                out = _run(pipe, damaged, seed)
            except ValueError as e:
                assert "cannot decode JPEG" in str(e)
            else:
                assert out.shape == (64, 64, 3)
    assert windows > 0  # the windows were tried (and given up on)


def test_restart_index_is_used_and_a_wrong_one_is_not_trusted():
    """NOTE [ restart index ]: the index adds no pixels, lists exactly the markers a scan
    finds, is left out of spliced copies, and where it disagrees with the data (here two
    segment lengths swapped: the same count and total) the markers are found by
    scanning -- same samples as a full decode."""
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import (_INDEX_TAG, add_restart_index, indexed_marks, jpeg_frame,
                                           jpeg_scan, restart_marks)
    data = _variants()["restart-4mcu"]
    indexed = add_restart_index(data)
    frame, buf = jpeg_frame(indexed), np.frombuffer(indexed, np.uint8)
    scan = jpeg_scan(indexed, frame)
    marks = restart_marks(buf[scan.offset:])
    assert len(marks) == 63 * 21 - 1  # 63 rows of 16 px x 21 groups of 4 MCUs
    assert len(indexed) == len(data) + 4 + len(_INDEX_TAG) + 2 * len(marks)
    assert np.array_equal(indexed_marks(buf, scan), marks)
    assert add_restart_index(indexed) is indexed and add_restart_index(_variants()["420"]) is not None
    assert np.array_equal(cv2.imdecode(buf, cv2.IMREAD_COLOR),
                          cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR))
    spliced = _jw._splice(buf, frame, scan, _jw.Region(320, 640, 256, 768))
    assert _INDEX_TAG not in spliced.tobytes()
    # two neighbouring lengths swapped, inside the rows crops use
    at = scan.index[0] + 4 + len(_INDEX_TAG) + 2 * (21 * 30 + 5)
    wrong = bytearray(indexed)
    wrong[at:at + 2], wrong[at + 2:at + 4] = indexed[at + 2:at + 4], indexed[at:at + 2]
    assert bytes(wrong) != indexed
    pipe = compile_fused(Compose([RandomResizedCrop(64, scale=(0.05, 0.3))]))
    whole = compile_fused(Compose([RandomResizedCrop(64, scale=(0.05, 0.3))]), partial_decode=False)
    spliced_rows = 0
    for seed in range(40):
        plan = pipe.plan(frame.height, frame.width, np.random.default_rng(seed))
        reg, _ = pipe.decode_window(buf, frame, plan)
        spliced_rows += reg.top // 16 <= 30 < reg.bottom // 16
        want = _run(whole, data, seed)
        assert np.array_equal(_run(pipe, indexed, seed), want), seed
        assert np.array_equal(_run(pipe, bytes(wrong), seed), want), seed
    assert spliced_rows >= 5  # crops that use the swapped segments' row
    # a damaged index segment (an odd number of bytes) or one too short is ignored
    for body in (b"\x01\x02\x03", b"\x10\x00" * 7):
        payload = _INDEX_TAG + body
        seg = b"\xff\xef" + (len(payload) + 2).to_bytes(2, "big") + payload
        odd = data[:jpeg_scan(data, frame).sos] + seg + data[jpeg_scan(data, frame).sos:]
        oscan = jpeg_scan(odd, frame)
        assert oscan.index != (0, 0)
        assert len(body) % 2 or len(indexed_marks(np.frombuffer(odd, np.uint8), oscan)) == 7
        assert all(np.array_equal(_run(pipe, odd, seed), _run(whole, data, seed)) for seed in range(8))


def test_opencv_reads_nothing_outside_a_slice():
    """NOTE [ render reach ]: the render hands OpenCV the crop as a numpy slice of the
    decoded image; OpenCV must treat it as an image of its own (border modes replicate
    the slice's edge) -- else the 1-px margin around a cut-out box would not hold."""
    import cv2

    from seqloader.transforms import resample as _resample
    rng = np.random.default_rng(3)
    big = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    view = big[40:250, 50:330]
    copy = view.copy()
    taps = np.array([0.2, 0.6, 0.2], np.float32)
    assert np.array_equal(cv2.sepFilter2D(view, -1, taps, taps, borderType=cv2.BORDER_REPLICATE),
                          cv2.sepFilter2D(copy, -1, taps, taps, borderType=cv2.BORDER_REPLICATE))
    for mode in ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "lanczos"):
        for size in ((64, 64), (100, 90), (224, 224), (400, 500)):
            assert np.array_equal(_resample.resize(view, *size, mode, True),
                                  _resample.resize(copy, *size, mode, True)), (mode, size)


def test_only_fractional_upscales_are_sampled_in_place():
    """NOTE [ render reach ]: RandomResizedCrop's boxes are whole pixels -- also the
    many that are upscaled on ImageNet-sized images -- so they are cut out (and keep
    their restart windows); a Resize larger than the image puts the box on fractional
    pixels, which warpAffine samples in place."""
    rrc = compile_fused(train_recipe())
    up = 0
    for seed in range(50):
        p = rrc.plan(375, 500, np.random.default_rng(seed))
        up += p.window.y1 - p.window.y0 < 224
        assert not rrc.warps(p)
    assert up > 5  # upscaled crops were among them
    val = compile_fused(Compose([Resize(400), CenterCrop(380)]), eval_mode="approximate")
    assert val.warps(val.plan(375, 500, np.random.default_rng(0)))
    shrink = compile_fused(val_recipe(), eval_mode="approximate")  # Resize(256): cut out
    assert not shrink.warps(shrink.plan(375, 500, np.random.default_rng(0)))


@pytest.mark.slow
def test_stopped_decode_margin_is_exact():
    """NOTE [ row-limited decode ]: a decode stopped at ``decoded_rows()`` equals the
    full decode in every decoded row the render may read (``reach`` below the crop), for
    crops ending at every residue of the MCU height, at every scale and chroma layout.
    (The margin is one decoded row: without it -- mutation-checked -- the last row of a
    4:2:0 image stopped on a row the render reads differs.)"""
    from seqloader.transforms import jpegwindow as _jw
    from seqloader.format.jpeg import jpeg_frame
    local = threading.local()
    checked = 0
    for name, data in _variants().items():
        buf, frame = np.frombuffer(data, np.uint8), jpeg_frame(data)
        if name in ("progressive", "small"):
            continue
        for k in (1, 2, 4, 8):
            full = _jw.decode_jpeg(buf, frame, k, _jw.Region(0, frame.height, 0, frame.width),
                                   local)[0].copy()
            for reach in (_jw.SLICE_REACH, _jw.WARP_REACH):
                for y1 in range(300, 300 + 2 * frame.mcu_height):
                    rows = _jw.decoded_rows(frame, k, y1, reach)
                    assert rows % frame.mcu_height == 0 and rows < frame.height
                    img = _jw.decode_jpeg(buf, frame, k, _jw.Region(0, rows, 0, frame.width),
                                          local)[0]
                    read = -(-y1 // k) + reach  # decoded rows the render may read
                    assert np.array_equal(img[:read], full[:read]), (name, k, reach, y1)
                    checked += 1
    assert checked > 1000
