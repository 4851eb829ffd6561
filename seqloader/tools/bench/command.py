"""The ``seqloader bench`` command: its arguments and their checks, the runs in order,
and the document's ``conditions`` (machine, software, settings, data) and ``quality``."""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import sys
from datetime import datetime
from typing import Any, Sequence

import numpy as np

from ...read.iomode import IO_MODES
from .data import Inputs, db_sample, files_sample
from .machine import CLK_TCK, cpu_model, meminfo, process_tree, storage, usable_cores
from .measure import MB, MIN_CPU_WINDOW
from .report import format_report
from ..remoteargs import add_remote_arguments, apply_remote_arguments
from .runs import BYSTANDERS, DECODE_CROP, LOADERS, MODES, cpu_limit_rows, run_one

__all__ = ["add_bench_arguments", "run_bench", "main", "bench", "conditions_of"]


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
    add_remote_arguments(p)


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
        workers = [int(w) for w in _split_list(args.workers)] or [usable_cores()]
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
    src = Inputs(args, loaders)
    progress = not args.no_progress
    conditions = conditions_of(args, src, loaders, modes, workers)
    # start multiprocessing's resource tracker (a child process seqloader's shared memory
    # needs) now, so it is not counted in the first run's memory and every run is alike
    resource_tracker.ensure_running()
    BYSTANDERS.clear()
    BYSTANDERS.update(process_tree()[1:])
    results: list[dict[str, Any]] = []
    try:
        for loader in loaders:
            for mode in modes:
                if mode == "cpu-limit":
                    results.extend(cpu_limit_rows(args, src, loader, workers))
                    continue
                for w in workers:
                    results.append(run_one(args, src, loader, mode, w, progress))
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
    from ...errors import USER_ERRORS, one_line
    from ...read.remotefaults import redact

    doc = sys.modules[__package__].__doc__ or ""  # the package's: the command's manual
    ap = argparse.ArgumentParser(prog="seqloader bench", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    args = ap.parse_args(argv)
    try:
        apply_remote_arguments(args)
        return run_bench(args)
    except USER_ERRORS as e:  # NOTE [ one error boundary ] in errors.py
        print(f"seqloader bench: error: {redact(one_line(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("seqloader bench: interrupted", file=sys.stderr)
        return 130


def conditions_of(args: argparse.Namespace, src: Inputs, loaders: list[str], modes: list[str],
                  workers: list[int]) -> dict[str, Any]:
    """The ``conditions`` of the JSON document: the machine, the software, the settings and
    the data (sizes, storage, a sample of it)."""
    import multiprocessing as mp

    import cv2
    import torch

    from ...version import __version__

    mem = meminfo()
    db_info = files_info = None
    if src.db is not None:
        db = src.db
        size = db.file_bytes
        from ...read.remotefaults import redact  # (a URL's user info: never shown)

        db_info = {"path": redact(str(src.db_path)), "files": [redact(str(q)) for q in db.paths],
                   "num_records": db.num_records, "num_classes": len(db.classes),
                   "size_mb": round(size / MB, 3), "image_mb": round(db.image_bytes / MB, 3),
                   "fits_in_ram": bool(mem.get("MemTotal")) and size < mem.get("MemTotal", 0),
                   "storage": storage(db.paths[0]), "sample": db_sample(db)}
    if src.scan is not None:
        sample = files_sample(src.scan)
        files_info = {"root": str(src.scan.root), "num_images": len(src.scan),
                      "num_classes": len(src.scan.classes), "scan_s": round(src.scan_s, 3),
                      "excluded_bad_files": src.files_excluded,
                      "size_mb_estimate": round((sample["mean_bytes"] or 0) * len(src.scan) / MB,
                                                3),
                      "storage": storage(src.scan.root), "sample": sample}
    main_info = db_info or files_info
    s = main_info["sample"]
    try:
        uname = os.uname()
        kernel = f"{uname.sysname} {uname.release}"
    except AttributeError:
        kernel = platform.platform()
    cold = bool(args.cold)
    notes = [
        "first_batch_s: from constructing the loader and iter() to the first batch, "
        "including worker start-up and the shuffle-buffer fill",
        f"rates exclude the first {args.warmup} batch(es) of each run",
        "memory: peak sums over the main process and the processes started during the run "
        "(Rss double-counts shared pages; Pss splits them; USS = private pages; all include "
        "mapped file pages of the data, Anonymous does not)",
        "cpu_percent: utime+stime of that process tree / measured wall time; 100 = one core "
        f"(clock-tick resolution, 1/{CLK_TCK} s; not given for windows under "
        f"{MIN_CPU_WINDOW:g} s)",
        f"decode mode = full decode + {DECODE_CROP} px centre crop; full mode = "
        "RandomResizedCrop(224)+flip+ToTensor+Normalize (seqloader: fused pipeline with "
        "reduced-scale JPEG decoding; files: decode_rgb + the unfused transforms)",
        "seqloader decode/full MB/s = images/s x the database's mean encoded size",
    ]
    if cold:
        notes.append("cold: data pages evicted with posix_fadvise(DONTNEED) before each run; "
                     "directory/inode caches stay warm; pages mapped by other processes stay"
                     + ("" if args.no_rehearsal else "; each run rehearsed for one batch first, "
                        "so library code is cached (rehearsal_first_batch_s)"))
    if max(workers) > usable_cores():
        notes.append(f"some runs use more workers ({max(workers)}) than usable cores "
                     f"({usable_cores()})")
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "kernel": kernel, "platform": platform.platform(),
        "python": platform.python_version(), "seqloader_version": __version__,
        "torch_version": torch.__version__, "opencv_version": cv2.__version__,
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpu_affinity": usable_cores(),
        "mem_total_mb": round(mem["MemTotal"] / MB) if "MemTotal" in mem else None,
        "mem_available_mb": round(mem["MemAvailable"] / MB) if "MemAvailable" in mem else None,
        "loaders": loaders, "modes": modes, "workers": workers, "batch_size": args.batch_size,
        "warmup": args.warmup, "batches": args.batches, "seconds": args.seconds,
        "cache_state": "cold" if cold else "warm",
        "cold_method": ("posix_fadvise(POSIX_FADV_DONTNEED) per file before each run" if cold
                        else None),
        "seqloader_cache": args.cache, "seed": args.seed,
        "start_method": args.start_method or mp.get_start_method(allow_none=True) or
        mp.get_context().get_start_method(),
        "split": args.split,
        "images": db_info["num_records"] if db_info else files_info["num_images"],
        "mean_encoded_bytes": s["mean_bytes"],
        "mean_resolution": [s["mean_height"], s["mean_width"]],
        "units": "MB = 10^6 bytes; rates per second of wall time",
        "notes": notes, "database": db_info, "files": files_info,
    }


def _reader_cache(loader: Any) -> int:
    """The shuffle buffer (records) one reader of ``loader`` uses: the Loader's own
    figure (its whole ``cache`` with one reader per rank; ``cache // num_workers``
    when each worker reads), falling back to the loader's ``cache``."""
    try:
        return int(loader.batch_spec.cache)
    except Exception:
        return int(loader.settings.cache)


def _quality(args: argparse.Namespace, src: Inputs, loaders: list[str],
             workers: list[int]) -> dict[str, Any]:
    from ..quality import distinct_ratio, epoch_correlation, shuffle_quality

    out: dict[str, Any] = {"seqloader": None, "files": None}
    if "seqloader" in loaders:
        from ...loader import Loader

        rows = []
        for w in workers:
            ld = Loader(src.db_path, args.split, None, batch_size=args.batch_size, shuffle=True,
                        num_workers=w, cache=args.cache, seed=args.seed, rank=0, world_size=1)
            try:
                q = shuffle_quality(src.db.labels(), ld.plan_spec, cache=_reader_cache(ld))
                rows.append({"workers": w, "distinct_ratio": round(q.distinct_ratio, 4),
                             "epoch_correlation": round(q.epoch_correlation, 4),
                             "batch_size": q.batch_size, "cache_per_reader": q.cache,
                             "chunk_size": q.chunk_size})
            except ValueError as e:
                rows.append({"workers": w, "error": str(e)})
            finally:
                ld.close()
        out["seqloader"] = rows
    if "files" in loaders:
        labels = np.asarray(src.scan.labels, np.int64)
        rng = np.random.default_rng(args.seed)
        a, b = rng.permutation(len(labels)), rng.permutation(len(labels))
        try:
            out["files"] = {"distinct_ratio": round(float(np.mean(
                [distinct_ratio(labels, o, args.batch_size) for o in (a, b)])), 4),
                "epoch_correlation": round(epoch_correlation(a, b), 4)}
        except ValueError as e:
            out["files"] = {"error": str(e)}
    return out
