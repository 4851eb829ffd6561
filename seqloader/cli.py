"""The ``seqloader`` command: preprocess, info, verify, synth, demo, bench, and the dataset
tools (show, subset, reshard, merge, export: :mod:`seqloader.tools.dbtools`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Sequence

from .errors import USER_ERRORS, one_line
from .read.database import path_splits
from .tools.sizes import size_arg

__all__ = ["main", "add_preprocess_arguments", "run_preprocess", "one_line"]


def add_preprocess_arguments(p: argparse.ArgumentParser) -> None:
    from .write.writer import WriteOptions

    d = WriteOptions()
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="a folder holding train/ and/or val/ class folders; or archive files "
                        "read sequentially once: ImageNet's ILSVRC2012_img_train.tar (a tar of "
                        "per-class tars), ILSVRC2012_img_val.tar with --val-labels, a tar of "
                        "class folders, webdataset shards (key.jpg + key.cls/.json), any of "
                        "them gzip'd, a zip of class folders or Kaggle's ImageNet zip (train "
                        "and val), parquet files (Hugging Face's imagenet-1k data/*.parquet), or the original sequential loader's / tensorpack's LMDB "
                        "files (their pickled records are read by a restricted unpickler that "
                        "builds only numpy arrays and plain values and refuses anything else)")
    p.add_argument("lmdb_dir", help="output folder for ILSVRC-<split>.lmdb files, or a folder "
                                    "URL (s3://bucket/prefix, gs://..., any fsspec protocol "
                                    "that can write): each shard is written locally, then "
                                    "uploaded (a folder tree as source)")
    p.add_argument("--splits", nargs="+", metavar="SPLIT",
                   help="split folders to convert (default: train and val, where present)")
    p.add_argument("--val-labels", metavar="FILE",
                   help="labels for a flat val/ folder or val tar: 'filename wnid' or 'filename "
                        "index' lines, CSV such as Kaggle's LOC_val_solution.csv, or (val "
                        "tar, with scipy installed) ILSVRC2012_devkit_t12.tar.gz")
    p.add_argument("--split", help="the split of the archive files given (default: from "
                                   "their names, e.g. ILSVRC2012_img_train.tar is train)")
    p.add_argument("--memory-budget", type=size_arg, metavar="SIZE", default=None,
                   help="archives: memory for the shuffle (e.g. 4G, 512M; default 4G); a split "
                        "larger than this is shuffled in two passes through --scratch")
    p.add_argument("--scratch", metavar="DIR", help="archives: folder for the two-pass "
                   "shuffle's buckets, about the split's size (default: the output folder); "
                   "removed at the end")
    p.add_argument("--image-column", metavar="NAME", help="parquet files: the column of "
                   "encoded images (binary, or a struct of bytes and path; default: image)")
    p.add_argument("--label-column", metavar="NAME", help="parquet files: the column of "
                   "labels (class indices or class names; default: label)")
    p.add_argument("--class-names", metavar="FILE", help="archives labelled by index "
                   "(tensorpack LMDB, webdataset .cls): one class name per line, in label order")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the train write order (%(default)s)")
    p.add_argument("--no-shuffle", action="store_true",
                   help="keep sorted (class-by-class) order for train too")
    p.add_argument("--no-verify", action="store_true", help="skip the decode check of every image")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first undecodable image (non-zero exit; that split's "
                        "output is removed, splits completed before it stay)")
    p.add_argument("--max-size", type=int, metavar="PX",
                   help="re-encode images whose shorter side exceeds PX down to PX")
    p.add_argument("--max-pixels", type=int, default=d.max_pixels, metavar="N",
                   help="refuse images whose header claims more than N pixels, before any "
                        "decode (decompression bombs: they are listed as bad files with "
                        "their size; default %(default)s, Pillow's limit; 0: no limit)")
    p.add_argument("--quality", type=int, default=d.quality,
                   help="JPEG quality of re-encoded images (%(default)s)")
    p.add_argument("--restart-markers", action="store_true",
                   help="losslessly add JPEG restart markers every few MCUs (jpegtran), so "
                        "a random crop decodes only the segments around it: faster "
                        "CPU-bound training on large photos")
    p.add_argument("--format", choices=("jpeg", "pixels"), default="jpeg", dest="image_format",
                   help="store JPEG bytes (%(default)s) or decoded uint8 pixels, which the "
                        "Loader reads without decoding: for hosts where decoding, not the "
                        "disk, limits training (3 bytes a pixel: pair it with --short-side; "
                        "'seqloader bench --compare-formats' tells which is faster)")
    p.add_argument("--short-side", type=int, metavar="PX",
                   help="with --format pixels: shrink images whose shorter side exceeds PX to PX")
    p.add_argument("--shards", type=int, default=1, help="files per split (%(default)s)")
    p.add_argument("--shard-ids", type=int, nargs="+", metavar="K",
                   help="write only these shards (0-based), e.g. one per machine")
    p.add_argument("--workers", type=int, default=d.workers,
                   help="parallel work on source files (%(default)s): reading threads with "
                        "--no-verify, else decode processes (at most cores + 1)")
    p.add_argument("--no-paths", action="store_true", help="do not store source paths in records")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("--staging", metavar="DIR",
                   help="with a URL output: the local folder where shards are written before "
                        "upload; needs about 2 x split size / --shards free (default: a "
                        "folder in the system temp folder, $TMPDIR)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _is_folder_tree(sources: list[str]) -> bool:
    p = Path(sources[0])
    return len(sources) == 1 and p.is_dir() and not (p / "data.mdb").exists()


def run_preprocess(args: argparse.Namespace) -> int:
    from .write.preprocess import preprocess, preprocess_sources
    from .write.writer import WriteOptions

    opt = WriteOptions(seed=args.seed, shuffle=not args.no_shuffle, verify=not args.no_verify,
                       strict=args.strict, max_size=args.max_size, quality=args.quality,
                       restart_markers=args.restart_markers,
                       store_paths=not args.no_paths, shards=args.shards,
                       shard_ids=args.shard_ids, workers=args.workers,
                       overwrite=args.overwrite, progress=not args.no_progress,
                       image_format=args.image_format, short_side=args.short_side,
                       max_pixels=args.max_pixels or None)
    if _is_folder_tree(args.sources):
        given = [f for f, v in (("--split", args.split), ("--class-names", args.class_names),
                                ("--memory-budget", args.memory_budget),
                                ("--scratch", args.scratch), ("--image-column",
                                args.image_column), ("--label-column", args.label_column))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: for archive sources; a folder tree's splits "
                             "are its folders (--splits) and its order needs no scratch: drop it")
        from .read.remote import default_options

        reports = preprocess(args.sources[0], args.lmdb_dir, splits=args.splits,
                             val_labels=args.val_labels, options=opt, staging=args.staging,
                             storage_options=default_options().storage_options or None)
    else:
        if any(Path(s).is_dir() and not (Path(s) / "data.mdb").exists() for s in args.sources):
            raise ValueError("give one folder tree, or archive files; not both")
        if args.splits:
            raise ValueError("--splits names split folders of a folder tree; for archive "
                             "files use --split (or names such as *train*.tar)")
        if args.staging is not None:
            raise ValueError("--staging is for uploading a folder tree's shards to a URL; "
                             "archive sources are written to a local folder: drop it")
        from .write.migrate import read_class_names

        reports = preprocess_sources(
            args.sources, args.lmdb_dir, split=args.split, val_labels=args.val_labels,
            class_names=read_class_names(args.class_names) if args.class_names else None,
            options=opt, memory_budget=args.memory_budget, scratch=args.scratch,
            image_column=args.image_column, label_column=args.label_column)
    for r in reports:
        skipped = sum(s.skipped for s in r.shards)
        print(f"{r.split}: {r.num_records} records, {r.image_bytes / 2**20:.1f} MiB in "
              f"{len(r.shards)} file(s)" + (f" ({skipped} already complete)" if skipped else "")
              + (f"; {len(r.bad_files)} bad file(s) skipped" if r.bad_files else "")
              + (f"; {len(r.warned_files)} file(s) stored with a decoder warning"
                 if r.warned_files else ""))
        for s in r.shards:
            print(f"  {s.path}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from .tools.dbtools.info import describe, format_info

    splits = path_splits(args.path, args.split)
    folder = args.split is None and (Path(args.path).is_dir() or splits != [None])
    infos = {}
    for i, split in enumerate(splits):
        infos[split] = describe(args.path, split)
        if not args.json:
            print(("\n" if i else "") + format_info(infos[split]), flush=True)
    if args.json:
        print(json.dumps(infos if folder else infos[splits[0]], indent=2))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .tools.dbtools.verify import verify_database

    splits = path_splits(args.path, args.split)
    named = args.split is None and (Path(args.path).is_dir() or splits != [None])
    ok = True
    for split in splits:
        res = verify_database(args.path, split, workers=args.workers,
                              progress=not args.no_progress)
        for idx, why in res.bad[:100]:
            print(f"bad record {idx}: {why}")
        if len(res.bad) > 100:
            print(f"... and {len(res.bad) - 100} more bad records")
        for prob in res.problems:
            print(f"problem: {prob}")
        print((f"{split}: " if named else "") + f"{res.num_records} records checked: "
              + ("OK" if res.ok else f"{len(res.bad)} bad record(s), {len(res.problems)} problem(s)"))
        ok = ok and res.ok
    return 0 if ok else 1


def _synth(args: argparse.Namespace) -> int:
    from .tools.synth import make_synthetic_imagenet

    rep = make_synthetic_imagenet(args.dir, classes=args.classes, per_class=args.per_class,
                                  val_per_class=args.val_per_class, seed=args.seed,
                                  bad=args.bad, size=args.size, workers=args.workers,
                                  progress=not args.no_progress)
    what = (f"{sum(rep.counts.values())} images ({rep.total_bytes / 2**20:.1f} MiB) in "
            f"{len(rep.classes)} classes")
    print(f"{rep.root} already holds {what}, made with these options: nothing to do"
          if rep.already else f"wrote {what} to {rep.root}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .tools.demo import run_demo

    return run_demo(Path(args.dir), progress=not args.no_progress)


def build_parser() -> argparse.ArgumentParser:
    from .version import __version__

    ap = argparse.ArgumentParser(
        prog="seqloader", description="Sequential LMDB data loading for PyTorch: write a "
        "database (preprocess), inspect and check it (info, verify, show), measure loading "
        "(bench); cut, reshape and convert it (subset, reshard, merge, export); synth and "
        "demo make synthetic ImageNet-like data. 'seqloader COMMAND --help' for each.")
    ap.add_argument("--version", action="version", version=f"seqloader {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("preprocess", help="convert an ImageNet-style folder tree or archives to LMDB")
    add_preprocess_arguments(p)
    p.set_defaults(fn=run_preprocess)
    for name, fn, hlp in (("info", _info, "describe a database"),
                          ("verify", _verify, "decode every record and check checksums")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("path", help="a .lmdb file, one shard of a set, or a folder of them: "
                                    "every split in it, unless --split names one")
        p.add_argument("--split", help="only this split of a folder (e.g. train)")
        if name == "info":
            p.add_argument("--json", action="store_true",
                           help="print JSON (a folder without --split: an object per split)")
        else:
            p.add_argument("--workers", type=int, default=None,
                           help="decode processes (default: one per core plus one)")
            p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.set_defaults(fn=fn)
    p = sub.add_parser("synth", help="generate a synthetic ImageNet-like folder tree")
    p.add_argument("dir", help="output folder: DIR/train/<wnid>/*.JPEG and DIR/val/<wnid>/*.JPEG")
    p.add_argument("--classes", type=int, default=10, help="number of classes (%(default)s)")
    p.add_argument("--per-class", type=int, default=100,
                   help="train images per class (%(default)s)")
    p.add_argument("--val-per-class", type=int, default=20,
                   help="val images per class (%(default)s; 0: no val/)")
    p.add_argument("--seed", type=int, default=0,
                   help="the same seed and options give the same bytes (%(default)s)")
    p.add_argument("--bad", type=int, default=0,
                   help="undecodable files to add to train (%(default)s)")
    p.add_argument("--size", choices=("imagenet", "small"), default="imagenet",
                   help="image sizes: ImageNet-like (about 500x400 px, ~100 KB) or small "
                        "thumbnails for quick tests (%(default)s)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes drawing images (%(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(fn=_synth)
    from .tools.bench import add_bench_arguments

    p = sub.add_parser("bench", help="measure loading speed, memory and CPU (seqloader vs files)")
    add_bench_arguments(p)
    p.add_argument("--compare-formats", action="store_true",
                   help="instead: time the training transform from JPEG records and from stored "
                        "pixels (--format pixels) on this host and say which loads faster")
    p.add_argument("--short-side", type=int, default=256, metavar="PX",
                   help="with --compare-formats: the pixels' short side (%(default)s)")
    p.add_argument("--disk-mbps", type=float, metavar="MB/S",
                   help="with --compare-formats: the disk's bandwidth (default: measured)")
    p.set_defaults(fn=_run_bench_or_compare)
    from .tools.dbtools.commands import add_commands

    add_commands(sub)
    from .tools.remoteargs import add_remote_arguments

    for name, q in sub.choices.items():  # (bench: in add_bench_arguments)
        if name not in ("synth", "bench"):
            add_remote_arguments(q)
    p = sub.add_parser("demo", help="synthesise, preprocess, verify and load a small dataset")
    p.add_argument("dir", nargs="?", default="seqloader-demo", help="work folder (%(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(fn=_demo)
    return ap


def _run_bench_or_compare(args: argparse.Namespace) -> int:
    if not args.compare_formats:
        from .tools.bench import run_bench
        return run_bench(args)
    from .tools.bench_formats import compare_formats, format_comparison

    workers = [int(w) for a in (args.workers or []) for w in str(a).split(",") if w]
    doc = compare_formats(args.path, args.split, short_side=args.short_side, seed=args.seed,
                          workers=workers[-1] if workers else None, disk_mbps=args.disk_mbps)
    print(json.dumps(doc, indent=2) if args.json else format_comparison(doc))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        from .tools.remoteargs import apply_remote_arguments

        apply_remote_arguments(args)
        return args.fn(args)
    except BrokenPipeError:  # (`seqloader info DIR | head`: the reader has all it wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except USER_ERRORS as e:  # NOTE [ one error boundary ] in errors.py
        from .read.remotefaults import redact  # (no credentials from a URL in any message)

        print(f"seqloader {args.command}: error: {redact(one_line(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = ""
        if args.command == "preprocess":  # (--overwrite would discard what was written)
            hint = ("; re-run the same command to start again, or without --overwrite to "
                    "resume (that refuses outputs of another command: replace those with "
                    "--overwrite first)" if getattr(args, "overwrite", False)
                    else "; re-run the same command to resume")
        print(f"seqloader {args.command}: interrupted{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
