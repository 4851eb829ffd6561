"""The ``seqloader bench`` command: its arguments, their checks, and the runs in order."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Sequence

from ...read.direct import IO_MODES
from .conditions import _conditions
from .modes import LOADERS, MODES
from .procs import _usable_cores, process_tree
from .quality import _quality
from .report import format_report
from .run import _BYSTANDERS, _cpu_limit_rows, _run_one
from .sources import _Sources

__all__ = ["add_bench_arguments", "run_bench", "main", "bench"]


def _split_list(values: Sequence[str] | None) -> list[str]:
    return [x.strip() for v in values or [] for x in str(v).split(",") if x.strip()]


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``seqloader bench`` arguments to ``p``."""
    from ...read.plan import DEFAULT_CACHE

    p.add_argument("path", metavar="PATH",
                   help="a database (.lmdb file, or the folder holding ILSVRC-<split>.lmdb) "
                        "or, for --loader files, a class-folder tree")
    p.add_argument("--split", help="split name (default: a database file's own; for a folder, "
                                   "train, or its first split without train: bench measures one)")
    p.add_argument("--loader", choices=("seqloader", "files", "both"), default="seqloader",
                   help="what to measure (%(default)s)")
    p.add_argument("--files", metavar="DIR",
                   help="class-folder tree (or a root holding <split>/) for --loader files "
                        "when PATH is a database")
    p.add_argument("--mode", action="append", metavar="MODE",
                   help="raw, decode, full, cpu-limit or all (= raw,decode,full); repeat or "
                        "comma-separate (default: all)")
    p.add_argument("--workers", action="append", metavar="N",
                   help="worker processes; repeat or comma-separate, e.g. 1,2,4 "
                        "(default: the usable cores)")
    p.add_argument("--batch-size", type=int, default=256, help="images per batch (%(default)s)")
    p.add_argument("--batches", type=int, metavar="N",
                   help="measured batches per run (after warm-up)")
    p.add_argument("--seconds", type=float, metavar="S",
                   help="measured seconds per run (default 20 if --batches is not given)")
    p.add_argument("--warmup", type=int, default=2, metavar="K",
                   help="batches excluded from the rates (%(default)s)")
    p.add_argument("--cache", type=int, default=DEFAULT_CACHE,
                   help="seqloader's shuffle buffer in records, the Loader's cache= (%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="shuffle/augmentation seed (%(default)s)")
    p.add_argument("--io", choices=IO_MODES, default="auto",
                   help="seqloader's reads: through the page cache or direct I/O, the Loader's "
                        "io= (%(default)s: direct for databases larger than half the RAM)"),
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"),
                   help="worker start method for both loaders (default: the platform's)")
    p.add_argument("--cold", action="store_true",
                   help="evict the data from the page cache before each run (fadvise, no root)")
    p.add_argument("--no-rehearsal", action="store_true",
                   help="with --cold: do not rehearse each run for one batch before evicting the "
                        "data (then first-use faults in libraries count too)")
    p.add_argument("--quality", action="store_true", help="also report shuffle-quality metrics")
    p.add_argument("--json", action="store_true", help="print one JSON document (see module doc)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _parse(args: argparse.Namespace) -> tuple[list[str], list[str], list[int]]:
    loaders = list(LOADERS) if args.loader == "both" else [args.loader]
    modes: list[str] = []
    for m in _split_list(args.mode) or ["all"]:
        for x in (("raw", "decode", "full") if m == "all" else (m,)):
            if x not in MODES:
                raise ValueError(f"--mode {m!r}: use raw, decode, full, cpu-limit or all")
            if x not in modes:
                modes.append(x)
    try:
        workers = [int(w) for w in _split_list(args.workers)] or [_usable_cores()]
    except ValueError:
        raise ValueError(f"--workers {args.workers}: give integers, e.g. 1,2,4") from None
    if any(w < 0 for w in workers):
        raise ValueError(f"--workers must be >= 0, got {workers}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be >= 1, got {args.batches}")
    if args.seconds is not None and not 0 < args.seconds < math.inf:  # (NaN fails too)
        raise ValueError(f"--seconds must be a finite number > 0, got {args.seconds} "
                         "(for a fixed amount of work give --batches N instead)")
    if args.cache < 1:
        raise ValueError(f"--cache must be >= 1, got {args.cache}")
    if args.batches is None and args.seconds is None:
        args.seconds = 20.0
    return loaders, modes, list(dict.fromkeys(workers))


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by ``args`` (see :func:`add_bench_arguments`) and
    return the JSON document."""
    from multiprocessing import resource_tracker

    loaders, modes, workers = _parse(args)
    src = _Sources(args, loaders)
    progress = not args.no_progress
    conditions = _conditions(args, src, loaders, modes, workers)
    # start multiprocessing's resource tracker (a child process seqloader's shared memory
    # needs) now, so it is not counted in the first run's memory and every run is alike
    resource_tracker.ensure_running()
    _BYSTANDERS.clear()
    _BYSTANDERS.update(process_tree()[1:])
    results: list[dict[str, Any]] = []
    try:
        for loader in loaders:
            for mode in modes:
                if mode == "cpu-limit":
                    results.extend(_cpu_limit_rows(args, src, loader, workers))
                    continue
                for w in workers:
                    results.append(_run_one(args, src, loader, mode, w, progress))
    except Exception:
        if results:  # what was measured before the failure is not lost
            print("seqloader bench: a run failed; the runs before it measured:\n"
                  + format_report({"conditions": conditions, "results": results,
                                   "quality": None}), file=sys.stderr)
        raise
    quality = _quality(args, src, loaders, workers) if args.quality else None
    return {"conditions": conditions, "results": results, "quality": quality}


def run_bench(args: argparse.Namespace) -> int:
    """``seqloader bench``: measure, print the report (or JSON), return 0.  Errors
    (bad path, bad arguments) raise FileNotFoundError/ValueError naming the problem."""
    doc = bench(args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(format_report(doc))
    sys.stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from ...errors import FormatError

    doc = sys.modules[__package__].__doc__ or ""  # the package's: the command's manual
    ap = argparse.ArgumentParser(prog="seqloader bench", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run_bench(args)
    except (FormatError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"seqloader bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seqloader bench: interrupted", file=sys.stderr)
        return 130

