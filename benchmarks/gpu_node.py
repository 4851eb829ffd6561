"""Feed a GPU node: the fused CPU path's scaling with workers against decode="gpu", in
one call on a GPU machine (issue 33).

    python benchmarks/gpu_node.py --data DIR --out DIR [--device cuda] [--images 10000]
        [--workers 1,2,4,8,15] [--gpu-workers 1,2,4] [--seconds 12] [--budget 480]

Parts, each time-boxed, each run in its own process (its CPU time and its workers'
read from ``/proc``), results written after every part (a run cut short keeps what
it measured):

* ``build``: a synthetic ImageNet-like tree (``seqloader synth --size imagenet``,
  ``--images`` images) and its database (``seqloader preprocess``), in ``--data``;
  kept for later runs.
* ``cpu``: the fused CPU pipeline (RandomResizedCrop(224) + flip + ToTensor +
  Normalize, batch 256, shuffled, warm page cache) with each ``--workers`` count:
  images/s, images per CPU-second of the workers, per worker, the main process's
  share of the CPU time, and the efficiency against ``W x`` the one-worker rate.
* ``gpu``: ``decode="gpu"`` on ``--device`` with each ``--gpu-workers`` count, the
  train and the eval (Resize(256) + CenterCrop(224)) recipe: images/s and CPU cores
  busy (all processes' CPU seconds / wall seconds), fallbacks, peak device memory
  (the device's own count, cudaMemGetInfo: nvJPEG's buffers included).
* ``pixels``: the distance of decode="gpu" to decode="cpu" (grey levels; the same
  boxes, labels checked equal), both recipes.
* ``floor``: batched nvJPEG decode alone (``torchvision.io.decode_jpeg(list,
  device=...)``) on the same images, from pageable and from pinned inputs: the GPU
  path's ceiling; and one core's CPU decode rate.

Writes ``gpu_node.json`` (every figure, the machine, the command) and ``gpu_node.md``
into ``--out``; the last lines printed are the summary table and the issue's goals.
``--device cpu`` runs everything on CPU tensors (the CPU decoder standing in for
nvJPEG): for testing this script on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchpaths import REPO, absolute, add_out_argument, out_dir  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ------------------------------------------------------------------ child side

def _recipe(name: str, size: int):
    from seqloader.transforms import (CenterCrop, Compose, Normalize, RandomHorizontalFlip,
                                      RandomResizedCrop, Resize, ToTensor)
    if name == "train":
        return Compose([RandomResizedCrop(size), RandomHorizontalFlip(), ToTensor(),
                        Normalize(MEAN, STD)])
    return Compose([Resize(size * 8 // 7), CenterCrop(size), ToTensor(), Normalize(MEAN, STD)])


def _tree_cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its descendants' -- the workers)."""
    from seqloader.tools.bench.machine import cpu_seconds, process_tree
    me, *kids = process_tree()
    return cpu_seconds(me) or 0.0, sum(cpu_seconds(p) or 0.0 for p in kids)


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _blocking_sync() -> int:
    """Make host waits on the GPU sleep instead of spin (``cudaSetDeviceFlags(
    cudaDeviceScheduleBlockingSync)``, before the CUDA context exists): the CUDA runtime
    torch loaded, called through ctypes; its return code (0: done)."""
    import ctypes

    import torch  # noqa: F401  (loads the runtime, creates no context)
    with open("/proc/self/maps") as f:
        paths = sorted({ln.split()[-1] for ln in f if "libcudart" in ln})
    if not paths:
        return -1
    return ctypes.CDLL(paths[0]).cudaSetDeviceFlags(4)


