#!/usr/bin/env python
"""Memory of a training Loader over many epochs: does it stay bounded?

    python benchmarks/memory_epochs.py --data DIR [--epochs 20] [--wait] [--out DIR]

Builds (or reuses) a database of 6,400 images (hard links to 64 images per class of the
hdd_compare tree ``DATA/imagenet-synth``, preprocessed into ``DATA/lmdb-mem``), then
iterates ``Loader(db, 'train', <ImageNet training transform>, batch_size=256,
shuffle=True, num_workers=2, cache=5000)`` for ``--epochs`` epochs with a warm page
cache, touching each batch like a training step would (and dropping it).

A sampler thread reads ``/proc/<pid>/smaps_rollup`` of the whole process tree (this
process and its workers, found with ``seqloader.tools.bench.process_tree``) every 0.2 s and
keeps per-epoch peaks of the sums of Rss, Pss, USS (Private_Clean+Private_Dirty),
Anonymous, and Pss split into anonymous, file-backed and shared-memory (shmem) pages.
Per epoch it also records the time from ``iter(loader)`` to the first batch (epoch 0
includes starting the workers) and images/s.

The documented bound (README "Performance", Loader docstring): ``num_workers x prefetch``
shared-memory batch buffers of ``spec.slot_nbytes`` each, plus ``cache`` records of
encoded JPEGs held as page cache (``cache x mean record size``), plus fixed overhead
(the interpreter, torch and OpenCV in the main process -- measured here before the
Loader is created -- and in each worker).  Writes ``memory.md`` and ``.json`` into
``--out`` (default: the current directory; ``--out benchmarks/results`` to update the
committed ones).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from seqloader.read.iomode import IO_MODES  # noqa: E402
from benchpaths import add_data_argument, add_out_argument, out_dir  # noqa: E402
from hdd_compare import (REPO, CpuAccount, drops, fmt, git_state, log, loadavg,  # noqa: E402
                         machine, machine_md, run_cmd, wait_quiet, warm_files)

KEYS = {"Rss:": "rss", "Pss:": "pss", "Private_Clean:": "uss", "Private_Dirty:": "uss",
        "Anonymous:": "anon", "Pss_Anon:": "pss_anon", "Pss_File:": "pss_file",
        "Pss_Shmem:": "pss_shmem"}
FIELDS = ("rss", "pss", "uss", "anon", "pss_anon", "pss_file", "pss_shmem")


def smaps(pid: int) -> dict | None:
    out = dict.fromkeys(FIELDS, 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                k = KEYS.get(parts[0]) if parts else None
                if k:
                    out[k] += int(parts[1])
    except (OSError, ValueError, IndexError):
        return None
    return out


class Sampler:
    """Per-epoch peaks of the process tree's memory (kB), sampled every ``interval`` s."""

    def __init__(self, interval: float = 0.2):
        from seqloader.tools.bench import process_tree

        self.tree = process_tree
        self.interval = interval
        self.lock = threading.Lock()
        self.peak = dict.fromkeys(FIELDS, 0)
        self.peak_by_proc: dict = {}
        self.nproc = 0
        self.samples = 0
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> None:
        total = dict.fromkeys(FIELDS, 0)
        per = {}
        pids = self.tree()
        for p in pids:
            m = smaps(p)
            if m is None:
                continue
            per[p] = m
            for k in FIELDS:
                total[k] += m[k]
        with self.lock:
            self.samples += 1
            self.nproc = max(self.nproc, len(per))
            for k in FIELDS:
                self.peak[k] = max(self.peak[k], total[k])
            if total["pss"] >= self.peak_by_proc.get("_pss", 0):
                self.peak_by_proc = {"_pss": total["pss"], **{str(p): m for p, m in per.items()}}

    def take(self) -> dict:
        """The peaks since the last take (MB), and reset."""
        self.sample()
        with self.lock:
            out = {f"peak_{k}_mb": round(v * 1024 / 1e6, 1) for k, v in self.peak.items()}
            out["processes"] = self.nproc
            out["samples"] = self.samples
            out["at_peak_pss_by_process_mb"] = {
                p: {k: round(v * 1024 / 1e6, 1) for k, v in m.items()}
                for p, m in self.peak_by_proc.items() if p != "_pss"}
            self.peak = dict.fromkeys(FIELDS, 0)
            self.peak_by_proc, self.nproc, self.samples = {}, 0, 0
        return out

    def run(self) -> None:
        while not self.stop_ev.wait(self.interval):
            try:
                self.sample()
            except Exception:
                pass

    def start(self) -> "Sampler":
        self.th.start()
        return self

    def stop(self) -> None:
        self.stop_ev.set()
        self.th.join()


