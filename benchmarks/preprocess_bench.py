#!/usr/bin/env python
"""How fast ``preprocess_sequential.py`` converts a tree, against the floor of reading it.

    python benchmarks/preprocess_bench.py --data DIR [--phase all] [--wait] [--out DIR]

Trees: hard-linked subsets of the hdd_compare tree (``DATA/imagenet-synth``, built by
``benchmarks/hdd_compare.py --phase build``): ``DATA/pp-5k``, ``pp-10k``, ``pp-20k``
(50/100/200 images per class of 100 classes; hard links share the files' disk blocks).
Outputs go to ``DATA/pp-out`` on the same disk (the same ext4 file system).

``hdd``    (under ``hddsim``, 100 IO/s, 150 MiB/s, cold page cache) on the 10k tree:
           ``find SRC -type f -print0 | sort -z | xargs -0 cat > /dev/null`` (sorted),
           ``xargs -0 -a LIST cat`` in the writer's shuffled order (seed 0), and
           ``preprocess_sequential.py`` (verify on) with ``--workers`` 4 (default), 8
           and 16 -> images/s, MB/s, ratio to the sorted ``cat``.
``warm``   (page cache warm, quiet machine) on the 10k tree: ``--no-verify`` and the
           default (verify); plus the machine's decode rate (single-process
           ``cv2.imdecode`` of the same files, x 2 cores) and the single-thread
           ``prepare_image`` rate.
``memory`` peak RSS / anonymous memory of the preprocess process for 5k, 10k and 20k
           images (warm, verify on), sampled from ``/proc/self/smaps_rollup`` every
           0.1 s plus ``ru_maxrss``.
``report`` ``OUT/preprocess.md`` and ``.json``.

``OUT`` is ``--out`` (default: the current directory; ``--out benchmarks/results`` to
update the committed results); each run's record is kept in ``OUT/raw/preprocess/``
(a run whose file exists is kept; ``--force`` redoes it).  ``hddsim`` is ``--hddsim``.

The preprocess process is run through this script's ``--child`` mode, which imports
seqloader (and torch, which it pulls in) first and times ``seqloader.cli.main(
["preprocess", ...])`` -- exactly what ``preprocess_sequential.py`` runs -- separately
from the import; both are reported.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import sys
import threading
import time
from pathlib import Path

T_START = time.time()
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchpaths import (add_data_argument, add_hddsim_argument, add_out_argument,  # noqa: E402
                        need_hddsim, out_dir)
from hdd_compare import (HDD_MBPS, MiB, REPO, CpuAccount, drops, fmt, git_state,  # noqa: E402
                         log, loadavg, machine, machine_md, retry, timed_run, tree_files,
                         wait_hddsim, wait_quiet, warm_files)

SIZES = {"5k": 50, "10k": 100, "20k": 200}  # images per class, 100 classes


# =========================================================================== child

def child(out: str, argv: list[str]) -> int:
    """Run ``seqloader preprocess argv`` in this process; write timings and memory."""
    t_import = time.time()
    from seqloader.cli import main
    from seqloader.tools.bench.machine import smaps

    base = smaps(os.getpid()) or {}
    t_run = time.time()
    peak = {"rss": 0, "anon": 0, "pss": 0}
    stop = threading.Event()

    def sample():
        while not stop.wait(0.1):
            m = smaps(os.getpid())
            if m:
                for k in peak:
                    peak[k] = max(peak[k], m[k])

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = main(["preprocess", *argv])
    t_end = time.time()
    stop.set()
    th.join()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps({
        "rc": rc, "import_s": round(t_run - t_import, 3), "startup_s": round(t_run - T_START, 3),
        "run_s": round(t_end - t_run, 3), "peak_rss_mb": round(peak["rss"] * 1024 / 1e6, 1),
        "peak_anon_mb": round(peak["anon"] * 1024 / 1e6, 1),
        "peak_pss_mb": round(peak["pss"] * 1024 / 1e6, 1),
        "ru_maxrss_mb": round(ru.ru_maxrss * 1024 / 1e6, 1),
        "base_rss_mb": round(base.get("rss", 0) * 1024 / 1e6, 1),
        "base_anon_mb": round(base.get("anon", 0) * 1024 / 1e6, 1),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 2)}))
    return rc


# =========================================================================== data

def trees(args) -> dict[str, Path]:
    return {k: Path(args.data) / f"pp-{k}" for k in SIZES}


def build(args) -> None:
    src = Path(args.data) / "imagenet-synth" / "train"
    if not src.is_dir():
        raise SystemExit(f"{src} missing: run benchmarks/hdd_compare.py --phase build first")
    classes = sorted(os.listdir(src))
    for k, per in SIZES.items():
        root = trees(args)[k] / "train"
        if root.is_dir():
            continue
        for c in classes:
            (root / c).mkdir(parents=True, exist_ok=True)
            for i in range(per):
                name = f"{c}_{i}.JPEG"
                if not (src / c / name).exists():
                    raise SystemExit(f"{src / c / name} missing (need {per} per class)")
                os.link(src / c / name, root / c / name)
        log(f"linked {len(classes) * per} images into {root}")


def tree_stats(root: Path) -> dict:
    files = tree_files(root / "train")
    size = sum(os.path.getsize(f) for f in files)
    return {"images": len(files), "bytes": size, "mean_bytes": round(size / len(files))}


# =========================================================================== runs

def raw_dir(args) -> Path:
    d = Path(args.out) / "raw" / "preprocess"
    d.mkdir(parents=True, exist_ok=True)
    return d


def preprocess_cmd(args, src: Path, out: Path, extra: list[str], res: Path) -> list[str]:
    return [sys.executable, str(HERE / "preprocess_bench.py"), "--child", str(res), "--",
            str(src), str(out), "--splits", "train", "--overwrite", "--no-progress", *extra]


def save(args, rid: str, rec: dict) -> dict:
    (raw_dir(args) / f"{rid}.json").write_text(json.dumps(rec, indent=2))
    return rec


def done(args, rid: str) -> dict | None:
    f = raw_dir(args) / f"{rid}.json"
    if f.exists() and not args.force:
        log(f"{rid}: kept {f} (--force to redo)")
        return {**json.loads(f.read_text()), "_cached": True}
    return None


def retried(fn):
    """Redo a run disturbed by other users (see hdd_compare.retry); save the one kept."""
    def wrapper(args, rid, *a, **kw):
        def once(force):
            saved, args.force = args.force, args.force or force
            try:
                return fn(args, rid, *a, **kw)
            finally:
                args.force = saved
        rec = retry(once, args.max_others, args.attempts, rid)
        if not rec.get("_cached"):
            save(args, rid, rec)
        return rec
    return wrapper


@retried
def run_preprocess(args, rid: str, tree: Path, extra: list[str], hdd: bool) -> dict:
    rec = done(args, rid)
    if rec:
        return rec
    if hdd:
        wait_hddsim(enabled=args.wait)
    else:
        warm_files(tree_files(tree / "train"))
    cond = wait_quiet(args.max_load, enabled=args.wait)
    res = Path("/dev/shm") / f"ppbench-{rid}.json"
    out = Path(args.data) / "pp-out"
    cmd = preprocess_cmd(args, tree, out, extra, res)
    if hdd:
        cmd = [need_hddsim(args), "--dir", str(args.data), "--"] + cmd
    r, wall, git, cpu_acct = timed_run(cmd, cwd=REPO, capture_output=True, text=True)
    child_res = json.loads(res.read_text()) if res.exists() else None
    res.unlink(missing_ok=True)
    stats = tree_stats(tree)
    db = out / "ILSVRC-train.lmdb"
    rec = {"id": rid, "tree": str(tree), **stats, "command": " ".join(map(shlex.quote, cmd)),
           "git": git, "cpu_account": cpu_acct, "hddsim": hdd, "returncode": r.returncode, "wall_s": round(wall, 2), **cond,
           "load_after": loadavg(), "drops_after": drops(), "child": child_res,
           "stderr_tail": r.stderr[-2000:],
           "db_bytes": db.stat().st_size if db.exists() else None}
    if child_res:
        s = child_res["run_s"]
        rec.update(images_per_s=round(stats["images"] / s, 1),
                   mb_per_s=round(stats["bytes"] / s / 1e6, 1))
        log(f"{rid}: {rec['images_per_s']} img/s, {rec['mb_per_s']} MB/s, run {s} s "
            f"(+{child_res['startup_s']} s start-up), others' CPU {cpu_acct}, peak RSS {child_res['peak_rss_mb']} MB, "
            f"anon {child_res['peak_anon_mb']} MB, load {cond['load_before']}")
    else:
        log(f"{rid} FAILED: {r.stderr[-2000:]}")
    return save(args, rid, rec)


@retried
def run_cat(args, rid: str, tree: Path, shuffled: bool) -> dict:
    rec = done(args, rid)
    if rec:
        return rec
    wait_hddsim(enabled=args.wait)
    cond = wait_quiet(args.max_load, enabled=args.wait)
    src = tree / "train"
    tfile = Path("/dev/shm") / f"ppbench-{rid}.t"
    if shuffled:
        from seqloader.write.scan import scan_class_tree
        from seqloader.write.writer import write_order

        scan = scan_class_tree(src)
        order = write_order(len(scan), seed=0, shuffle=True)
        lst = Path("/dev/shm") / "ppbench-shuffled.list"
        lst.write_bytes(b"".join(str(scan.root / scan.paths[i]).encode() + b"\0" for i in order))
        pipeline = f"xargs -0 -a {lst} cat > /dev/null"
    else:
        pipeline = f"find {shlex.quote(str(src))} -type f -print0 | sort -z | xargs -0 cat > /dev/null"
    script = (f"t0=$(date +%s.%N); {pipeline}; t1=$(date +%s.%N); echo $t0 $t1 > {tfile}")
    cmd = [need_hddsim(args), "--dir", str(args.data), "--", "bash", "-c", script]
    r, wall, git, cpu_acct = timed_run(cmd, capture_output=True, text=True)
    a, b = map(float, tfile.read_text().split())
    tfile.unlink()
    stats = tree_stats(tree)
    s = b - a
    rec = {"id": rid, "tree": str(tree), **stats, "command": " ".join(map(shlex.quote, cmd)),
           "git": git, "cpu_account": cpu_acct, "pipeline": pipeline, "hddsim": True, "returncode": r.returncode,
           "wall_s": round(wall, 2), "seconds": round(s, 2), **cond, "load_after": loadavg(),
           "images_per_s": round(stats["images"] / s, 1),
           "mb_per_s": round(stats["bytes"] / s / 1e6, 1)}
    log(f"{rid}: {rec['images_per_s']} img/s, {rec['mb_per_s']} MB/s in {s:.1f} s")
    return save(args, rid, rec)


@retried
def run_decode_rate(args, rid: str, tree: Path) -> dict:
    """Single-process cv2.imdecode (and prepare_image) images/s over a sample of the files."""
    rec = done(args, rid)
    if rec:
        return rec
    import cv2
    import numpy as np

    from seqloader.write.prepare import prepare_image

    files = tree_files(tree / "train")
    idx = np.linspace(0, len(files) - 1, min(len(files), args.decode_sample)).astype(int)
    blobs = [Path(files[i]).read_bytes() for i in idx]
    cond = wait_quiet(args.max_load, enabled=args.wait)
    cv2.setNumThreads(1)
    acct = CpuAccount()
    out = {}
    for name, fn in (("imdecode", lambda d: cv2.imdecode(np.frombuffer(d, np.uint8),
                                                           cv2.IMREAD_COLOR)),
                     ("prepare_image_verify", lambda d: prepare_image(d, verify=True)),
                     ("prepare_image_noverify", lambda d: prepare_image(d, verify=False))):
        for d in blobs[:5]:
            fn(d)
        rates = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            for d in blobs:
                fn(d)
            rates.append(len(blobs) / (time.perf_counter() - t))
        out[name] = {"rates": [round(x, 1) for x in rates], "best": round(max(rates), 1),
                     "median": round(sorted(rates)[len(rates) // 2], 1)}
        log(f"{name}: {out[name]}")
    rec = {"id": rid, "git": git_state(), "cpu_account": acct.result(), "sample": len(blobs), "mean_bytes": round(sum(map(len, blobs)) / len(blobs)),
           "threads": "cv2.setNumThreads(1), one Python thread", **out, **cond,
           "load_after": loadavg(), "cores": len(os.sched_getaffinity(0))}
    return save(args, rid, rec)


# =========================================================================== report

def _tag(r: dict) -> str:
    """commit (+edits) and the other users' CPU share during the run."""
    g = r.get("git") or {}
    c = r.get("cpu_account") or {}
    return (f"{g.get('commit', '?')}{' +edits' if g.get('dirty') else ''} | "
            f"{fmt(c.get('others_cpu_pct'), '.0f')}{' (!)' if r.get('contended') else ''}")