def child_loader(a: argparse.Namespace) -> dict:
    """One Loader configuration, timed for ``a.seconds`` after two warm-up batches."""
    sync_flag = _blocking_sync() if a.blocking_sync else None
    import torch
    from seqloader import Loader

    split = "train" if a.recipe == "train" else "val"
    kw = dict(batch_size=a.batch_size, shuffle=split == "train", num_workers=a.workers,
              seed=1, cache=5000)
    if a.decode == "gpu":
        kw.update(decode="gpu", device=a.device)
    on_cuda = a.device.startswith("cuda")
    # the device's own count of used memory (cudaMemGetInfo): nvJPEG's buffers, which
    # torch's allocator does not see, included; the baseline is taken once the CUDA
    # context exists, so the figure is what the Loader added
    used = (lambda: (lambda f, t: t - f)(*torch.cuda.mem_get_info(a.device))) if on_cuda else None
    base = used() if on_cuda else 0
    peak = base
    ld = Loader(a.db, split, _recipe(a.recipe, a.size), **kw)
    images, warm, t0, c0 = 0, 0, None, None
    for _ in itertools.count():
        for x, _y in ld:
            if on_cuda:
                peak = max(peak, used())
            if t0 is None:
                warm += 1
                if warm == 2:
                    _sync(a.device)
                    t0, c0 = time.perf_counter(), _tree_cpu()
                continue
            images += len(x)
            if time.perf_counter() - t0 >= a.seconds:
                break
        else:
            continue
        break
    _sync(a.device)
    wall = time.perf_counter() - t0
    main, workers = (b - c for b, c in zip(_tree_cpu(), c0))
    out = {"decode": a.decode, "recipe": a.recipe, "workers": a.workers, "images": images,
           "seconds": wall, "images_per_s": images / wall, "main_cpu_s": main,
           "workers_cpu_s": workers, "cores_busy": (main + workers) / wall,
           "main_share": main / max(1e-9, main + workers),
           "main_us_per_image": 1e6 * main / max(1, images),
           "images_per_worker_cpu_s": images / workers if workers > 0 else None}
    if sync_flag is not None:
        out["blocking_sync"] = sync_flag
    if a.decode == "gpu":
        st = ld.decode_stats
        out.update(on_gpu=st.on_gpu, fallback=st.fallback, stats_images=st.images)
    if on_cuda:
        out["peak_device_mib"] = (peak - base) / 2**20  # (the device's count: with nvJPEG's)
        out["peak_torch_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        out["peak_torch_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    ld.close()
    return out


def child_pixels(a: argparse.Namespace) -> dict:
    """Distance (grey levels) of decode='gpu' to decode='cpu', same seed, both recipes."""
    import torch
    from seqloader import Loader

    out = {}
    for recipe in ("train", "eval"):
        split = "train" if recipe == "train" else "val"
        kw = dict(batch_size=a.batch_size, shuffle=split == "train", num_workers=a.workers,
                  seed=3)
        cpu = Loader(a.db, split, _recipe(recipe, a.size), **kw)
        gpu = Loader(a.db, split, _recipe(recipe, a.size), decode="gpu", device=a.device, **kw)
        std = torch.tensor(STD).view(1, 3, 1, 1)
        total, n, big, worst, sample = 0.0, 0, 0, 0.0, []
        t0 = time.perf_counter()
        for (x, y), (g, z) in zip(cpu, gpu):
            assert torch.equal(y, z.cpu()), "labels differ: the batches are not the same records"
            d = ((g.float().cpu() - x) * std * 255).abs()
            total, n = total + float(d.sum()), n + d.numel()
            big += int((d > 4).sum())
            worst = max(worst, float(d.max()))
            sample.append(d.flatten()[::97])
            if time.perf_counter() - t0 > a.seconds:
                break
        s = torch.cat(sample)
        q = torch.quantile(s[:1 << 24], torch.tensor([0.5, 0.99, 0.999])).tolist()
        out[recipe] = {"values": n, "mean": total / n, "max": worst, "p50": q[0], "p99": q[1],
                       "p999": q[2], "share_over_4": big / n}
        cpu.close()
        gpu.close()
    return out


def child_floor(a: argparse.Namespace) -> dict:
    """Batched decode alone on the first images of the split, pageable and pinned inputs,
    and one core's CPU decode rate."""
    import torch
    from seqloader import Loader
    from seqloader.dataflow.gpugather import GPUOptions, ON_GPU, classify
    from seqloader.transforms import decode_rgb
    from seqloader.transforms.gpu import decode_jpegs

    device = torch.device(a.device)
    raw = Loader(a.db, "train", None, batch_size=a.batch_size, num_workers=0)
    batches = []
    for imgs, _ in raw:
        batches.append([bytes(b) for b in imgs])
        if len(batches) * a.batch_size >= a.floor_images:
            break
    raw.close()
    kinds = [classify(b, GPUOptions())[0] for bs in batches for b in bs]
    ok = [[b for b in bs if classify(b, GPUOptions())[0] == ON_GPU] for bs in batches]
    pinned = device.type == "cuda"
    variants = {"pageable": [[torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in bs]
                             for bs in ok]}
    if pinned:
        variants["pinned"] = [[t.pin_memory() for t in bs] for bs in variants["pageable"]]
    out = {"images": sum(map(len, ok)), "on_gpu_share": kinds.count(ON_GPU) / len(kinds),
           "mean_bytes": sum(len(b) for bs in ok for b in bs) / max(1, sum(map(len, ok)))}
    for name, data in variants.items():
        decode_jpegs(data[0], device)  # (warm-up: nvJPEG handles, buffers)
        _sync(a.device)
        n, t0 = 0, time.perf_counter()
        c0 = _tree_cpu()[0]
        while time.perf_counter() - t0 < a.seconds / len(variants):
            for bs in data:
                decode_jpegs(bs, device)
                n += len(bs)
        _sync(a.device)
        wall = time.perf_counter() - t0
        out[name] = {"images_per_s": n / wall,
                     "cores_busy": (_tree_cpu()[0] - c0) / wall}
    flat = [b for bs in ok for b in bs]
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2:
        for b in flat[:200]:
            decode_rgb(b)
            n += 1
    out["cpu_decode_per_core"] = n / (time.perf_counter() - t0)
    return out


# ------------------------------------------------------------------ parent side

def _child(args: argparse.Namespace, kind: str, extra: list[str], limit: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--db", str(args.db),
           "--device", args.device, "--seconds", str(args.seconds), "--size", str(args.size),
           "--batch-size", str(args.batch_size), "--floor-images", str(args.floor_images),
           *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {limit:.0f} s", "cmd": cmd}
    if r.returncode != 0:
        return {"error": r.stderr[-3000:], "cmd": cmd}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _build(args: argparse.Namespace, limit: float) -> dict:
    data = Path(args.data)
    tree, db = data / "imagenet-synth", Path(args.db)
    if (db / "ILSVRC-train.lmdb").exists() and (db / "ILSVRC-val.lmdb").exists():
        return {"skipped": "exists"}
    cores = os.cpu_count() or 1
    classes = 100 if args.images >= 2000 else 10
    per = max(1, args.images // classes)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(db, ignore_errors=True)
    for cmd in ([sys.executable, "-m", "seqloader", "synth", str(tree), "--classes", str(classes),
                 "--per-class", str(per), "--val-per-class", str(max(1, per // 5)),
                 "--size", "imagenet", "--workers", str(cores), "--no-progress"],
                [sys.executable, "-m", "seqloader", "preprocess", str(tree), str(db),
                 "--workers", str(cores), "--no-progress"]):
        spent = time.perf_counter() - t0
        subprocess.run(cmd, check=True, env=env, timeout=max(10.0, limit - spent),
                       stdout=subprocess.DEVNULL)
    return {"seconds": time.perf_counter() - t0, "classes": classes, "per_class": per}


def _summary(res: dict) -> dict:
    parts = res["parts"]
    cpu = {r["workers"]: r for r in parts.get("cpu", []) if "error" not in r}
    gpu = [r for r in parts.get("gpu", []) if "error" not in r]
    s: dict = {}
    one = cpu.get(1, {}).get("images_per_s")
    for w, r in cpu.items():
        r["efficiency"] = r["images_per_s"] / (w * one) if one else None
    top = cpu[max(cpu)] if cpu else None
    if top:
        s["cpu_top_workers"], s["cpu_top_images_per_s"] = top["workers"], top["images_per_s"]
        s["cpu_scaling_efficiency"] = top.get("efficiency")
    train = [r for r in gpu if r["recipe"] == "train" and "blocking_sync" not in r]
    if train:
        best = max(train, key=lambda r: r["images_per_s"])
        s["gpu_train_images_per_s"] = best["images_per_s"]
        s["gpu_train_cores_busy"] = best["cores_busy"]
        s["gpu_train_workers"] = best["workers"]
        if top:
            s["gpu_over_cpu_top"] = best["images_per_s"] / top["images_per_s"]
        floor = parts.get("floor", {})
        if "pageable" in floor:
            f = max(v["images_per_s"] for k, v in floor.items() if isinstance(v, dict)
                    and "images_per_s" in v)
            s["decode_floor_images_per_s"] = f
            s["gpu_over_floor"] = best["images_per_s"] / f
    return s


def _markdown(res: dict) -> str:
    p, s = res["parts"], res.get("summary", {})
    lines = [f"# gpu_node: {res['machine']['device']}, {res['machine']['cores']} cores", "",
             f"`{res['command']}` at commit {res['commit']}", ""]
    if p.get("cpu"):
        a = res["args"]
        lines += [f"## Fused CPU path (train recipe {a['size']} px, batch {a['batch_size']})", "",
                  "| workers | images/s | vs W x 1-worker | img per worker CPU-s | main share | "
                  "main us/img | cores busy |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in p["cpu"]:
            if "error" in r:
                lines.append(f"| {r.get('workers', '?')} | error | | | | | |")
                continue
            eff = r.get("efficiency")
            lines.append(f"| {r['workers']} | {r['images_per_s']:.0f} | "
                         f"{'' if eff is None else f'{eff:.0%}'} | "
                         f"{r['images_per_worker_cpu_s'] or 0:.0f} | {r['main_share']:.0%} | "
                         f"{r['main_us_per_image']:.0f} | {r['cores_busy']:.1f} |")
        lines.append("")
    if p.get("gpu"):
        lines += ["## decode='gpu'", "",
                  "| recipe | workers | images/s | cores busy | fallbacks | peak device MiB (nvJPEG incl.) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in p["gpu"]:
            if "error" in r:
                lines.append(f"| {r.get('recipe', '?')} | {r.get('workers', '?')} | error | | | |")
                continue
            sync = " (blocking sync)" if "blocking_sync" in r else ""
            lines.append(f"| {r['recipe']}{sync} | {r['workers']} | {r['images_per_s']:.0f} | "
                         f"{r['cores_busy']:.2f} | {sum(r['fallback'].values())} | "
                         f"{r.get('peak_device_mib', 0):.0f} |")
        lines.append("")
    if isinstance(p.get("pixels"), dict) and "train" in p["pixels"]:
        lines += ["## Pixels, decode='gpu' vs 'cpu' (grey levels)", "",
                  "| recipe | mean | p50 | p99 | p99.9 | max | share > 4 |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for k in ("train", "eval"):
            d = p["pixels"][k]
            lines.append(f"| {k} | {d['mean']:.2f} | {d['p50']:.1f} | {d['p99']:.1f} | "
                         f"{d['p999']:.1f} | {d['max']:.0f} | {d['share_over_4']:.2%} |")
        lines.append("")
    f = p.get("floor", {})
    if "pageable" in f:
        lines += ["## Batched decode alone (the floor)", "",
                  f"{f['images']} images of {f['mean_bytes'] / 1e3:.0f} KB mean "
                  f"({f['on_gpu_share']:.1%} of the split takes the GPU path); "
                  f"one core's CPU decode: {f['cpu_decode_per_core']:.0f} images/s", ""]
        for k in ("pageable", "pinned"):
            if k in f:
                lines.append(f"- {k} inputs: {f[k]['images_per_s']:.0f} images/s, "
                             f"{f[k]['cores_busy']:.2f} cores busy")
        lines.append("")
    if s:
        lines += ["## Goals", "", "```text", json.dumps(s, indent=1), "```", ""]
    return "\n".join(lines)


def _save(res: dict, out: Path) -> None:
    res["summary"] = _summary(res)
    (out / "gpu_node.json").write_text(json.dumps(res, indent=1))
    (out / "gpu_node.md").write_text(_markdown(res))


def _machine(device: str) -> dict:
    m = {"cores": os.cpu_count(), "python": platform.python_version(), "device": device,
         "dev_shm_gib": shutil.disk_usage("/dev/shm").total / 2**30 if os.path.isdir("/dev/shm")
         else None}
    try:
        import torch
        m["torch"] = torch.__version__
        if device.startswith("cuda") and torch.cuda.is_available():
            m["device"] = torch.cuda.get_device_name(0)
            import torchvision
            m["torchvision"] = torchvision.__version__
    except Exception as e:  # (recorded, not fatal: the children report their own errors)
        m["error"] = repr(e)
    return m


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=absolute, help="folder for the synthetic tree and database")
    add_out_argument(ap)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--workers", default="1,2,4,8,15")
    ap.add_argument("--gpu-workers", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=12.0, help="timed seconds per run")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole call")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--floor-images", type=int, default=2560)
    ap.add_argument("--parts", default="build,cpu,gpu,pixels,floor")
    ap.add_argument("--child", choices=("loader", "pixels", "floor"), help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--decode", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", default="train", help=argparse.SUPPRESS)
    ap.add_argument("--nw", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--blocking-sync", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        a.workers = a.nw
        fn = {"loader": child_loader, "pixels": child_pixels, "floor": child_floor}[a.child]
        print(json.dumps(fn(a)))
        return
    if not a.data:
        ap.error("--data DIR is required")
    a.db = str(Path(a.data) / "lmdb")
    out = out_dir(a)
    start = time.perf_counter()
    left = lambda: a.budget - (time.perf_counter() - start)  # noqa: E731
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    res = {"command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
           "commit": commit, "machine": _machine(a.device), "parts": {},
           "args": {k: v for k, v in vars(a).items() if not k.startswith("child")}}
    parts = a.parts.split(",")
    per_run = a.seconds + 45  # start-up, warm-up, shutdown
    if "build" in parts:
        res["parts"]["build"] = _build(a, left() - 60)
        print("build", res["parts"]["build"], flush=True)
        _save(res, out)
    if "cpu" in parts:
        res["parts"]["cpu"] = rows = []
        for w in map(int, a.workers.split(",")):
            if left() < per_run:
                rows.append({"workers": w, "error": "skipped: out of time"})
                continue
            rows.append(_child(a, "loader", ["--decode", "cpu", "--nw", str(w)],
                               min(per_run, left())))
            print("cpu", rows[-1], flush=True)
            _save(res, out)
    if "gpu" in parts:
        res["parts"]["gpu"] = rows = []
        gw = list(map(int, a.gpu_workers.split(",")))
        runs = [(r, w, False) for r in ("train", "eval") for w in gw]
        if a.device.startswith("cuda"):  # host waits that sleep: fewer cores busy?
            runs.append(("train", min(2, max(gw)), True))
        for recipe, w, blocking in runs:
            if left() < per_run:
                rows.append({"recipe": recipe, "workers": w, "error": "skipped: out of time"})
                continue
            rows.append(_child(a, "loader", ["--decode", "gpu", "--recipe", recipe, "--nw", str(w)]
                               + (["--blocking-sync"] if blocking else []), min(per_run, left())))
            print("gpu", rows[-1], flush=True)
            _save(res, out)
    for part in ("pixels", "floor"):
        if part in parts:
            res["parts"][part] = (_child(a, part, ["--nw", "4"], min(per_run + 30, left()))
                                  if left() > 30 else {"error": "skipped: out of time"})
            print(part, res["parts"][part], flush=True)
            _save(res, out)
    _save(res, out)
    print(_markdown(res))


if __name__ == "__main__":
    main()
