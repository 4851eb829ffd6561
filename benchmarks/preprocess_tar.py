#!/usr/bin/env python
"""Preprocessing from a tar of per-class tars against preprocessing the extracted tree.

    seqloader synth TREE --classes 100 --per-class 200 --val-per-class 0 --workers 2
    python benchmarks/preprocess_tar.py TREE WORK --hddsim PATH/TO/hddsim [--budget-fraction 0.25]

Builds ``WORK/ILSVRC2012_img_train.tar`` (a tar of ``<class>.tar``, as ImageNet ships it)
from ``TREE/train`` unless it exists, then runs, each in a fresh process:

``cold`` (under hddsim, page cache dropped; WORK and TREE on the throttled disk):
    ``cat`` of the tar (the disk's sequential bandwidth); the tar with ``--no-verify``
    (each pass's read rate, as a share of that bandwidth); the tar with the default
    decode check; the folder tree with the default decode check (the ratio).
``warm`` (page cache warm): the tar and the tree, default check: images/s of each
    (``--one-pass``: the tar with the default budget too).

The memory budget is ``--budget-fraction`` of the tar's size, so the shuffle takes two
passes.  Prints one JSON line per run and a summary; ``--json FILE`` writes them all.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_tar(tree: Path, tar: Path) -> None:
    """A tar of ``<class>.tar`` (sorted) from ``tree/train/<class>/*``."""
    tmp = tar.with_name(tar.name + ".partial")
    with tarfile.open(tmp, "w") as outer:
        for cls in sorted(p.name for p in (tree / "train").iterdir() if p.is_dir()):
            b = io.BytesIO()
            with tarfile.open(fileobj=b, mode="w") as inner:
                for f in sorted((tree / "train" / cls).iterdir()):
                    inner.add(f, arcname=f.name)
            ti = tarfile.TarInfo(f"{cls}.tar")
            ti.size = b.tell()
            b.seek(0)
            outer.addfile(ti, b)
    tmp.replace(tar)


CHILD = """
import json, sys, time
t0 = time.perf_counter()
from seqloader.write import extshuffle
from seqloader.cli import main
marks = {}
real = extshuffle._Pass1.run
def run(self):
    t = time.perf_counter()
    real(self)
    marks["pass1_s"] = time.perf_counter() - t
    marks["pass2_start"] = time.perf_counter()
    marks["bucket_bytes"] = sum(self.state["buckets"])
extshuffle._Pass1.run = run
t1 = time.perf_counter()
rc = main(sys.argv[2:])
t2 = time.perf_counter()
if "pass2_start" in marks:
    marks["pass2_s"] = t2 - marks.pop("pass2_start")
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "import_s": t1 - t0, "total_s": t2 - t1, **marks}, f)
"""


def run(cmd: list[str], hddsim: str | None, disk: Path, env: dict) -> float:
    full = ([hddsim, "--dir", str(disk), "--"] if hddsim else []) + cmd
    t = time.perf_counter()
    subprocess.run(full, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def preprocess(args, name: str, source: Path, extra: list[str], cold: bool, env) -> dict:
    out = args.work / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    res = args.work / f"{name}.json"
    cmd = [sys.executable, "-c", CHILD, str(res), "preprocess", str(source), str(out),
           "--no-progress", *extra]
    if source.is_dir():
        cmd += ["--splits", "train"]
    wall = run(cmd, args.hddsim if cold else None, args.work, env)
    r = {"run": name, "wall_s": round(wall, 2), **json.loads(res.read_text())}
    info = subprocess.run([sys.executable, "-m", "seqloader.cli", "info", "--json",
                           str(out / "ILSVRC-train.lmdb")], env=env, capture_output=True,
                          text=True, check=True)
    n = json.loads(info.stdout)["num_records"]
    r["images"] = n
    r["images_per_s"] = round(n / r["total_s"], 1)
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(r), flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("tree", type=Path, help="synthetic ImageNet tree (with train/)")
    ap.add_argument("work", type=Path, help="folder for the tar, outputs and scratch")
    ap.add_argument("--hddsim", help="path of the hddsim tool (cold runs are skipped without)")
    ap.add_argument("--budget-fraction", type=float, default=0.25)
    ap.add_argument("--skip-tree", action="store_true", help="no folder-tree runs")
    ap.add_argument("--one-pass", action="store_true",
                    help="also a warm tar run with the default budget (4G: one pass if it fits)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tar = args.work / "ILSVRC2012_img_train.tar"
    if not tar.exists():
        build_tar(args.tree, tar)
    size = tar.stat().st_size
    budget = str(int(size * args.budget_fraction))
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "HOME": str(args.work)}
    results = []
    if args.hddsim:
        cat_s = run(["cat", str(tar)], args.hddsim, args.work, env)
        results.append({"run": "cat-tar-cold", "wall_s": round(cat_s, 2),
                        "MiB_per_s": round(size / 2**20 / cat_s, 1)})
        print(json.dumps(results[-1]), flush=True)
        bw = size / cat_s
        r = preprocess(args, "tar-noverify-cold", tar, ["--no-verify", "--memory-budget", budget],
                       True, env)
        r["pass1_read_share"] = round(size / r["pass1_s"] / bw, 3)
        r["pass2_read_share"] = round(r["bucket_bytes"] / r["pass2_s"] / bw, 3)
        results.append(r)
        results.append(preprocess(args, "tar-verify-cold", tar, ["--memory-budget", budget],
                                  True, env))
        if not args.skip_tree:
            results.append(preprocess(args, "tree-verify-cold", args.tree, [], True, env))
    subprocess.run(["cat", str(tar)], stdout=subprocess.DEVNULL, check=True)  # warm
    results.append(preprocess(args, "tar-verify-warm", tar, ["--memory-budget", budget], False,
                              env))
    if args.one_pass:
        results.append(preprocess(args, "tar-verify-warm-one-pass", tar, [], False, env))
    if not args.skip_tree:
        results.append(preprocess(args, "tree-verify-warm", args.tree, [], False, env))
    by = {r["run"]: r for r in results}
    print(f"tar {size / 2**20:.0f} MiB, budget {int(budget) / 2**20:.0f} MiB")
    if "tar-noverify-cold" in by:
        r = by["tar-noverify-cold"]
        print(f"cold, no decode check: pass 1 {r['pass1_read_share']:.0%}, pass 2 "
              f"{r['pass2_read_share']:.0%} of cat's {by['cat-tar-cold']['MiB_per_s']} MiB/s")
    if "tree-verify-cold" in by:
        print(f"cold, default check: tar {by['tar-verify-cold']['wall_s']} s vs tree "
              f"{by['tree-verify-cold']['wall_s']} s: "
              f"{by['tree-verify-cold']['wall_s'] / by['tar-verify-cold']['wall_s']:.1f}x")
    if "tree-verify-warm" in by:
        if "tar-verify-warm-one-pass" in by:
            print(f"warm, one pass (default budget): tar "
                  f"{by['tar-verify-warm-one-pass']['images_per_s']} images/s")
        print(f"warm, default check: tar {by['tar-verify-warm']['images_per_s']} images/s, tree "
              f"{by['tree-verify-warm']['images_per_s']} images/s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
