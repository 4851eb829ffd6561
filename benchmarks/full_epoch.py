"""One epoch of the full training pipeline in a fresh process: the A/B unit of the
seams refactor (run it with ``PYTHONPATH`` set to each checkout, alternating).

    python benchmarks/full_epoch.py DB_DIR [--split train] [--workers 2] [--batch-size 64]

Prints the images, the time to the first batch (from the first import) and the rate
including start-up, on stderr; under ``../shared/tools/hddsim --dir DB_DIR --`` it is
the cold-disk figure.
"""
from __future__ import annotations

import argparse
import sys
import time

t0 = time.perf_counter()
import seqloader.transforms as T  # noqa: E402 - timed from before the imports
from seqloader import Loader  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", help="a database folder or file")
    ap.add_argument("--split", default="train", help="split to read (train)")
    ap.add_argument("--workers", type=int, default=2, help="decode workers (2)")
    ap.add_argument("--batch-size", type=int, default=64, help="batch size (64)")
    a = ap.parse_args()
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    loader = Loader(a.db, a.split, tf, batch_size=a.batch_size, shuffle=True,
                    num_workers=a.workers, cache=500, world_size=1, rank=0)
    n, first = 0, None
    for _, y in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += len(y)
    dt = time.perf_counter() - t0
    print(f"{n} images, first batch {first:.2f} s, {n / dt:.0f} img/s incl. start",
          file=sys.stderr)


if __name__ == "__main__":
    main()