def build(args) -> Path:
    src = Path(args.data) / "imagenet-synth" / "train"
    tree = Path(args.data) / f"mem-{args.classes * args.per_class}"
    db_dir = Path(args.data) / "lmdb-mem"
    if not (tree / "train").is_dir():
        classes = sorted(os.listdir(src))[:args.classes]
        for c in classes:
            (tree / "train" / c).mkdir(parents=True, exist_ok=True)
            for i in range(args.per_class):
                os.link(src / c / f"{c}_{i}.JPEG", tree / "train" / c / f"{c}_{i}.JPEG")
    if not (db_dir / "ILSVRC-train.lmdb").exists():
        run_cmd([sys.executable, str(REPO / "preprocess_sequential.py"), str(tree), str(db_dir),
                 "--splits", "train", "--no-progress"], check=True, cwd=REPO)
    return db_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(ap)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=int, default=5000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--wait", action="store_true")
    ap.add_argument("--io", choices=IO_MODES, default="auto",
                    help="the Loader's io= (%(default)s); other than auto the results go to "
                         "memory-<io>.md/.json")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the .md from the .json in --out")
    add_out_argument(ap)
    args = ap.parse_args()
    stem = "memory" if args.io == "auto" else f"memory-{args.io}"
    out_json = out_dir(args) / f"{stem}.json"
    if args.report_only:
        doc = json.loads(out_json.read_text())
        write_md(doc, out_json.with_suffix(".md"))
        return 0
    db_dir = build(args)

    import torch  # noqa: F401 -- loaded before the first sample, so the base includes it
    from multiprocessing import resource_tracker

    from seqloader import Loader
    from seqloader.tools.bench import imagenet_train_transform

    git = git_state()
    db_file = db_dir / "ILSVRC-train.lmdb"
    warmed = warm_files([str(db_file)])
    cond = wait_quiet(args.max_load, enabled=args.wait)
    resource_tracker.ensure_running()  # a child that SharedMemory needs: count it from the start
    sampler = Sampler()
    sampler.sample()
    base = sampler.take()
    log(f"base (before the Loader): PSS {base['peak_pss_mb']} MB, anon {base['peak_anon_mb']} MB")
    sampler.start()
    acct = CpuAccount()
    t_construct = time.perf_counter()
    loader = Loader(db_dir, "train", imagenet_train_transform(), batch_size=args.batch_size,
                    shuffle=True, num_workers=args.workers, cache=args.cache, io=args.io)
    spec = loader.batch_spec
    db = loader.db
    mean_record = db.file_bytes / db.num_records
    mean_image = db.image_bytes / db.num_records
    bound = {
        "num_workers": args.workers, "prefetch": loader.prefetch,
        "slot_nbytes": spec.slot_nbytes, "slot_output_nbytes": spec.output_nbytes,
        "slot_tail_nbytes": spec.tail_nbytes,
        "shm_mb": round(args.workers * loader.prefetch * spec.slot_nbytes / 1e6, 1),
        "cache": args.cache, "mean_record_bytes": round(mean_record),
        "mean_image_bytes": round(mean_image),
        "cache_mb": round(args.cache * mean_image / 1e6, 1),
        "fixed_main_mb": base["peak_pss_mb"],
        "db_file_mb": round(db.file_bytes / 1e6, 1), "num_records": db.num_records,
    }
    epochs = []
    try:
        for e in range(args.epochs):
            eacct = CpuAccount()
            t0 = time.perf_counter()
            it = iter(loader)
            first = None
            n = 0
            for images, labels in it:
                if first is None:
                    first = time.perf_counter() - (t_construct if e == 0 else t0)
                # a training step reads the batch; keep it short (the CPU goes to decoding)
                float(images[0, 0, 0, 0]) + int(labels[0])
                n += len(labels)
                del images, labels
            dt = time.perf_counter() - t0
            s = sampler.take()
            row = {"epoch": e, "images": n, "batches": len(loader), "seconds": round(dt, 2),
                   "images_per_s": round(n / dt, 1), "first_batch_s": round(first, 3),
                   "load": loadavg(), "others_cpu_pct": eacct.result()["others_cpu_pct"], **s}
            epochs.append(row)
            log(f"epoch {e}: {n} img in {dt:.1f} s ({n / dt:.0f}/s), first batch {first:.2f} s, "
                f"peak PSS {s['peak_pss_mb']} MB (anon {s['peak_pss_anon_mb']}, file "
                f"{s['peak_pss_file_mb']}, shmem {s['peak_pss_shmem_mb']}), USS "
                f"{s['peak_uss_mb']} MB, anon RSS {s['peak_anon_mb']} MB, {s['processes']} procs, "
                f"load {row['load']}")
    finally:
        loader.close()
        sampler.stop()
    cpu_acct = acct.result()
    fixed_workers = None
    if epochs:
        by = epochs[-1]["at_peak_pss_by_process_mb"]
        me = str(os.getpid())
        fixed_workers = round(sum(v["pss_anon"] for p, v in by.items() if p != me), 1)
    bound["fixed_workers_anon_mb"] = fixed_workers
    bound["total_mb"] = round(bound["shm_mb"] + bound["cache_mb"] + bound["fixed_main_mb"]
                              + (fixed_workers or 0), 1)
    doc = {"machine": machine(args.data), "git": git, "settings": vars(args), "db": str(db_file),
           "warmed": warmed, **cond, "base_before_loader": base, "bound": bound,
           "epochs": epochs, "load_after": loadavg(), "drops_after": drops(),
           "cpu_account": cpu_acct,
           "command": " ".join([sys.executable, *sys.argv])}
    out_json.write_text(json.dumps(doc, indent=2))
    write_md(doc, out_json.with_suffix(".md"))
    return 0


