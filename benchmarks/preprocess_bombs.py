#!/usr/bin/env python
"""Peak memory of preprocessing a tar with decompression bombs in it, against the same
tar without them (NOTE [ pixel limit ] in ``seqloader/format/imagesize.py``).

    seqloader synth TREE --classes 20 --per-class 50 --val-per-class 0 --workers 2
    python benchmarks/preprocess_bombs.py TREE WORK [--bombs 4] [--runs 5]

Builds ``WORK/clean-train.tar`` (a tar of ``TREE/train``'s class folders) and
``WORK/bombs-train.tar`` (the same, with ``--bombs`` 631-byte JPEGs of 20000x20000 and as
many 875 KB PNGs of 30000x30000 among the classes), then times both preprocessed with
``farm-bench`` (alternated runs; its "peak" is the largest single process's RSS, the
workers included): ``seqloader preprocess WORK/X.tar WORK/out-X --overwrite``.  Prints
farm-bench's report; the bombs must come out as bad files and peak memory stay within
2x of the clean run's.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build(tree: Path, work: Path, bombs: int) -> tuple[Path, Path]:
    """``(clean tar, tar with bombs)`` of ``tree/train`` in ``work`` (kept if present)."""
    from seqloader.tools.bombs import jpeg_bomb, png_bomb

    work.mkdir(parents=True, exist_ok=True)
    clean, dirty = work / "clean-train.tar", work / "bombs-train.tar"
    classes = sorted(p for p in (tree / "train").iterdir() if p.is_dir())
    if not classes:
        raise SystemExit(f"{tree}/train has no class folders: make it with seqloader synth")
    if not clean.exists():
        with tarfile.open(clean, "w") as tf:
            for c in classes:
                tf.add(c, arcname=c.name)
    if not dirty.exists():
        staged = work / "bombs"
        for i in range(bombs):
            d = staged / classes[i % len(classes)].name
            d.mkdir(parents=True, exist_ok=True)
            (d / f"bomb{i}.JPEG").write_bytes(jpeg_bomb(20000, 20000))
            (d / f"bomb{i}.png").write_bytes(png_bomb(30000, 30000))
        with tarfile.open(dirty, "w") as tf:
            for c in classes:
                tf.add(c, arcname=c.name)
                if (staged / c.name).is_dir():
                    for f in sorted((staged / c.name).iterdir()):
                        tf.add(f, arcname=f"{c.name}/{f.name}")
        shutil.rmtree(staged)
    return clean, dirty


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path, help="a seqloader synth folder (TREE/train/<class>/...)")
    ap.add_argument("work", type=Path, help="where the tars and outputs go")
    ap.add_argument("--bombs", type=int, default=4, help="JPEG and PNG bombs each (4)")
    ap.add_argument("--runs", type=int, default=5, help="farm-bench runs of each (5)")
    ap.add_argument("--workers", type=int, default=2, help="preprocess --workers (2)")
    args = ap.parse_args()
    clean, dirty = build(args.tree, args.work, args.bombs)
    if shutil.which("farm-bench") is None:
        raise SystemExit("farm-bench is not on the PATH")

    def cmd(tar: Path) -> list[str]:
        out = args.work / f"out-{tar.stem}"
        return [sys.executable, "-m", "seqloader", "preprocess", str(tar), str(out),
                "--overwrite", "--no-progress", "--workers", str(args.workers)]

    a, b = cmd(dirty), cmd(clean)
    run = subprocess.run(["farm-bench", "-n", str(args.runs), "--timeout", "3000",
                          "--vs", " ".join(b), "--", *a])
    bad = args.work / f"out-{dirty.stem}" / "ILSVRC-train.lmdb.bad-files.tsv"
    if bad.exists():
        print(bad.read_text().strip())
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
