"""The dataset tools on a simulated hard disk: do they move data at the disk's bandwidth?

Each step runs as ``hddsim --dir DB -- python -c ...`` (page cache dropped, reads
throttled to ``--mbps`` MiB/s and 100 IO/s) in a fresh process with ``PYTHONPATH`` set to
this checkout, and times one tool on the ``train`` split of ``DB`` (a folder), writing
under ``WORK`` (removed before each step, outside the timing):

* ``read``: the source files read with 16 MiB ``pread`` s (the disk's ceiling);
* ``reshard``: to 4 shards; ``subset-half`` / ``subset-rest``: ``--fraction 0.5`` and its
  ``--complement``; ``subset-class``: ``--random-classes`` 1/10 of the classes (a tenth
  of the records, spread through the shuffled file); ``merge``: the two halves back into
  one file; ``merge-shuffle``: the same with ``--shuffle`` through scratch buckets
  (``--memory-budget`` a quarter of the split: two passes, twice the reads);
  ``export-tree`` and ``export-wds``: to a class tree and to webdataset shards.

Reported per step: wall seconds (the tool's call, output synced), its CPU seconds (all
threads), the source files' bytes (what a sequential pass reads), the output's bytes, and ``read_share``: source bytes
per wall second as a share of ``--mbps``.

    python benchmarks/dbtools_hdd.py DB WORK --hddsim PATH [--mbps 150] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_RUN = r"""
import json, os, sys, time
from pathlib import Path
from seqloader.tools.dbtools import merge, reshard, subset
from seqloader.tools.dbtools.export import export
from seqloader.read.database import open_database
step, db, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
classes = len(open_database(db, "train").classes)
src = {"merge": None, "merge-shuffle": None}
t0, c0 = time.perf_counter(), time.process_time()
if step == "read":
    for p in sorted(Path(db).glob("ILSVRC-train*.lmdb")):
        fd = os.open(p, os.O_RDONLY)
        off = 0
        while True:
            n = len(os.pread(fd, 16 << 20, off))
            if not n:
                break
            off += n
        os.close(fd)
elif step == "reshard":
    reshard(db, work / step, split="train", shards=4, progress=False)
elif step == "subset-half":
    subset(db, work / step, split="train", fraction=0.5, seed=1, progress=False)
elif step == "subset-rest":
    subset(db, work / step, split="train", fraction=0.5, seed=1, complement=True, progress=False)
elif step == "subset-class":
    subset(db, work / step, split="train", random_classes=max(1, classes // 10), seed=1,
           progress=False)
elif step == "merge":
    merge([work / "subset-half", work / "subset-rest"], work / step, progress=False)
elif step == "merge-shuffle":
    size = open_database(db, "train").image_bytes
    merge([work / "subset-half", work / "subset-rest"], work / step, shuffle=True, seed=2,
          memory_budget=size // 4, progress=False)
elif step == "export-tree":
    export(db, work / step, split="train", progress=False)
elif step == "export-wds":
    export(db, work / step, split="train", to="webdataset", progress=False)
os.sync()
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}))
"""

STEPS = ("read", "reshard", "subset-half", "subset-rest", "subset-class", "merge",
         "merge-shuffle", "export-tree", "export-wds")
_INPUTS = {"merge": ("subset-half", "subset-rest"), "merge-shuffle": ("subset-half", "subset-rest")}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _train_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("ILSVRC-train*.lmdb"))


def run_step(step: str, args: argparse.Namespace) -> dict:
    out = Path(args.work) / step
    if out.exists():
        shutil.rmtree(out)
    cmd = [args.hddsim, "--dir", args.db, "--mbps", str(args.mbps), "--", sys.executable, "-c",
           _RUN, step, args.db, args.work]
    p = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                       text=True, timeout=3600, check=False)
    if p.returncode:
        raise RuntimeError(f"{step} failed:\n{p.stderr[-3000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    wall = got["wall_s"]
    inputs = _INPUTS.get(step)
    src = (sum(_train_bytes(Path(args.work) / i) for i in inputs) if inputs
           else _train_bytes(Path(args.db)))
    res = {"step": step, "wall_s": round(wall, 2), "cpu_s": round(got["cpu_s"], 2),
           "source_bytes": src,
           "output_bytes": _size(out) if out.exists() else 0,
           "read_mibs": round(src / wall / 2**20, 1),
           "read_share": round(src / wall / 2**20 / args.mbps, 3)}
    print(json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="a folder holding a train split (ILSVRC-train*.lmdb)")
    ap.add_argument("work", help="a folder for the outputs (on the same disk; emptied step by step)")
    ap.add_argument("--hddsim", required=True, help="the hddsim script")
    ap.add_argument("--mbps", type=float, default=150, help="the simulated disk's MiB/s (%(default)s)")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                    help="steps to run (default: all; merge needs the subset-half/rest outputs)")
    ap.add_argument("--json", metavar="OUT", help="also write the results to this JSON file")
    args = ap.parse_args()
    args.db, args.work = str(Path(args.db).resolve()), str(Path(args.work).resolve())
    Path(args.work).mkdir(parents=True, exist_ok=True)
    results = [run_step(s, args) for s in args.steps]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