def write_md(doc: dict, path: Path) -> None:
    b, E = doc["bound"], doc["epochs"]
    s = doc["settings"]
    L = ["# Loader memory over epochs", "",
         f"Measured by `benchmarks/memory_epochs.py`. **Machine.** {machine_md(doc['machine'])}", "",
         f"`Loader(db, 'train', RandomResizedCrop(224)+flip+ToTensor+Normalize, batch_size="
         f"{s['batch_size']}, shuffle=True, num_workers={s['workers']}, cache={s['cache']}, "
         f"io={s.get('io', 'auto')!r})` over "
         f"{b['num_records']} synthetic ImageNet-like images ({b['db_file_mb']:.0f} MB database, mean "
         f"{b['mean_image_bytes']} B per JPEG), {len(E)} epochs, warm page cache; each batch is "
         "touched and dropped. Peaks per epoch of sums over the process tree (main + workers + "
         "multiprocessing's resource tracker), sampled every 0.2 s from smaps_rollup. PSS = "
         "PSS anon + PSS file (mapped file pages: libraries and the database's memory map) + "
         "PSS shmem (the shared-memory batch buffers). USS = private pages (includes file pages "
         "mapped by one process only). MB = 10^6 B. Load = 1/5/15-min average after the epoch "
         f"(our 3 processes keep it near 2); before the run: {' / '.join(map(str, doc['load_before']))}. "
         "Others' CPU % = CPU used by other processes on the machine during the epoch, in % of "
         f"one core. Code: commit {doc.get('git', {}).get('commit')}"
         f"{' with uncommitted edits' if doc.get('git', {}).get('dirty') else ''}.", "",
         "| epoch | s | images/s | first batch (s) | peak PSS | PSS anon | PSS file | PSS shmem | "
         "peak USS | peak anon RSS | peak RSS | load | others' CPU % |",
         "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in E:
        L.append(f"| {r['epoch']} | {r['seconds']:.1f} | {r['images_per_s']:.0f} | "
                 f"{r['first_batch_s']:.2f} | {r['peak_pss_mb']:.0f} | {r['peak_pss_anon_mb']:.0f} | "
                 f"{r['peak_pss_file_mb']:.0f} | {r['peak_pss_shmem_mb']:.0f} | {r['peak_uss_mb']:.0f} | "
                 f"{r['peak_anon_mb']:.0f} | {r['peak_rss_mb']:.0f} | {' / '.join(map(str, r['load']))} | "
                 f"{fmt(r.get('others_cpu_pct'), '.0f')} |")
    L += ["", "(epoch 0's first batch includes constructing the Loader and starting the workers.)",
          "", "## The documented bound, from the Loader's settings", "",
          f"* shared-memory batch buffers: num_workers x prefetch x `spec.slot_nbytes` = "
          f"{b['num_workers']} x {b['prefetch']} x {b['slot_nbytes'] / 1e6:.1f} MB "
          f"(output {b['slot_output_nbytes'] / 1e6:.1f} MB = {s['batch_size']} x 3x224x224 "
          "float32 + labels; "
          f"tail {b['slot_tail_nbytes'] / 1e6:.1f} MB; the encoded records ride over the last "
          f"samples, NOTE [ batch buffer layout ]) = **{b['shm_mb']:.0f} MB**",
          f"* shuffle buffer: cache x mean JPEG = {b['cache']} x {b['mean_image_bytes']} B = "
          f"**{b['cache_mb']:.0f} MB** " + (
              "of private memory (direct I/O: each record a copy; plus the 128 MB ring its "
              "reads land in, not counted here)" if s.get("io") == "direct" else
              "of page cache (memoryviews into the map, not private)"),
          f"* fixed: main process before the Loader (Python, torch, OpenCV) PSS "
          f"**{b['fixed_main_mb']:.0f} MB**; workers' anonymous memory at the last peak "
          f"**{fmt(b['fixed_workers_anon_mb'], '.0f')} MB**",
          f"* total: **{b['total_mb']:.0f} MB**", ""]
    if E:
        first, last = E[0], E[-1]
        mx = max(E, key=lambda r: r["peak_pss_mb"])
        L += ["## Summary", "",
              f"* peak PSS: epoch 0 {first['peak_pss_mb']:.0f} MB, max {mx['peak_pss_mb']:.0f} MB "
              f"(epoch {mx['epoch']}), last {last['peak_pss_mb']:.0f} MB; growth from epoch 1 to "
              f"the last: {last['peak_pss_mb'] - E[min(1, len(E) - 1)]['peak_pss_mb']:+.0f} MB",
              f"* peak PSS anon+shmem (memory the kernel cannot reclaim): epoch 0 "
              f"{first['peak_pss_anon_mb'] + first['peak_pss_shmem_mb']:.0f} MB, last "
              f"{last['peak_pss_anon_mb'] + last['peak_pss_shmem_mb']:.0f} MB",
              f"* peak USS: epoch 0 {first['peak_uss_mb']:.0f} MB, last {last['peak_uss_mb']:.0f} MB",
              f"* time to first batch: epoch 0 {first['first_batch_s']:.2f} s, later epochs "
              f"{min(r['first_batch_s'] for r in E[1:]) if len(E) > 1 else float('nan'):.2f}-"
              f"{max(r['first_batch_s'] for r in E[1:]) if len(E) > 1 else float('nan'):.2f} s", ""]
    L += ["## Command", "", "```", doc["command"], "```", ""]
    path.write_text("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    sys.exit(main())
