"""interpolation="bilinear" (OpenCV approximation) vs "pil-bilinear" (Pillow's resample,
bit-exact): distance to PIL and cost, resize alone and per whole transform.

On synthetic detailed photos (benchmarks/eval_pixels.py's, JPEG q90, ImageNet-like sizes),
one thread (``cv2.setNumThreads(1)``), methods timed in alternation over ``--repeat``
rounds (best round reported), in ms per image:

  resize256   the Resize(256) of the decoded photo alone
  rrc224      RandomResizedCrop(224)'s crop + resize alone (same crops for both modes)
  eval        decode_rgb + Resize(256) + CenterCrop(224) + ToTensor + Normalize (unfused)
  eval-fused  compile_fused of that recipe (exact eval mode: partial decode, top rows)
  train       compile_fused(RandomResizedCrop(224), flip, ToTensor, Normalize)

and the mean absolute difference (grey levels) of Resize(256) + CenterCrop(224) from
PIL's resize + torchvision's crop on the same decoded array.

    python benchmarks/pil_exact.py [--images 40] [--repeat 5]
"""
from __future__ import annotations

import argparse
import time

import cv2
import numpy as np
from eval_pixels import SIZES, photo, pil_ref

from seqloader.transforms import (CenterCrop, Compose, Normalize, RandomHorizontalFlip,
                                  RandomResizedCrop, Resize, ToTensor, compile_fused, decode_rgb)
from seqloader.transforms.resample import resize

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _best(fn, items, repeat: int) -> float:
    """Best of ``repeat`` rounds of ``fn`` over ``items``, ms per item."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for it in items:
            fn(it)
        best = min(best, (time.perf_counter() - t) / len(items) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cv2.setNumThreads(1)
    datas = [photo(*SIZES[i % len(SIZES)], i) for i in range(args.images)]
    imgs = [decode_rgb(d) for d in datas]
    rng = np.random.default_rng(0)
    crops = [im[i:i + h, j:j + w] for im in imgs
             for i, j, h, w in [RandomResizedCrop.get_params(im, (0.08, 1.0), (3 / 4, 4 / 3), rng)]]
    rows = {}
    for mode in ("bilinear", "pil-bilinear"):
        val = Compose([Resize(256, interpolation=mode), CenterCrop(224), ToTensor(),
                       Normalize(MEAN, STD)])
        plain = Compose(val.transforms[:2])
        train = compile_fused(Compose([RandomResizedCrop(224, interpolation=mode),
                                       RandomHorizontalFlip(), ToTensor(), Normalize(MEAN, STD)]))
        fused = compile_fused(val)
        sizes = [Resize(256).output_size(*im.shape[:2]) for im in imgs]
        out_e, out_t = (np.empty(p.out_shape, p.out_dtype) for p in (fused, train))
        trng = np.random.default_rng(1)
        rows[mode] = {
            "resize256": _best(lambda k: resize(imgs[k], *sizes[k], mode, True),
                               range(len(imgs)), args.repeat),
            "rrc224": _best(lambda c: resize(c, 224, 224, mode, True), crops, args.repeat),
            "eval": _best(lambda d: val(decode_rgb(d)), datas, args.repeat),
            "eval-fused": _best(lambda d: fused(d, out_e, trng), datas, args.repeat),
            "train": _best(lambda d: train(d, out_t, trng), datas, args.repeat),
            "to_pil": float(np.mean([np.abs(plain(im).astype(np.int16) - pil_ref(im)).mean()
                                     for im in imgs])),
        }
    keys = list(rows["bilinear"])
    print(f"{'ms/image':<12}" + "".join(f"{m:>14}" for m in rows) + f"{'ratio':>8}")
    for k in keys:
        a, b = rows["bilinear"][k], rows["pil-bilinear"][k]
        ratio = f"{b / a:8.2f}" if k != "to_pil" else ""
        print(f"{k:<12}" + f"{a:14.3f}{b:14.3f}" + ratio)


if __name__ == "__main__":
    main()
