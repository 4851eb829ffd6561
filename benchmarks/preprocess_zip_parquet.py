#!/usr/bin/env python
"""Preprocessing the same images from a zip, from parquet files and from a tar (A/B).

    seqloader synth TREE --classes 10 --per-class 200 --val-per-class 0 --workers 2
    python benchmarks/preprocess_zip_parquet.py TREE WORK [--hddsim PATH/TO/hddsim] [--runs 3]

Builds from ``TREE/train`` (unless they exist): ``WORK/train.tar`` (a tar of the class
folders, the yardstick), Kaggle's layout as ``WORK/kaggle/...challenge.zip`` (members
stored) and ``WORK/kaggle-deflated/...zip`` (deflated, as ``zip`` writes by default),
and Hugging Face's layout ``WORK/hf/data/train-*.parquet`` (500 images a file, row
groups of 100, snappy: what ``datasets`` writes).  Then, for each of those against the
tar, ``farm-bench`` runs ``seqloader preprocess SOURCE OUT --split train --overwrite``
alternately (A B A B ...), the memory budget a quarter of the data (two passes):

``warm``           page cache warm, the default decode check;
``warm-noverify``  page cache warm, ``--no-verify``: the source's read path alone;
``hdd-noverify``   (with ``--hddsim``) every run after dropping the page cache, under
                   the simulated HDD, ``--no-verify``: the disk's share.

images/s = images / the median wall time; the ratio A/B is farm-bench's, pair by pair.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KAGGLE = "imagenet-object-localization-challenge.zip"


def _images(tree: Path) -> list[tuple[str, Path]]:
    return [(f"{c.name}/{f.name}", f) for c in sorted((tree / "train").iterdir()) if c.is_dir()
            for f in sorted(c.iterdir())]


def build(tree: Path, work: Path) -> dict[str, Path]:
    images = _images(tree)
    classes = sorted({n.split("/")[0] for n, _ in images})
    out = {"tar": work / "train.tar", "zip": work / "kaggle" / KAGGLE,
           "zip-deflated": work / "kaggle-deflated" / KAGGLE,
           "parquet": work / "hf" / "data"}
    if not out["tar"].exists():
        with tarfile.open(out["tar"], "w") as tf:
            for name, f in images:
                tf.add(f, arcname=f"train/{name}")
    for kind, method in (("zip", zipfile.ZIP_STORED), ("zip-deflated", zipfile.ZIP_DEFLATED)):
        if not out[kind].exists():
            out[kind].parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(out[kind], "w", method) as zf:
                for name, f in images:
                    zf.write(f, f"ILSVRC/Data/CLS-LOC/train/{name}")
                zf.writestr("LOC_synset_mapping.txt", "".join(f"{c} class {c}\n" for c in classes))
    if not out["parquet"].exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        out["parquet"].mkdir(parents=True)
        info = {"info": {"features": {"image": {"_type": "Image"},
                                      "label": {"names": classes, "_type": "ClassLabel"}}}}
        schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                            ("label", pa.int64())],
                           metadata={b"huggingface": json.dumps(info).encode()})
        per = 500
        n = (len(images) + per - 1) // per
        for s in range(n):
            part = images[s * per:(s + 1) * per]
            table = pa.table({"image": [{"bytes": f.read_bytes(), "path": f.name} for _, f in part],
                              "label": [classes.index(name.split("/")[0]) for name, _ in part]},
                             schema=schema)
            pq.write_table(table, out["parquet"] / f"train-{s:05d}-of-{n:05d}.parquet",
                           row_group_size=100)
    return out


def command(kind: str, src: Path, work: Path, budget: int, extra: list[str],
            drop: bool) -> str:
    files = sorted(map(str, src.glob("*.parquet"))) if src.is_dir() else [str(src)]
    argv = [sys.executable, "-m", "seqloader", "preprocess", *files, str(work / f"out-{kind}"),
            "--split", "train", "--overwrite", "--no-progress", "--memory-budget", str(budget),
            "--scratch", str(work / f"scratch-{kind}"), *extra]
    cmd = shlex.join(argv)
    return f"sh -c {shlex.quote(('echo 3 > /proc/sys/vm/drop_caches; ' if drop else '') + 'exec ' + cmd)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tree")
    p.add_argument("work")
    p.add_argument("--hddsim", help="path of the hddsim tool: adds the hdd-noverify runs")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--only", nargs="+", default=["zip", "zip-deflated", "parquet"])
    p.add_argument("--modes", nargs="+", default=["warm", "warm-noverify", "hdd-noverify"])
    args = p.parse_args()
    tree, work = Path(args.tree), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    srcs = build(tree, work)
    n = len(_images(tree))
    budget = srcs["tar"].stat().st_size // 4
    print(f"{n} images, tar {srcs['tar'].stat().st_size / 2**20:.1f} MiB, budget "
          f"{budget / 2**20:.1f} MiB", flush=True)
    for mode in args.modes:
        if mode.startswith("hdd") and not args.hddsim:
            continue
        extra = ["--no-verify"] if mode.endswith("noverify") else []
        for kind in args.only:
            a = command(kind, srcs[kind], work, budget, extra, mode.startswith("hdd"))
            b = command("tar", srcs["tar"], work, budget, extra, mode.startswith("hdd"))
            bench = ["farm-bench", "-n", str(args.runs), "--warmup", "1", "--timeout", "1800",
                     "--vs", b, "--", *shlex.split(a)]
            if mode.startswith("hdd"):
                bench = [args.hddsim, "--dir", str(work), "--", *bench]
            print(f"== {mode}: {kind} (A) vs tar (B), {n} images\n$ {shlex.join(bench)}",
                  flush=True)
            subprocess.run(bench, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


if __name__ == "__main__":
    main()
