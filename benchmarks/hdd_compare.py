#!/usr/bin/env python
"""Files DataLoader vs seqloader, warm page cache and on a simulated hard disk.

    python benchmarks/hdd_compare.py --data DIR [--phase all] [--seconds 60] [--wait]
                                     [--only RUN_ID,...] [--hddsim PATH] [--out DIR]

Phases (``--phase``, repeatable or comma-separated; default ``all`` = all four):

``build``   a synthetic ImageNet-like tree (``seqloader synth``, 100 classes x 210 train
            images of ~100 KB = ~2.15 GB) under ``DATA/imagenet-synth`` and its database
            (``preprocess_sequential.py``, verify on) under ``DATA/lmdb-hdd``; reused when
            present.
``warm``    ``python -m seqloader.tools.bench`` with the data read into the page cache first:
            files and seqloader, raw with 1/2/4 workers, full with 2 workers, and the
            cpu-limit rows (decode+transform in one process x 2 cores).
``hdd``     the same loader runs under ``hddsim`` (``--hddsim``; page cache dropped,
            reads throttled to 100 IO/s and 150 MiB/s, like a 7200 rpm disk).
``report``  ``OUT/hdd_compare.md`` and ``.json`` from the runs' results.

``OUT`` is ``--out`` (default: the current directory; ``--out benchmarks/results`` to
update the committed results).  Every run is one process (``seqloader.tools.bench
--json``) and its JSON document is kept in ``OUT/raw/hdd_compare/<run id>.json`` with
the exact command, the load average before/after and the other processes that were
busy; ``report`` reads those, so phases can run at different times (a run whose file
exists is kept; ``--force`` redoes it).  Runs on the simulated disk are bounded to one
epoch (``--batches``): after that the data would be in the page cache.

``--wait``: before each run, wait until no ``shuffle_accuracy``/``pytest`` process runs
and the 1-minute load average is below ``--max-load`` (the machine is shared), and,
before each hddsim run, until no other hddsim runs.  The helpers here (machine
description, quiet-machine wait, page-cache warming) are imported by the other
benchmark scripts.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchpaths import (REPO, absolute, add_data_argument, add_hddsim_argument,  # noqa: E402
                        add_out_argument, need_hddsim, out_dir)

#: How a running simulator shows in ``pgrep -fa`` (``hddsim --dir DIR -- CMD``).
HDDSIM_RUNNING = "hddsim --dir"
BUSY_PATTERN = "shuffle_accuracy|pytest"
HDD_MBPS = 150          # hddsim's default bandwidth cap, MiB/s
HDD_IOPS = 100
MiB = 1 << 20
IMAGENET_TRAIN = 1_281_167
BAYESWATCH = {"files_h": 670, "sequential_h": 70, "epochs": 90,
              "note": "BayesWatch README: ResNet-18, ~90 epochs on an HDD, 670 h with the "
                      "file DataLoader vs 70 h with the sequential LMDB loader"}


# =========================================================================== shared helpers

def log(*a) -> None:
    print(f"[{datetime.now():%H:%M:%S}]", *a, file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_processes() -> list[str]:
    """Command lines of the other agents' CPU-heavy jobs (shuffle_accuracy, pytest)."""
    r = subprocess.run(["pgrep", "-fa", BUSY_PATTERN], capture_output=True, text=True)
    me = str(os.getpid())
    return [ln for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith(me + " ")]


def top_processes(n: int = 3) -> list[str]:
    r = subprocess.run(["ps", "-eo", "pcpu,pid,args", "--sort=-pcpu"], capture_output=True,
                       text=True)
    return [ln.strip()[:100] for ln in r.stdout.splitlines()[1:n + 1]]


def other_hddsim() -> list[str]:
    r = subprocess.run(["pgrep", "-fa", HDDSIM_RUNNING], capture_output=True, text=True)
    return [ln for ln in r.stdout.splitlines() if ln.strip()]


def cpu_busy(seconds: float = 2.0) -> float:
    """Fraction of all CPUs busy (any process) over ``seconds``, from /proc/stat."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]
        return sum(v), idle
    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return round(1 - (i1 - i0) / max(1, t1 - t0), 3)


def drops() -> int:
    """How often the page cache was dropped (``drop_pagecache`` in /proc/vmstat): hddsim
    runs of other users drop it globally, which would spoil a warm-cache measurement."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("drop_pagecache "):
                return int(line.split()[1])
    return -1


_TCK = os.sysconf("SC_CLK_TCK")


