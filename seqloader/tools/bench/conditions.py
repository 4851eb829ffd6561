"""The ``conditions`` of the JSON document: the machine, the software, the settings and
the data (sizes, storage, a sample of it)."""
from __future__ import annotations

import argparse
import os
import platform
import socket
from datetime import datetime
from typing import Any

from .data import _db_sample, _files_sample
from .host import _cpu_model, _meminfo, _storage
from .measure import MB, MIN_CPU_WINDOW
from .modes import DECODE_CROP
from .procs import _CLK_TCK, _usable_cores
from .sources import _Sources


def _conditions(args: argparse.Namespace, src: _Sources, loaders: list[str], modes: list[str],
                workers: list[int]) -> dict[str, Any]:
    import multiprocessing as mp

    import cv2
    import torch

    from ... import __version__

    mem = _meminfo()
    db_info = files_info = None
    if src.db is not None:
        db = src.db
        size = db.file_bytes
        db_info = {"path": str(src.db_path), "files": [str(q) for q in db.paths],
                   "num_records": db.num_records, "num_classes": len(db.classes),
                   "size_mb": round(size / MB, 3), "image_mb": round(db.image_bytes / MB, 3),
                   "fits_in_ram": bool(mem.get("MemTotal")) and size < mem.get("MemTotal", 0),
                   "storage": _storage(db.paths[0]), "sample": _db_sample(db)}
    if src.scan is not None:
        sample = _files_sample(src.scan)
        files_info = {"root": str(src.scan.root), "num_images": len(src.scan),
                      "num_classes": len(src.scan.classes), "scan_s": round(src.scan_s, 3),
                      "excluded_bad_files": src.files_excluded,
                      "size_mb_estimate": round((sample["mean_bytes"] or 0) * len(src.scan) / MB,
                                                3),
                      "storage": _storage(src.scan.root), "sample": sample}
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
        f"(clock-tick resolution, 1/{_CLK_TCK} s; not given for windows under "
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
    if max(workers) > _usable_cores():
        notes.append(f"some runs use more workers ({max(workers)}) than usable cores "
                     f"({_usable_cores()})")
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "kernel": kernel, "platform": platform.platform(),
        "python": platform.python_version(), "seqloader_version": __version__,
        "torch_version": torch.__version__, "opencv_version": cv2.__version__,
        "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "cpu_affinity": _usable_cores(),
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

