#!/usr/bin/env python
"""The wait at epoch boundaries: time from an epoch's last batch to the next one's first.

Runs the Loader (full ImageNet training transform, 2 workers, batch 256, cache 5000)
for one start-up epoch, then ``--epochs`` more, and prints JSON: each boundary's wait,
the median time between batches inside an epoch, and images/s over the measured epochs.
``--code DIR`` imports ``seqloader`` from ``DIR`` instead (e.g. an older commit:
``git worktree add /tmp/old 15c606e`` then ``--code /tmp/old``), for A/B runs that
alternate two versions on the same data:

    python benchmarks/epoch_gaps.py --db DIR [--epochs 3]
        [--code DIR] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(db: str, epochs: int, code: str | None) -> dict:
    if code:
        sys.path.insert(0, code)
    import seqloader
    from seqloader import transforms as T

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    loader = seqloader.Loader(db, "train", tf, batch_size=256, shuffle=True, num_workers=2,
                              cache=5000)
    for _ in loader:  # start-up epoch: workers, page cache
        pass
    waits, inside, n = [], [], 0
    t0 = t = time.perf_counter()
    for _ in range(epochs):
        first = True
        for _, y in loader:
            now = time.perf_counter()
            (waits if first else inside).append(now - t)
            first, t, n = False, now, n + len(y)
    loader.close()
    return {"seqloader": seqloader.__file__, "boundary_waits_s": [round(w, 3) for w in waits],
            "median_batch_s": round(statistics.median(inside), 3) if inside else None,
            "images_per_s": round(n / (t - t0), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, type=lambda s: str(Path(s).resolve()),
                    help="the database folder (e.g. hdd_compare.py's DATA/lmdb-hdd)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--code", action="append", default=[],
                    help="a checkout whose seqloader to import; repeat to alternate several")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.db, args.epochs, args.code[0] if args.code else None)))
        return 0
    for _ in range(args.repeat):
        for code in args.code or [None]:
            cmd = [sys.executable, __file__, "--child", "--db", args.db,
                   "--epochs", str(args.epochs)] + (["--code", code] if code else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            print(out.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