def report(args) -> None:
    recs = {f.stem: json.loads(f.read_text()) for f in sorted(raw_dir(args).glob("*.json"))}
    recs = {k: v for k, v in recs.items() if not k.startswith("_")}
    m = machine(args.data)
    L = ["# Preprocessing: `preprocess_sequential.py` vs reading the sources", "",
         f"Measured by `benchmarks/preprocess_bench.py`. **Machine.** {machine_md(m)}", "",
         "Trees: hard-linked subsets (50/100/200 images per class, 100 classes) of the "
         "synthetic ImageNet-like tree of `hdd_compare.py` (`seqloader synth --size imagenet`, "
         "~1 % grayscale/PNG/CMYK files that get re-encoded). Output: `ILSVRC-train.lmdb` on "
         "the same ext4 disk (`--splits train --overwrite`; includes the final fsync). "
         "Images/s and MB/s are over the time of `seqloader.cli.main(['preprocess', ...])` "
         "(what `preprocess_sequential.py` runs) after imports; the start-up (Python + "
         "seqloader + torch import) is listed separately. MB = 10^6 B. Load = 1/5/15-min "
         "load average before the run.", ""]
    cat = recs.get("hdd-cat-sorted-10k")
    L += ["## (a) Cold, under hddsim (100 IO/s, 150 MiB/s): reading the sources vs preprocessing",
          "", "| what (10k images) | seconds | images/s | MB/s | % of 150 MiB/s | ratio to sorted `cat` | start-up s | load before | commit | others' CPU % |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    goals = []
    for rid, label in (("hdd-cat-sorted-10k", "`cat` every file, sorted (`find | sort -z | xargs -0 cat`)"),
                       ("hdd-cat-shuffled-10k", "`cat` every file, in the writer's shuffled order"),
                       ("hdd-preprocess-w4-10k", "preprocess, verify on, `--workers 4` (default)"),
                       ("hdd-preprocess-w8-10k", "preprocess, verify on, `--workers 8`"),
                       ("hdd-preprocess-w16-10k", "preprocess, verify on, `--workers 16`")):
        r = recs.get(rid)
        if not r:
            continue
        s = r.get("seconds") or (r["child"] or {}).get("run_s")
        ratio = s / cat["seconds"] if cat and s else None
        st = (r.get("child") or {}).get("startup_s")
        L.append(f"| {label} | {fmt(s)} | {fmt(r.get('images_per_s'))} | {fmt(r.get('mb_per_s'))} | "
                 f"{fmt(r['mb_per_s'] * 1e6 / (HDD_MBPS * MiB) * 100 if r.get('mb_per_s') else None, '.0f')} | "
                 f"{fmt(ratio, '.2f')} | {fmt(st)} | {' / '.join(map(str, r['load_before']))} | {_tag(r)} |")
        if rid.startswith("hdd-preprocess") and ratio is not None:
            goals.append({"name": f"{rid}: preprocess time / sorted cat time", "value": round(ratio, 3),
                          "target": "<= 1.3", "met": ratio <= 1.3})
    dec = recs.get("decode-rate-10k")
    L += ["", "## (b) Warm page cache, 10k images", "",
          "| run | seconds | images/s | MB/s | CPU s (whole process) | peak RSS (MB) | load before | commit | others' CPU % |",
          "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for rid, label in (("warm-noverify-10k", "`--no-verify`"), ("warm-verify-10k", "verify (default)")):
        r = recs.get(rid)
        if not r or not r.get("child"):
            continue
        c = r["child"]
        L.append(f"| {label} | {c['run_s']:.1f} | {fmt(r['images_per_s'])} | {fmt(r['mb_per_s'])} | "
                 f"{c['cpu_s']:.1f} | {c['peak_rss_mb']:.0f} | {' / '.join(map(str, r['load_before']))} | {_tag(r)} |")
    nv, v = recs.get("warm-noverify-10k"), recs.get("warm-verify-10k")
    if nv and nv.get("images_per_s"):
        goals.append({"name": "warm --no-verify images/s", "value": nv["images_per_s"],
                      "target": ">= 2300", "met": nv["images_per_s"] >= 2300})
    if dec:
        cores = dec["cores"]
        lim = dec["imdecode"]["best"] * cores
        L += ["", f"Decode rate of the same files (sample of {dec['sample']}, mean "
              f"{dec['mean_bytes']} B, {dec['threads']}, best of {len(dec['imdecode']['rates'])}; "
              f"load before {' / '.join(map(str, dec['load_before']))}): `cv2.imdecode` "
              f"**{dec['imdecode']['best']:.0f} images/s** per process -> **{lim:.0f} images/s** "
              f"on {cores} cores; `prepare_image(verify=True)` {dec['prepare_image_verify']['best']:.0f}/s, "
              f"`prepare_image(verify=False)` {dec['prepare_image_noverify']['best']:.0f}/s per thread."]
        if v and v.get("images_per_s"):
            goals.append({"name": f"warm verify images/s as % of the decode limit ({lim:.0f}/s)",
                          "value": round(100 * v["images_per_s"] / lim, 1), "target": "~100 %",
                          "met": v["images_per_s"] >= 0.9 * lim})
    L += ["", "## (c) Peak memory of the preprocess process (warm, verify on)", "",
          "Base = the process after its imports (Python, seqloader, torch, OpenCV), before "
          "preprocessing starts.", "",
          "| images | seconds | images/s | peak RSS (MB) | peak anonymous (MB) | ru_maxrss (MB) | base RSS / anon (MB) | load before | commit | others' CPU % |",
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    mem = []
    for k in SIZES:
        r = recs.get(f"mem-{k}")
        if not r or not r.get("child"):
            continue
        c = r["child"]
        mem.append(c["peak_anon_mb"])
        L.append(f"| {r['images']} | {c['run_s']:.1f} | {fmt(r['images_per_s'])} | "
                 f"{c['peak_rss_mb']:.0f} | {c['peak_anon_mb']:.0f} | {c['ru_maxrss_mb']:.0f} | "
                 f"{c.get('base_rss_mb', 0):.0f} / {c.get('base_anon_mb', 0):.0f} | "
                 f"{' / '.join(map(str, r['load_before']))} | {_tag(r)} |")
    if len(mem) >= 2:
        growth = mem[-1] - mem[0]
        goals.append({"name": "peak anonymous memory growth 5k -> 20k images (MB)",
                      "value": round(growth, 1), "target": "flat (~0.1 KB/image: < 5 MB)",
                      "met": growth < 5 + 0.0003 * 15000})
    L += ["", "## Goals", "", "| figure | value | goal | met |", "| --- | ---: | --- | --- |"]
    for g in goals:
        L.append(f"| {g['name']} | {g['value']} | {g['target']} | {'yes' if g['met'] else '**no**'} |")
    L += ["", "## Commands", "", "```"]
    for r in recs.values():
        if "command" in r:
            L.append(r["command"])
    L += ["```", ""]
    md = "\n".join(L)
    out = out_dir(args)
    (out / "preprocess.md").write_text(md)
    (out / "preprocess.json").write_text(json.dumps({"machine": m, "runs": recs, "goals": goals},
                                                    indent=2))
    print(md)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        argv = sys.argv[3:]
        if argv and argv[0] == "--":
            argv = argv[1:]
        return child(sys.argv[2], argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(ap)
    ap.add_argument("--phase", action="append", help="build, hdd, warm, memory, report or all")
    ap.add_argument("--only", help="comma-separated run ids")
    ap.add_argument("--wait", action="store_true")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--max-others", type=float, default=10.0,
                    help="redo a run if other processes used more than this %% of a core")
    ap.add_argument("--attempts", type=int, default=3)
    ap.add_argument("--decode-sample", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    add_hddsim_argument(ap)
    add_out_argument(ap, "the report (.md, .json) and raw/preprocess/ (one file a run)")
    args = ap.parse_args()
    phases = {x for v in (args.phase or ["all"]) for x in v.split(",")}
    if "all" in phases:
        phases = {"build", "hdd", "warm", "memory", "report"}
    if "hdd" in phases:
        need_hddsim(args)  # before the other runs
    only = set(args.only.split(",")) if args.only else None
    ok = lambda rid: not only or rid in only  # noqa: E731
    t = trees(args)
    if "build" in phases:
        build(args)
    if "warm" in phases:
        if ok("warm-noverify-10k"):
            run_preprocess(args, "warm-noverify-10k", t["10k"], ["--no-verify"], hdd=False)
        if ok("warm-verify-10k"):
            run_preprocess(args, "warm-verify-10k", t["10k"], [], hdd=False)
        if ok("decode-rate-10k"):
            run_decode_rate(args, "decode-rate-10k", t["10k"])
    if "memory" in phases:
        for k in SIZES:
            if ok(f"mem-{k}"):
                run_preprocess(args, f"mem-{k}", t[k], [], hdd=False)
    if "hdd" in phases:
        if ok("hdd-cat-sorted-10k"):
            run_cat(args, "hdd-cat-sorted-10k", t["10k"], shuffled=False)
        if ok("hdd-cat-shuffled-10k"):
            run_cat(args, "hdd-cat-shuffled-10k", t["10k"], shuffled=True)
        for w in (4, 8, 16):
            if ok(f"hdd-preprocess-w{w}-10k"):
                run_preprocess(args, f"hdd-preprocess-w{w}-10k", t["10k"], ["--workers", str(w)],
                               hdd=True)
    if "report" in phases:
        report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