class CpuAccount:
    """CPU used on the whole machine during a run, minus what this process and its
    descendants used (waited-for ones through ``getrusage``, live ones -- e.g. a
    Loader's workers -- from ``/proc``): the other users' share, which disturbs a
    timing.  Also the hypervisor's steal time."""

    @staticmethod
    def _live() -> dict:
        from seqloader.tools.bench.machine import cpu_seconds, process_tree
        out = {}
        for pid in process_tree(os.getpid())[1:]:
            cpu = cpu_seconds(pid)
            if cpu is not None:
                out[pid] = cpu
        return out

    @classmethod
    def _snap(cls):
        import resource
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / _TCK  # user nice system irq softirq steal
        mine = sum(getattr(resource.getrusage(w), a) for w in
                   (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for a in ("ru_utime", "ru_stime"))
        return time.time(), busy, v[7] / _TCK, mine, cls._live()

    def __init__(self):
        self.start = self._snap()

    def result(self) -> dict:
        t1, b1, s1, m1, live1 = self._snap()
        t0, b0, s0, m0, live0 = self.start
        wall = max(1e-6, t1 - t0)
        # live descendants: their CPU since the start; ones that ended meanwhile are in
        # RUSAGE_CHILDREN with their whole lifetime, so their share before the start goes
        mine = (m1 - m0) + sum(v - live0.get(p, 0.0) for p, v in live1.items()) \
            - sum(v for p, v in live0.items() if p not in live1)
        return {"others_cpu_pct": round(100 * max(0.0, (b1 - b0) - mine) / wall, 1),
                "steal_pct": round(100 * (s1 - s0) / wall, 1), "mine_cpu_pct": round(100 * mine / wall, 1)}


def wait_quiet(max_load: float = 1.5, poll: float = 30, enabled: bool = True,
               max_busy: float = 0.25) -> dict:
    """Wait until no busy process, load1 < max_load and less than ``max_busy`` of the
    machine's CPU in use over 2 s; return the conditions at the start."""
    t0 = time.time()
    while enabled:
        b = busy_processes()
        la = loadavg()
        if not b and la[0] < max_load:
            busy = cpu_busy(2.0)
            if busy < max_busy:
                break
            b = [f"{100 * busy:.0f} % of the CPUs in use: {top_processes()}"]
        log(f"waiting for a quiet machine: load {la}, busy: {[x[:120] for x in b]}")
        time.sleep(poll)
    return {"load_before": loadavg(), "busy_before": busy_processes(),
            "cpu_busy_before": cpu_busy(2.0), "waited_s": round(time.time() - t0, 1),
            "drops_before": drops()}


def wait_hddsim(poll: float = 30, enabled: bool = True) -> None:
    """Wait until no other hddsim runs (it drops the page cache and throttles the disk)."""
    while enabled and other_hddsim():
        log(f"waiting for no other hddsim ({other_hddsim()[:1]})")
        time.sleep(poll)


def _read(path: str, cmd: list[str]) -> str | None:
    try:
        if cmd:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
        return Path(path).read_text().strip()
    except OSError:
        return None


def machine(data_dir: str | Path) -> dict:
    """A description of this machine and its software, for the reports."""
    import cv2
    import lmdb
    import numpy
    import torch

    from seqloader import __version__
    from seqloader.tools.bench.machine import cpu_model, meminfo, storage

    st = storage(str(data_dir))
    dev = os.path.basename(os.path.realpath(st["device"] or "")) or "vda"
    du = os.statvfs(str(data_dir))
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": cpu_model(), "cores": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "mem_total_gib": round(meminfo().get("MemTotal", 0) / 2**30, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "torch": torch.__version__, "opencv": cv2.__version__, "numpy": numpy.__version__,
        "lmdb": lmdb.__version__, "seqloader": __version__,
        "data_dir": str(data_dir), "storage": st,
        "disk_free_gb": round(du.f_bavail * du.f_frsize / 1e9, 1),
        "read_ahead_kb": _read(f"/sys/block/{dev}/queue/read_ahead_kb", []),
        "scheduler": _read(f"/sys/block/{dev}/queue/scheduler", []),
        "hddsim": f"hddsim (cgroup-v1 blkio: {HDD_IOPS} read IO/s, {HDD_MBPS} MiB/s on "
                  f"the device of --dir; page cache dropped with drop_caches=1 before the "
                  "command; dentries/inodes stay cached)",
        "git_head": _read("", ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
    }


def machine_md(m: dict) -> str:
    st = m["storage"]
    return (f"{m['cores']} cores ({m['cpu_model']}, KVM), {m['mem_total_gib']} GiB RAM, "
            f"Linux {m['kernel']}; data on {st['device']} ({st['fstype']}, "
            f"rotational={st['rotational']}, read_ahead_kb={m['read_ahead_kb']}, "
            f"scheduler {m['scheduler']}), {m['disk_free_gb']} GB free; Python {m['python']}, "
            f"torch {m['torch']}, OpenCV {m['opencv']}, numpy {m['numpy']}, lmdb {m['lmdb']}, "
            f"seqloader {m['seqloader']} (git {m['git_head']}, uncommitted changes possible).")


def warm_files(paths, chunk: int = 8 << 20) -> dict:
    """Read every file of ``paths`` (into the page cache); return bytes and seconds."""
    t, n = time.perf_counter(), 0
    buf = bytearray(chunk)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                n += k
    return {"bytes": n, "seconds": round(time.perf_counter() - t, 2)}


def tree_files(root: str | Path) -> list[str]:
    out = []
    for dp, _, fs in os.walk(root):
        out.extend(os.path.join(dp, f) for f in fs)
    return sorted(out)


def git_state() -> dict:
    """The commit the code under test is at, and whether seqloader/ has uncommitted edits
    (the package is edited while benchmarks run: every run records its own state)."""
    head = _read("", ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = _read("", ["git", "-C", str(REPO), "status", "--porcelain", "--", "seqloader",
                       "preprocess_sequential.py"])
    return {"commit": head, "dirty": bool(dirty), "dirty_files": dirty.split("\n") if dirty else []}


def run_cmd(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    log("$", " ".join(shlex.quote(c) for c in cmd))
    return subprocess.run(cmd, **kw)


def timed_run(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float, dict, dict]:
    """:func:`run_cmd` plus what every recorded run keeps: (result, wall seconds, the git
    state before it, the machine's CPU account over it)."""
    git = git_state()
    acct = CpuAccount()
    t0 = time.time()
    r = run_cmd(cmd, **kw)
    return r, time.time() - t0, git, acct.result()


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


# =========================================================================== this benchmark

def paths(args) -> dict:
    d = Path(args.data)
    return {"tree": d / "imagenet-synth", "train": d / "imagenet-synth" / "train",
            "db_dir": d / "lmdb-hdd", "db": d / "lmdb-hdd" / "ILSVRC-train.lmdb",
            "raw": Path(args.out) / "raw" / "hdd_compare"}


def build(args) -> None:
    p = paths(args)
    if not p["train"].is_dir():
        run_cmd(["seqloader", "synth", str(p["tree"]), "--classes", str(args.classes),
                 "--per-class", str(args.per_class), "--val-per-class", "2", "--seed", "7",
                 "--size", "imagenet", "--workers", "2", "--no-progress"], check=True)
    if not p["db"].exists():
        run_cmd([sys.executable, str(REPO / "preprocess_sequential.py"), str(p["tree"]),
                 str(p["db_dir"]), "--splits", "train", "--no-progress"], check=True, cwd=REPO)
    files = tree_files(p["train"])
    size = sum(os.path.getsize(f) for f in files)
    log(f"tree: {len(files)} files, {size / 1e9:.2f} GB (mean {size / len(files):.0f} B); "
        f"db {os.path.getsize(p['db']) / 1e9:.2f} GB")


def run_list(args, n_images: int) -> list[dict]:
    """(id, loader, mode, workers, cache) of every run, in execution order."""
    runs = []
    for cache in ("warm", "hddsim"):
        for loader in ("seqloader", "files"):
            for mode, ws in (("raw", (1, 2, 4)), ("full", (2,))):
                for w in ws:
                    runs.append({"id": f"{loader}-{mode}-w{w}-{cache}", "loader": loader,
                                 "mode": mode, "workers": w, "cache": cache})
    runs.append({"id": "cpu-limit-w2-warm", "loader": "both", "mode": "cpu-limit",
                 "workers": 2, "cache": "memory"})
    # the same decode+transform in 2 processes at once, each writing into a 256-sample batch
    # buffer as a worker does (bench's cpu-limit runs 1 process into a 16-sample ring and x 2)
    runs.append({"id": "cpu-limit-concurrent-w2", "loader": "seqloader",
                 "mode": "cpu-limit-concurrent", "workers": 2, "cache": "memory"})
    # full mode on the disk after the shuffle buffer has filled and before it drains
    runs.append({"id": "seqloader-full-w2-hddsim-steady", "loader": "seqloader", "mode": "full",
                 "workers": 2, "cache": "hddsim", "steady": True})
    return runs


def steady_window(args, n_images: int) -> tuple[int, int]:
    """(warm-up batches, measured batches) between the shuffle buffer's fill (2 reads per
    output until it holds ``cache`` records: ~``cache`` outputs) and its drain (the last
    ``cache`` outputs need no reads)."""
    from seqloader.read.plan import DEFAULT_CACHE

    fill = -(-DEFAULT_CACHE // args.batch_size)  # each output while filling adds one record
    last = (n_images - DEFAULT_CACHE) // args.batch_size
    return fill, max(1, last - fill)


def bench_cmd(args, run: dict, n_images: int) -> list[str]:
    p = paths(args)
    if run["mode"] == "cpu-limit-concurrent":
        return [sys.executable, str(Path(__file__).resolve()), "--cpu-limit-child",
                str(run["workers"]), "--data", str(args.data)]  # (absolute)
    warmup = args.warmup
    if run.get("steady"):
        warmup, measured = steady_window(args, n_images)
    cmd = [sys.executable, "-m", "seqloader.tools.bench", str(p["db_dir"]), "--files", str(p["train"]),
           "--loader", run["loader"], "--mode", run["mode"], "--workers", str(run["workers"]),
           "--batch-size", str(args.batch_size), "--warmup", str(warmup),
           "--json", "--no-progress"]
    if run["mode"] == "cpu-limit":
        cmd += ["--seconds", "5"]
    else:
        cmd += ["--seconds", str(args.seconds)]
    if run.get("steady"):
        cmd += ["--batches", str(measured)]
    elif run["cache"] == "hddsim" and run["loader"] == "seqloader":
        # stay inside the first (cold) epoch: later epochs would be served by the page cache
        cmd += ["--batches", str(n_images // args.batch_size - args.warmup - 1)]
    if run["cache"] == "hddsim":
        # --cold: seqloader.tools.bench describes the data before the runs (100 records spread over
        # the database, 100 files); with this disk's read_ahead_kb=8192 every record read
        # through the memory map pulls ~8 MB around it into the page cache -- 59 % of the
        # 2.1 GB database was resident before the first run.  --cold evicts the data files
        # (posix_fadvise DONTNEED) right before the run, so the run starts cold again.
        cmd = [need_hddsim(args), "--dir", str(args.data), "--"] + cmd + ["--cold"]
    return cmd


def contended(rec: dict, max_others: float) -> bool:
    """The run was disturbed: someone else dropped the page cache, or used more than
    ``max_others`` % of a core meanwhile."""
    others = (rec.get("cpu_account") or {}).get("others_cpu_pct") or 0.0
    return bool(rec.get("disturbed")) or others > max_others


def retry(once, max_others: float, attempts: int, what: str) -> dict:
    """Call ``once(force)`` until a run is not :func:`contended` (at most ``attempts``
    times); return the clean run, else the least disturbed one (flagged)."""
    best = None
    for attempt in range(attempts):
        rec = once(attempt > 0)
        if rec.get("_cached"):
            return rec
        rec["attempt"] = attempt + 1
        if not contended(rec, max_others):
            rec["contended"] = False
            return rec
        others = (rec.get("cpu_account") or {}).get("others_cpu_pct")
        log(f"{what}: disturbed (others' CPU {others} %, cache dropped by others: "
            f"{rec.get('disturbed')}); attempt {attempt + 1}/{attempts}")
        if best is None or (others or 0) < ((best.get("cpu_account") or {}).get("others_cpu_pct") or 0):
            best = rec
    best["contended"] = True
    return best


def do_run(args, run: dict, n_images: int) -> dict:
    def once(force: bool) -> dict:
        saved, args.force = args.force, args.force or force
        try:
            return _do_run(args, run, n_images)
        finally:
            args.force = saved

    rec = retry(once, args.max_others, args.attempts, run["id"])
    if not rec.get("_cached"):
        (paths(args)["raw"] / f"{run['id']}.json").write_text(json.dumps(rec, indent=2))
    return rec


def _do_run(args, run: dict, n_images: int) -> dict:
    p = paths(args)
    p["raw"].mkdir(parents=True, exist_ok=True)
    out = p["raw"] / f"{run['id']}.json"
    if out.exists() and not args.force:
        log(f"{run['id']}: kept {out} (--force to redo)")
        return {**json.loads(out.read_text()), "_cached": True}
    if run["cache"] == "hddsim":
        wait_hddsim(enabled=args.wait)
    warm = None
    if run["cache"] == "warm":
        warm = warm_files([str(p["db"])] if run["loader"] == "seqloader" else tree_files(p["train"]))
    cond = wait_quiet(args.max_load, enabled=args.wait)
    cmd = bench_cmd(args, run, n_images)
    r, wall, git, cpu_acct = timed_run(cmd, capture_output=True, text=True, cwd=REPO)
    rec = {"run": run, "command": " ".join(shlex.quote(c) for c in cmd), "returncode": r.returncode,
           "wall_s": round(wall, 1), "warmed": warm, "git": git, "cpu_account": cpu_acct, **cond, "load_after": loadavg(),
           "busy_after": busy_processes(), "stderr_tail": r.stderr[-3000:],
           "drops_after": drops()}
    # one drop is our own hddsim's; any other means another process dropped the cache
    expected = cond["drops_before"] + (1 if run["cache"] == "hddsim" else 0)
    rec["disturbed"] = rec["drops_after"] != expected
    if r.returncode != 0:
        log(f"{run['id']} FAILED rc={r.returncode}\n{r.stderr[-3000:]}")
        rec["doc"] = None
    elif run["mode"] == "cpu-limit-concurrent":
        res = json.loads(r.stdout)
        rec["doc"] = {"conditions": None, "results": [{
            "loader": "seqloader", "mode": "cpu-limit-concurrent", "workers": run["workers"],
            "images_per_s": res["images_per_s"], "per_process": res["per_process"],
            "mb_per_s": None, "bytes_exact": False, "first_batch_s": None, "peak_pss_mb": None,
            "peak_uss_mb": None, "cpu_percent": 100.0 * run["workers"], "cold": False,
            "resident_before": None, "detail": res}]}
        log(f"  cpu-limit concurrent: {res}")
    else:
        rec["doc"] = json.loads(r.stdout)
        for row in rec["doc"]["results"]:
            log(f"  others' CPU during the run {cpu_acct}")
            log(f"  {row['loader']} {row['mode']} w{row['workers']}: {row['images_per_s']} img/s, "
                f"{row['mb_per_s']} MB/s, first {row['first_batch_s']} s, PSS {row['peak_pss_mb']}"
                f" MB, CPU {row['cpu_percent']} %, load {cond['load_before']}")
    out.write_text(json.dumps(rec, indent=2))
    return rec


# =========================================================================== report

def pct_hdd(mb_per_s):
    return None if mb_per_s is None else 100 * mb_per_s * 1e6 / (HDD_MBPS * MiB)


def report(args) -> None:
    p = paths(args)
    recs = []
    for run in run_list(args, 0):
        f = p["raw"] / f"{run['id']}.json"
        if f.exists():
            recs.append(json.loads(f.read_text()))
    rows = []
    for rec in recs:
        if not rec.get("doc"):
            continue
        for r in rec["doc"]["results"]:
            cache = rec["run"]["cache"] + ("-steady" if rec["run"].get("steady") else "")
            rows.append({**r, "cache_state": cache, "load_before": rec["load_before"],
                         "load_after": rec["load_after"], "busy_before": rec["busy_before"],
                         "cpu_busy_before": rec.get("cpu_busy_before"), "run_id": rec["run"]["id"],
                         "command": rec["command"], "git": rec.get("git"),
                         "cpu_account": rec.get("cpu_account"), "contended": rec.get("contended"),
                         "attempt": rec.get("attempt"),
                         "pct_hdd": pct_hdd(r["mb_per_s"]) if cache.startswith("hddsim") else None})

    def get(loader, mode, w, cache):
        for r in rows:
            if (r["loader"], r["mode"], r["workers"], r["cache_state"]) == (loader, mode, w, cache):
                return r
        return None

    d: dict = {"goals": []}

    def goal(name, value, target, ok, unit=""):
        d["goals"].append({"name": name, "value": None if value is None else round(value, 3),
                           "target": target, "met": None if value is None else bool(ok(value)),
                           "unit": unit})

    def ratio(a, b):
        return a["images_per_s"] / b["images_per_s"] if a and b and b["images_per_s"] else None

    for w in (1, 2, 4):
        s = get("seqloader", "raw", w, "hddsim")
        goal(f"seqloader raw under hddsim, {w} worker(s) (the same single reader), MB/s as % of "
             "150 MiB/s", s and s["pct_hdd"], ">= 90 %", lambda v: v >= 90, "%")
    for w in (1, 2, 4):
        goal(f"seqloader raw / files raw under hddsim, {w} worker(s) (images/s)",
             ratio(get("seqloader", "raw", w, "hddsim"), get("files", "raw", w, "hddsim")),
             ">= 10x", lambda v: v >= 10, "x")
    goal("seqloader full / files full under hddsim, 2 workers (images/s)",
         ratio(get("seqloader", "full", 2, "hddsim"), get("files", "full", 2, "hddsim")),
         ">= 5x", lambda v: v >= 5, "x")
    goal("seqloader full / files full under hddsim, 2 workers, steady state (images/s)",
         ratio(get("seqloader", "full", 2, "hddsim-steady"), get("files", "full", 2, "hddsim")),
         ">= 5x", lambda v: v >= 5, "x")
    lim = get("seqloader", "cpu-limit", 2, "memory")
    flim = get("files", "cpu-limit", 2, "memory")
    clim = get("seqloader", "cpu-limit-concurrent", 2, "memory")
    for cache in ("warm", "hddsim", "hddsim-steady"):
        s = get("seqloader", "full", 2, cache)
        for L, what in ((lim, "1 process x 2 cores"),
                        (clim, "2 processes at once, batch-sized output")):
            if L:
                goal(f"seqloader full {cache}, 2 workers, as % of the CPU limit "
                     f"({fmt(L['images_per_s'], '.0f')} img/s = {what})",
                     100 * ratio(s, L) if ratio(s, L) else None, ">= 90 %", lambda v: v >= 90, "%")
    for cache, tgt in (("warm", 1.0), ("hddsim", 2.0)):
        for mode, w in (("raw", 1), ("raw", 2), ("raw", 4), ("full", 2)):
            s = get("seqloader", mode, w, cache)
            goal(f"seqloader time to first batch, {mode} {w} worker(s), {cache}",
                 s and s["first_batch_s"], f"<= {tgt:g} s", lambda v, t=tgt: v <= t, "s")
    hours = []
    for mode, w, cache in (("raw", 2, "hddsim"), ("full", 2, "hddsim"), ("full", 2, "hddsim-steady")):
        for loader in ("files", "seqloader"):
            r = get(loader, mode, w, cache)
            if r and r["images_per_s"]:
                h = IMAGENET_TRAIN / r["images_per_s"] / 3600
                hours.append({"loader": loader, "mode": mode, "workers": w, "cache": cache,
                              "images_per_s": r["images_per_s"], "hours_per_epoch": round(h, 2),
                              "hours_90_epochs": round(90 * h, 1)})
    d["hours"] = hours
    conditions = None
    docs = [rec["doc"] for rec in recs if rec.get("doc") and rec["doc"].get("conditions")]
    if docs:
        conditions = dict(docs[0]["conditions"])
        for key in ("database", "files"):
            conditions[key] = next((x["conditions"][key] for x in docs if x["conditions"].get(key)), None)
    doc = {"machine": machine(args.data), "conditions_first_run": conditions, "rows": rows,
           "derived": d, "runs": [{k: rec.get(k) for k in (
               "run", "command", "returncode", "wall_s", "load_before", "load_after",
               "busy_before", "cpu_busy_before", "warmed", "git", "cpu_account", "contended",
               "attempt")} for rec in recs],
           "bayeswatch_claim": BAYESWATCH, "imagenet_train_images": IMAGENET_TRAIN}
    out = out_dir(args)
    (out / "hdd_compare.json").write_text(json.dumps(doc, indent=2))
    md = _markdown(doc, lim, flim, clim)
    (out / "hdd_compare.md").write_text(md)
    print(md)


def _commit(r: dict) -> str:
    g = r.get("git") or {}
    return (g.get("commit") or "?") + (" +edits" if g.get("dirty") else "")


def _markdown(doc: dict, lim, flim, clim=None) -> str:
    m, c = doc["machine"], doc["conditions_first_run"] or {}
    db, files = c.get("database") or {}, c.get("files") or {}
    L = ["# files DataLoader vs seqloader: warm page cache and a simulated 7200 rpm HDD", "",
         f"Measured {m['date']} by `benchmarks/hdd_compare.py`.", "",
         "**Machine.** " + machine_md(m), "",
         f"**hddsim.** {m['hddsim']}. Everything the command reads from `/dev/vda` is throttled "
         "(the data and also Python's own files; imports happen before the timed part).", ""]
    if db:
        s = db["sample"]
        L += [f"**Data.** Synthetic ImageNet-like JPEGs (`seqloader synth --size imagenet`, "
              f"quality 90): {db['num_records']} train images, {db['num_classes']} classes; "
              f"database {db['size_mb']:.0f} MB ({db['image_mb']:.0f} MB of JPEG), "
              f"mean {s['mean_bytes']:.0f} bytes, mean {s['mean_width']:.0f}x{s['mean_height']:.0f} px "
              f"(ImageNet: ~110 KB, ~400x350). The files loader reads the same images as "
              f"{files.get('num_images')} files under `{files.get('root')}`.", ""]
    L += ["**Runs.** `python -m seqloader.tools.bench` per row, batch 256, 2 warm-up batches excluded; "
          "warm rows: the data read into the page cache just before (`resident` = mincore), "
          "60 s measured; hddsim rows: page cache dropped, seqloader bounded to its first epoch "
          "(`--batches`), files 60 s; `hddsim-steady`: the seqloader full-mode run measured only "
          "between the shuffle buffer's fill (while it fills, every output costs two reads) and "
          "its drain (the last 5000 outputs cost none) -- what a long (ImageNet) epoch sees. "
          "hddsim runs pass `--cold` (bench's own description of the data, 100 records read "
          "through the memory map before the runs, pulls ~8 MB around each into the page cache "
          "with this disk's read_ahead_kb=8192: 59 % of the database was resident without it). "
          "In raw mode the seqloader Loader reads in the main process "
          "and starts no workers (workers only decode), so its 1/2/4-worker raw rows measure "
          "the same single reader. MB = 10^6 B; % of 150 MiB/s = MB/s / 157.3. PSS/USS: peak "
          "sums over the process tree, including mapped pages of the data files and shared "
          "memory. CPU % of one core (200 % = both cores). Load = 1/5/15-min load average "
          "just before the run (our own runs keep it near 1-2). Others' CPU % = CPU the rest of "
          "the machine used during the run (all CPU time minus this run's process tree), in % "
          "of one core: the other agents' work on this shared machine.", "",
          "| loader | mode | workers | cache state | images/s | MB/s | % of 150 MiB/s | "
          "time to first batch (s) | peak PSS (MB) | peak USS (MB) | CPU % | load before | "
          "others' CPU % | commit |",
          "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for r in doc["rows"]:
        if r["mode"].startswith("cpu-limit"):
            continue
        cs = r["cache_state"]
        if r.get("resident_before") is not None:
            cs += f" ({100 * r['resident_before']:.0f} % resident)"
        mbs = fmt(r["mb_per_s"]) + ("" if r["bytes_exact"] else " *")
        L.append(f"| {r['loader']} | {r['mode']} | {r['workers']} | {cs} | "
                 f"{fmt(r['images_per_s'])} | {mbs} | {fmt(r['pct_hdd'], '.0f') if r['pct_hdd'] is not None else '-'} | "
                 f"{fmt(r['first_batch_s'], '.2f')} | {fmt(r['peak_pss_mb'], '.0f')} | "
                 f"{fmt(r['peak_uss_mb'], '.0f')} | {fmt(r['cpu_percent'], '.0f')} | "
                 f"{' / '.join(str(x) for x in r['load_before'])} | "
                 f"{fmt((r.get('cpu_account') or {}).get('others_cpu_pct'), '.0f')}"
                 f"{' (!)' if r.get('contended') else ''} | {_commit(r)} |")
    L += ["", "\\* seqloader full-mode MB/s = images/s x the mean encoded size (estimated); "
          "all other MB/s count the bytes read.", ""]
    if lim:
        L += [f"**CPU limit** (`--mode cpu-limit`: the full-mode decode+transform in one "
              f"process over records in memory, x 2 cores): seqloader (fused, reduced-scale "
              f"decode) {lim['per_process_images_per_s']:.1f} img/s per process -> "
              f"**{lim['images_per_s']:.0f} img/s** on 2 cores; files loader's code "
              f"(decode_rgb + unfused transforms) {flim['per_process_images_per_s']:.1f} -> "
              f"{flim['images_per_s']:.0f} img/s. Load before: "
              f"{' / '.join(str(x) for x in lim['load_before'])}."]
        if clim:
            L[-1] += (f" The same fused pipeline in **2 processes at once**, each writing into a "
                      f"256-sample float32 batch buffer (154 MB) as a worker does, instead of "
                      f"bench's 16-sample ring that stays in the CPU caches: "
                      f"{' + '.join(f'{x:.0f}' for x in clim['per_process'])} = "
                      f"**{clim['images_per_s']:.0f} img/s** (load before "
                      f"{' / '.join(str(x) for x in clim['load_before'])}).")
        L.append("")
    L += ["## Goals", "", "| figure | value | goal | met |", "| --- | ---: | --- | --- |"]
    for g in doc["derived"]["goals"]:
        met = "-" if g["met"] is None else ("yes" if g["met"] else "**no**")
        L.append(f"| {g['name']} | {fmt(g['value'], '.2f')} {g['unit']} | {g['target']} | {met} |")
    L += ["", "## Hours per ImageNet epoch on this simulated HDD", "",
          f"1,281,167 images / measured images/s (hddsim rows, 2 workers). The original "
          f"loader's README: {BAYESWATCH['files_h']} h (files) vs {BAYESWATCH['sequential_h']} h "
          f"(sequential) for ~{BAYESWATCH['epochs']} epochs of ResNet-18 = "
          f"{BAYESWATCH['files_h'] / BAYESWATCH['epochs']:.1f} h vs "
          f"{BAYESWATCH['sequential_h'] / BAYESWATCH['epochs']:.2f} h per epoch (GPU training "
          "included). Full-mode figures here are bounded by this machine's 2 cores, not by the "
          "disk.", "",
          "| loader | mode | workers | run | images/s | h / epoch | h / 90 epochs |",
          "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for h in doc["derived"]["hours"]:
        L.append(f"| {h['loader']} | {h['mode']} | {h['workers']} | {h['cache']} | {h['images_per_s']:.1f} | "
                 f"{h['hours_per_epoch']:.2f} | {h['hours_90_epochs']:.0f} |")
    L += ["", "## Commands", "", "```"]
    for r in doc["runs"]:
        L.append(r["command"])
    L += ["```", ""]
    return "\n".join(L)


def cpu_limit_child(n: int, data: str, seconds: float = 8.0, records: int = 3000,
                    db_dir: str = "lmdb-hdd") -> int:
    """``n`` processes at once, each running the fused full-mode pipeline (what a seqloader
    worker does per record: msgpack-unpack, decode+crop+resize+flip+normalise) over
    ``records`` records held in memory, writing sample i into slot i % 256 of its own
    256-sample float32 batch buffer (a worker writes a whole batch buffer).  Prints JSON."""
    import multiprocessing as mp

    def one(q):
        import cv2
        import msgpack
        import numpy as np

        from seqloader.tools.bench import imagenet_train_transform
        from seqloader.tools.bench.data import db_records, spread
        from seqloader.read.database import open_database
        from seqloader.dataflow.decode import batch_rng
        from seqloader.transforms import compile_fused

        cv2.setNumThreads(1)
        db = open_database(Path(data) / db_dir, "train")
        fused = compile_fused(imagenet_train_transform())
        vals = db_records(db, spread(db.num_records, records))
        out = np.empty((256, *fused.out_shape), fused.out_dtype)
        rng = batch_rng(0, 0, 0, 0)
        for i, v in enumerate(vals[:5]):
            fused(msgpack.unpackb(v, raw=False)["image"], out[i], rng)
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for v in vals:
                fused(msgpack.unpackb(v, raw=False)["image"], out[k % 256], rng)
                k += 1
        q.put(k / (time.perf_counter() - t0))

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=one, args=(q,)) for _ in range(n)]
    for p in ps:
        p.start()
    rates = [q.get() for _ in ps]
    for p in ps:
        p.join()
    print(json.dumps({"processes": n, "per_process": [round(r, 1) for r in rates],
                      "images_per_s": round(sum(rates), 1), "seconds": seconds,
                      "records": records, "output": "256 x 3x224x224 float32 buffer per process"}))
    return 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--cpu-limit-child":
        if "--data" not in sys.argv:
            sys.exit("--cpu-limit-child N needs --data DIR (the folder holding --db)")
        data = absolute(sys.argv[sys.argv.index("--data") + 1])
        db_dir = sys.argv[sys.argv.index("--db") + 1] if "--db" in sys.argv else "lmdb-hdd"
        return cpu_limit_child(int(sys.argv[2]), data, db_dir=db_dir)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(ap)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=210)
    ap.add_argument("--phase", action="append", help="build, warm, hdd, report or all")
    ap.add_argument("--only", help="comma-separated run ids (see the raw/ file names)")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--wait", action="store_true",
                    help="wait for a quiet machine and, before hddsim runs, no other hddsim")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--force", action="store_true", help="redo runs whose results exist")
    ap.add_argument("--max-others", type=float, default=10.0,
                    help="redo a run if other processes used more than this %% of a core "
                         "meanwhile (%(default)s)")
    ap.add_argument("--attempts", type=int, default=3, help="at most this many tries per run")
    add_hddsim_argument(ap)
    add_out_argument(ap, "the report (.md, .json) and raw/hdd_compare/ (one file a run)")
    args = ap.parse_args()
    phases = {x for v in (args.phase or ["all"]) for x in v.split(",")}
    if "all" in phases:
        phases = {"build", "warm", "hdd", "report"}
    if "hdd" in phases:
        need_hddsim(args)  # before hours of other runs
    if "build" in phases:
        build(args)
    n_images = 0
    if phases & {"warm", "hdd"}:
        from seqloader.read.database import open_database
        n_images = open_database(paths(args)["db_dir"], "train").num_records
    only = set(args.only.split(",")) if args.only else None
    for run in run_list(args, n_images):
        if only and run["id"] not in only:
            continue
        if run["cache"] in ("warm", "memory") and "warm" in phases:
            do_run(args, run, n_images)
        elif run["cache"] == "hddsim" and "hdd" in phases:
            do_run(args, run, n_images)
    if "report" in phases:
        report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
