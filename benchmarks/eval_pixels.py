"""Evaluation recipe: pixels and cost of the fused path's ``eval_mode``s, A/B in one run.

On synthetic detailed photos (synth's textured images + fine noise, JPEG q90; sizes
ImageNet-like, ``--large`` of them 900x1200), one thread, ``cv2.setNumThreads(1)``:

  exact        ``compile_fused(Resize(256), CenterCrop(224), ToTensor(), Normalize)``
  approximate  the same with ``eval_mode="approximate"`` (crop box rounded, DCT-scaled decode)
  unfused      ``decode_rgb`` + the Compose itself

timed in alternation (``--repeat`` rounds, each method over every image), and the mean
absolute difference in grey levels (uint8 outputs) of each fused mode from the unfused
transforms, and of the unfused transforms from PIL's bilinear resize + torchvision's
crop rounding on the same decoded array (when Pillow is installed).

    python benchmarks/eval_pixels.py [--images 100] [--large 0.1] [--repeat 5]
"""
from __future__ import annotations

import argparse
import time

import cv2
import numpy as np

from seqloader.tools.synth_draw import make_image
from seqloader.transforms import (CenterCrop, Compose, Normalize, Resize, ToTensor,
                                  compile_fused, decode_rgb)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = [(375, 500), (500, 375), (333, 500), (375, 500), (500, 333)]


def photo(h: int, w: int, seed: int) -> bytes:
    rng = np.random.default_rng([seed, h, w])
    img = make_image(rng, seed % 10, 10, h, w).astype(np.float32)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    return cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                        [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()


def pil_ref(img: np.ndarray, size: int = 256, crop: int = 224) -> np.ndarray | None:
    try:
        from PIL import Image
    except ImportError:
        return None
    h, w = img.shape[:2]
    short, long = min(h, w), max(h, w)
    nw, nh = (size, int(size * long / short)) if w <= h else (int(size * long / short), size)
    im = Image.fromarray(img).resize((nw, nh), Image.BILINEAR, reducing_gap=None)
    top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    return np.asarray(im.crop((left, top, left + crop, top + crop)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--large", type=float, default=0.1, help="share of 900x1200 photos")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    cv2.setNumThreads(1)
    n_large = int(round(a.images * a.large))
    shapes = [(900, 1200)] * n_large + [SIZES[i % 5] for i in range(a.images - n_large)]
    jpegs = [photo(h, w, i) for i, (h, w) in enumerate(shapes)]
    recipe = Compose([Resize(256), CenterCrop(224), ToTensor(), Normalize(MEAN, STD)])
    geo = Compose(recipe.transforms[:2])
    pipes = {m: compile_fused(recipe, eval_mode=m) for m in ("exact", "approximate")}
    outs = {m: np.empty(p.out_shape, p.out_dtype) for m, p in pipes.items()}
    methods = {m: (lambda d, p=p, o=outs[m]: p(d, o)) for m, p in pipes.items()}
    methods["unfused"] = lambda d: recipe(decode_rgb(d))
    times = {m: [] for m in methods}
    for fn in methods.values():  # warm-up
        fn(jpegs[0])
    for _ in range(a.repeat):
        for m, fn in methods.items():
            t = time.perf_counter()
            for d in jpegs:
                fn(d)
            times[m].append((time.perf_counter() - t) / len(jpegs))
    dist = {m: [] for m in pipes}
    pil = []
    for d in jpegs:
        img = decode_rgb(d)
        ref = geo(img)
        for m, p in pipes.items():
            u8 = compile_fused(p, output="uint8")
            o = np.empty(u8.out_shape, u8.out_dtype)
            u8(d, o)
            dist[m].append(np.abs(o.astype(np.int16) - ref).mean())
        r = pil_ref(img)
        if r is not None:
            pil.append(np.abs(ref.astype(np.int16) - r).mean())
    print(f"{a.images} detailed photos ({n_large} of 900x1200), {a.repeat} alternating rounds")
    base = np.median(times["approximate"])
    for m, ts in times.items():
        print(f"  {m:<12} {1e3 * np.median(ts):6.3f} ms/image (median of rounds; "
              f"{np.median(ts) / base:.3f}x approximate)")
    for m, v in dist.items():
        print(f"  {m:<12} vs unfused: mean {np.mean(v):.2f} grey levels, worst image {np.max(v):.2f}")
    if pil:
        print(f"  unfused vs PIL (same array): mean {np.mean(pil):.2f}, worst image {np.max(pil):.2f}")


if __name__ == "__main__":
    main()
