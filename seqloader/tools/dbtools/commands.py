"""The ``seqloader`` subcommands of the dataset tools: ``show``, ``subset``, ``reshard``,
``merge``, ``export`` (``info`` is :mod:`.info`, run by ``seqloader/cli.py``).  Their
mistakes raise the exceptions of the command's error boundary (one line, exit 2)."""
from __future__ import annotations

import argparse
from typing import Any

from ..sizes import size_arg

__all__ = ["add_commands"]

_PATH_HELP = ("a .lmdb file, one shard of a set, or a folder of them: every split in it, "
              "unless --split names one")


def _common(p: argparse.ArgumentParser, *, split: bool = True, out: bool = True) -> None:
    if split:
        p.add_argument("--split", help="only this split of a folder (e.g. train)")
    if out:
        p.add_argument("--overwrite", action="store_true",
                       help="replace outputs that exist (else the command refuses)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _report(reports: list) -> int:
    for r in reports:
        of = f" (of the split's {r.num_records})" if r.written != r.num_records else ""
        what = (f"{len(r.classes)} classes" if r.target_kind == "class"
                else f"{r.target_kind} targets")
        print(f"{r.split}: {r.written} records{of}, {what} in {len(r.paths)} file(s)")
        for p in r.paths:
            print(f"  {p}")
    return 0


def _run_subset(a: argparse.Namespace) -> int:
    from .subset import subset

    return _report(subset(a.path, a.out, split=a.split, classes=a.classes,
                          first_classes=a.first_classes, random_classes=a.random_classes,
                          per_class=a.per_class, fraction=a.fraction, complement=a.complement,
                          renumber=a.renumber, seed=a.seed, shards=a.shards,
                          overwrite=a.overwrite, progress=not a.no_progress))


def _run_reshard(a: argparse.Namespace) -> int:
    from .reshard import reshard

    return _report(reshard(a.path, a.out, split=a.split, shards=a.shards, shard_ids=a.shard_ids,
                           overwrite=a.overwrite, progress=not a.no_progress))


def _run_merge(a: argparse.Namespace) -> int:
    from .reshard import DEFAULT_MEMORY_BUDGET, merge

    return _report(merge(a.sources, a.out, into=a.into, shards=a.shards, shuffle=a.shuffle,
                         seed=a.seed, memory_budget=a.memory_budget or DEFAULT_MEMORY_BUDGET,
                         scratch=a.scratch, overwrite=a.overwrite, progress=not a.no_progress))


def _run_export(a: argparse.Namespace) -> int:
    from .export import export

    for r in export(a.path, a.out, to=a.format, split=a.split, targets=a.targets,
                    shard_bytes=a.shard_size, overwrite=a.overwrite, progress=not a.no_progress):
        print(f"{r.split}: {r.num_records} records, {r.bytes / 2**20:.1f} MiB of images in "
              f"{r.files} file(s){' (already complete)' if r.already else ''}")
    print(f"  {a.out}")
    return 0


def _run_show(a: argparse.Namespace) -> int:
    from .show import show

    show(a.path, split=a.split, count=a.count, pick=a.pick, seed=a.seed, classes=a.classes,
         transform=a.transform, size=a.size, out=a.out, tile=a.tile, columns=a.columns,
         overwrite=a.overwrite, listing=not a.no_list)
    return 0


def add_commands(sub: Any) -> None:
    """Add the dataset tools' subcommands to ``sub`` (``add_subparsers()``'s result)."""
    p = sub.add_parser("show", help="a contact sheet (PNG) and a listing of some records",
                       description="List N records (index, source name, label, class, size, "
                                   "dimensions) and, with --out, draw them on a contact sheet "
                                   "with each tile's index, label and class name.")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("--split", help="the split of a folder to show (default: train, else the first)")
    p.add_argument("-n", "--count", type=int, default=16, help="records to show (%(default)s)")
    p.add_argument("--pick", choices=("first", "random"), default="first",
                   help="the first records in database order, or random ones drawn with "
                        "--seed (%(default)s)")
    p.add_argument("--classes", nargs="+", metavar="CLASS",
                   help="only records of these classes (names or label numbers)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of --pick random and of the train transform's crops (%(default)s)")
    p.add_argument("--transform", choices=("none", "train", "eval"), default="none",
                   help="draw the records as stored (none), or as the model sees them after "
                        "the ImageNet train transform (RandomResizedCrop + flip) or the eval "
                        "transform (Resize + CenterCrop) at --size (%(default)s)")
    p.add_argument("--size", type=int, default=224, help="the transforms' output size (%(default)s)")
    p.add_argument("--out", metavar="PNG", help="write the contact sheet to this PNG file")
    p.add_argument("--tile", type=int, default=224, metavar="PX",
                   help="the side of a tile's image on the sheet (%(default)s)")
    p.add_argument("--columns", type=int, help="tiles per row (default: about square)")
    p.add_argument("--no-list", action="store_true", help="do not print the listing")
    p.add_argument("--overwrite", action="store_true", help="replace the PNG if it exists")
    p.set_defaults(fn=_run_show)

    p = sub.add_parser("subset", help="copy chosen records (classes, per class, fraction) "
                                      "to a new database")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("out", help="output folder (ILSVRC-<split>.lmdb and ILSVRC-<split>.classes.tsv)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--classes", nargs="+", metavar="CLASS",
                   help="keep these classes (names or label numbers)")
    g.add_argument("--first-classes", type=int, metavar="N", help="keep the first N classes")
    g.add_argument("--random-classes", type=int, metavar="N",
                   help="keep N classes drawn with --seed")
    g2 = p.add_mutually_exclusive_group()
    g2.add_argument("--per-class", type=int, metavar="M",
                    help="keep M images of each kept class, drawn with --seed")
    g2.add_argument("--fraction", type=float, metavar="F",
                    help="keep this fraction (0-1] of each kept class's images, drawn with --seed")
    p.add_argument("--complement", action="store_true",
                   help="keep the records the other options do NOT choose (with the same "
                        "--seed: the rest of the database)")
    p.add_argument("--renumber", action="store_true",
                   help="renumber the kept classes' labels 0..K-1 (default: keep the labels "
                        "and the whole class list)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (%(default)s)")
    p.add_argument("--shards", type=int, default=1, help="files per split (%(default)s)")
    _common(p)
    p.set_defaults(fn=_run_subset)

    p = sub.add_parser("reshard", help="copy a database into another number of shard files")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("out", help="output folder")
    p.add_argument("--shards", type=int, required=True, help="files per split")
    p.add_argument("--shard-ids", type=int, nargs="+", metavar="K",
                   help="write only these shards (0-based), e.g. one process or machine each")
    _common(p)
    p.set_defaults(fn=_run_reshard)

    p = sub.add_parser("merge", help="merge databases into one split, or by split name")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="database files or folders (every split in them), in the order their "
                        "records are written")
    p.add_argument("out", help="output folder")
    p.add_argument("--into", metavar="SPLIT",
                   help="merge everything into this split (default: by split name, train with "
                        "train, val with val, ...)")
    p.add_argument("--shards", type=int, default=1, help="files per split (%(default)s)")
    p.add_argument("--shuffle", action="store_true",
                   help="reshuffle the merged records with --seed (two sequential passes)")
    p.add_argument("--seed", type=int, default=0, help="seed of --shuffle (%(default)s)")
    p.add_argument("--memory-budget", type=size_arg, metavar="SIZE",
                   help="with --shuffle: memory for the records (e.g. 4G, default 4G); more "
                        "than this goes through --scratch")
    p.add_argument("--scratch", metavar="DIR",
                   help="with --shuffle: folder for the shuffle's buckets, about the split's "
                        "size (default: the output folder); removed at the end")
    _common(p, split=False)
    p.set_defaults(fn=_run_merge)

    p = sub.add_parser("export", help="write a database as a class-folder tree or webdataset shards")
    p.add_argument("path", help=_PATH_HELP)
    p.add_argument("out", help="output folder (written as OUT.partial, renamed when complete)")
    p.add_argument("--format", choices=("tree", "webdataset"), default="tree",
                   help="class folders <split>/<class>/<file> (%(default)s), or webdataset "
                        "tar shards <split>-NNNNNN.tar")
    p.add_argument("--targets", choices=("cls", "json"), default="cls",
                   help="webdataset: the label as <key>.cls, or <key>.json with label, class "
                        "name and source path (%(default)s; other targets are always .json)")
    p.add_argument("--shard-size", type=size_arg, default=1 << 30, metavar="SIZE",
                   help="webdataset: start a new tar after this many bytes (default 1G)")
    _common(p)
    p.set_defaults(fn=_run_export)
