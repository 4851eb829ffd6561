"""The first batch after a mid-epoch ``load_state_dict`` against a fresh epoch's first batch
(issue 40), and the checkpoint's size, at ImageNet's size.

    python benchmarks/resume_cost.py --make /tmp/resume-db     # 1,281,167 tiny records
    python benchmarks/resume_cost.py /tmp/resume-db --repeats 5

``--make`` writes ``--records`` 8x8 RGB images stored as pixels (``write_dataset(...,
image_format="pixels")``, label ``i % 1000``: the record count is what matters here, not
the decoding).  Each case is a new Loader (batch 256, cache 5000, shuffle, raw batches,
in this process), timed from ``set_epoch``/``load_state_dict`` to its first batch; the
cases alternate within each repeat and the medians are printed:

* fresh: epoch 1 from its start;
* same settings: a checkpoint of epoch 1 at half of its batches and at its last batch;
* elastic: a checkpoint of 4 ranks at half of their batches, resumed on 1 rank (4 buffer
  replays of 320,000 records), and of 1 rank at half, resumed on rank 0 of 4.
"""
from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from seqloader import Loader, write_dataset  # noqa: E402

KW = dict(batch_size=256, shuffle=True, num_workers=0, cache=5000, seed=0)


class Tiny:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full((8, 8, 3), i % 251, np.uint8), i % 1000


def make(out: Path, n: int) -> None:
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_dataset(Tiny(n), out, workers=2, progress=False, image_format="pixels")
    print(f"wrote {n:,} records to {out} in {time.perf_counter() - t:.0f} s")


def state_at(db: Path, world: int, fraction: float | None, last: bool = False) -> dict:
    """A checkpoint of epoch 1 on ``world`` ranks at ``fraction`` of its batches."""
    loader = Loader(db, "train", None, rank=0, world_size=world, **KW)
    k = len(loader) - 1 if last else int(len(loader) * fraction)
    loader.load_state_dict({**loader.state_dict(), "epoch": 1, "position": k})
    state = loader.state_dict()
    loader.close()
    return state


def first_batch(db: Path, state: dict | None, world: int = 1) -> float:
    loader = Loader(db, "train", None, rank=0, world_size=world, **KW)
    t = time.perf_counter()
    if state is None:
        loader.set_epoch(1)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the elastic resume's drop, said once)
            loader.load_state_dict(state)
    next(iter(loader))
    dt = time.perf_counter() - t
    loader.close()
    return dt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("db", nargs="?")
    p.add_argument("--make", metavar="DIR")
    p.add_argument("--records", type=int, default=1_281_167)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if a.make:
        make(Path(a.make), a.records)
        return
    db = Path(a.db)
    cases = {"fresh epoch": (None, 1),
             "same settings, half": (state_at(db, 1, 0.5), 1),
             "same settings, last batch": (state_at(db, 1, None, last=True), 1),
             "elastic 4 -> 1 ranks, half": (state_at(db, 4, 0.5), 1),
             "elastic 1 -> 4 ranks, half": (state_at(db, 1, 0.5), 4)}
    times: dict[str, list[float]] = {k: [] for k in cases}
    first_batch(db, None)  # (warm the page cache and the imports)
    for _ in range(a.repeats):
        for name, (state, world) in list(cases.items()):
            try:
                times[name].append(first_batch(db, state, world))
            except ValueError as e:  # (a seqloader before issue 40: refused)
                print(f"{name}: refused: {str(e)[:120]}")
                del cases[name], times[name]
    fresh = statistics.median(times["fresh epoch"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} median {med * 1000:7.1f} ms  (min {min(ts) * 1000:.1f}, max "
              f"{max(ts) * 1000:.1f})  {med / fresh:.2f}x fresh")
    for name in ("same settings, half", "elastic 4 -> 1 ranks, half"):
        if name in cases:
                print(f"checkpoint ({name}): {len(pickle.dumps(cases[name][0]))} bytes pickled")


if __name__ == "__main__":
    main()
