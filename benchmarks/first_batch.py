"""Time to the first batch in a fresh process, warm (imports done, data in the page
cache): the figure of issue 39 ("the first batch in half a second").

    python benchmarks/first_batch.py DB_DIR [--transform fused|cv2] [--workers 2]
        [--batch-size 256] [--epochs N] [--out FILE]

Appends one JSON line to ``--out`` (or prints it): the seconds from ``iter(loader)`` to
the first batch, measured outside the Loader, and what the Loader's ``stats()`` says
(``first_batch_s``; absent on a checkout without ``stats()``).  ``fused``: the train
recipe (RandomResizedCrop(224), flip, ToTensor, Normalize: the fused path); ``cv2``: a
plain transform (``cv2.resize`` to 224 x 224, CHW float32).  A/B against another
checkout with ``farm-bench``, ``PYTHONPATH`` pointing at each (benchmarks/RESULTS.md).
With ``--epochs N`` it then runs the rest of N whole epochs and adds their images/s
(from the first batch on): the throughput A/B, whose CPU per image is farm-bench's
``cpu`` over the same images.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import cv2
import numpy as np

import seqloader.transforms as T
from seqloader import Loader


def plain_cv2(img):
    """A plain (not fused) transform: resize to 224 x 224, CHW float32 in [0, 1]."""
    return cv2.resize(img, (224, 224)).transpose(2, 0, 1).astype(np.float32) / 255


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", help="a database folder or file")
    ap.add_argument("--split", default="train")
    ap.add_argument("--transform", choices=("fused", "cv2"), default="fused")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=0, help="whole epochs to run (0: none)")
    ap.add_argument("--out", help="append the JSON line to this file (default: print it)")
    a = ap.parse_args()
    tf = (T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                     T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
          if a.transform == "fused" else plain_cv2)
    loader = Loader(a.db, a.split, tf, batch_size=a.batch_size, shuffle=True,
                    num_workers=a.workers, cache=1000, world_size=1, rank=0)
    t = time.perf_counter()
    it = iter(loader)  # (kept: dropping it would cancel the epoch inside the timing)
    next(it)
    row = {"transform": a.transform, "workers": a.workers, "batch_size": a.batch_size,
           "first_batch_s": round(time.perf_counter() - t, 3)}
    stats = getattr(loader, "stats", None)
    if stats is not None:
        row["stats_first_batch_s"] = stats().get("first_batch_s")
    if a.epochs:
        t, n = time.perf_counter(), sum(len(y) for _, y in it)
        for _ in range(a.epochs - 1):
            n += sum(len(y) for _, y in loader)
        row["images_per_s"] = round(n / (time.perf_counter() - t), 1)
    loader.close()
    line = json.dumps(row)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    else:
        print(line, file=sys.stdout)


if __name__ == "__main__":
    main()
