"""Single-process throughput of JPEG decode + ImageNet train transforms.

Compares, over in-memory JPEG bytes (one thread, ``cv2.setNumThreads(1)``):

  decode_bgr        plain ``cv2.imdecode`` to BGR, nothing else
  unfused           ``decode_rgb`` + Compose(RandomResizedCrop(224), RandomHorizontalFlip(),
                    ToTensor(), Normalize(imagenet))
  fused_float       ``compile_fused(recipe)``: JPEG bytes -> normalised (3, 224, 224) float32
  fused_uint8       ``compile_fused(recipe, output="uint8")``: -> (224, 224, 3) uint8
  fused_reduced     fused_float with ``partial_decode=False`` (DCT scaling only)
  fused_partial     fused_float with ``reduced_decode=False`` (row-limited decode only,
                    plus restart windows where the JPEG has restart markers)
  fused_plain       fused_float with both off: the whole image at full scale

With ``--restart-markers`` every JPEG is first transcoded as ``preprocess
--restart-markers`` stores it (lossless ``jpegtran -restart <m>B -optimize``: NOTE [ restart
windows ])
and two more methods run on the *original* bytes: ``orig_fused`` (fused_float) and
``orig_plain`` (fused_plain), so the table shows what the markers add and what they cost.

for a set of ~500x375 images (ImageNet-like), ~1200x900 photos and 2000x1500 photos, at
one or more JPEG qualities; then, on the draws where a reduced-scale decode applies,
"decoding less" (DCT scaling + stopping below the crop, NOTE [ row-limited decode ]) and
each technique alone against the plain path (and the decode alone), for the training
recipe and for the evaluation recipe in eval_mode="approximate" (Resize(256) + CenterCrop(224),
with the default exact mode's time beside it: the whole image is
the region, so a 1000+ px photo always gets a reduced decode).  Every method sees the
same (image, rng seed) sequence.

    python benchmarks/transforms_bench.py [--images 200] [--draws 2] [--quality 75,90]
        [--sets imagenet,photos,large] [--restart-markers] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import cv2
import numpy as np

from seqloader.format.jpeg import jpeg_frame
from seqloader.transforms import (CenterCrop, Compose, Normalize, RandomHorizontalFlip,
                                  RandomResizedCrop, Resize, ToTensor, compile_fused, decode_rgb)
from seqloader.transforms import jpegwindow as _jw
from seqloader.write.prepare import add_restart_markers

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SMALL_SIZES = [(375, 500)] * 6 + [(500, 375)] * 2 + [(333, 500), (400, 500), (375, 450)]
LARGE_SIZES = [(900, 1200), (1200, 900), (768, 1024), (960, 1280)]
HUGE_SIZES = [(1500, 2000), (2000, 1500)]
SIZES = {"imagenet": SMALL_SIZES, "photos": LARGE_SIZES, "large": HUGE_SIZES}


def synth_photo(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth multi-octave (1/f-like) colour noise, a few anti-aliased shapes, fine grain."""
    img = np.zeros((h, w, 3), np.float32)
    for octave in range(1, 8):  # grids from 1/128 to 1/2 of the image size
        gh, gw = max(2, h >> (8 - octave)), max(2, w >> (8 - octave))
        noise = rng.standard_normal((gh, gw, 3)).astype(np.float32)
        img += cv2.resize(noise, (w, h), interpolation=cv2.INTER_CUBIC) * (70.0 / octave)
    img = np.clip(img + 128 + rng.uniform(-40, 40, 3).astype(np.float32), 0, 255).astype(np.uint8)
    for _ in range(int(rng.integers(2, 7))):
        color = [int(c) for c in rng.integers(0, 256, 3)]
        center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        if rng.random() < 0.5:
            axes = (int(rng.integers(5, w // 4)), int(rng.integers(5, h // 4)))
            cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, color, -1,
                        cv2.LINE_AA)
        else:
            pts = rng.integers(0, [w, h], (int(rng.integers(3, 6)), 2)).astype(np.int32)
            cv2.fillPoly(img, [pts], color, cv2.LINE_AA)
    grain = rng.normal(0, 4, (h, w, 1)).astype(np.float32)
    return np.clip(img + grain, 0, 255).astype(np.uint8)


def make_set(sizes: list[tuple[int, int]], n: int, seed: int, quality: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = sizes[i % len(sizes)]
        ok, buf = cv2.imencode(".jpg", synth_photo(h, w, rng), [cv2.IMWRITE_JPEG_QUALITY, quality])
        out.append(buf.tobytes())
    return out


def timed(methods: dict, samples: list[tuple[bytes, int]], repeat: int,
          make_arg=np.random.default_rng) -> dict[str, np.ndarray]:
    """Per-sample seconds of each ``fn(data, make_arg(seed))``: methods interleaved per
    sample (in a random order each time), best of ``repeat`` runs, so that noise from
    other processes and clock changes hit all methods alike.  Arguments are made before timing."""
    for fn in methods.values():  # warm-up (scratch buffers, code paths)
        fn(samples[0][0], make_arg(samples[0][1]))
    names = list(methods)
    best = {m: np.full(len(samples), np.inf) for m in names}
    clock = time.perf_counter
    order = np.random.default_rng(12345)
    for r in range(repeat):
        args = {m: [make_arg(seed) for _, seed in samples] for m in names}
        for n, (data, _) in enumerate(samples):
            # a fresh random order per sample: a rotation would always run the same method
            # right after the same other one (e.g. after `unfused`, whose large arrays
            # evict the caches), a 4-5 % handicap measured on ImageNet-sized images
            for q in order.permutation(len(names)):
                m = names[q]
                fn, arg = methods[m], args[m][n]
                t0 = clock()
                fn(data, arg)
                best[m][n] = min(best[m][n], clock() - t0)
    return best


def bench_set(name: str, jpegs: list[bytes], draws: int, repeat: int,
              originals: list[bytes] | None = None) -> dict:
    recipe = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                      Normalize(MEAN, STD)])
    f32, u8 = compile_fused(recipe), compile_fused(recipe, output="uint8")
    variants = {"fused_reduced": compile_fused(recipe, partial_decode=False),
                "fused_partial": compile_fused(recipe, reduced_decode=False),
                "fused_plain": compile_fused(recipe, reduced_decode=False, partial_decode=False)}
    outs = {p: np.empty(p.out_shape, p.out_dtype) for p in (f32, u8, *variants.values())}
    samples = [(data, 1000 * d + i) for d in range(draws) for i, data in enumerate(jpegs)]
    plans, rows_share = [], []
    for data, seed in samples:
        frame = jpeg_frame(data)
        plans.append(f32.plan(frame.height, frame.width, np.random.default_rng(seed)))
        reg, _ = f32.decode_window(np.frombuffer(data, np.uint8), frame, plans[-1])
        rows_share.append((reg.bottom - reg.top) * (reg.right - reg.left)
                          / (frame.height * frame.width))
    ks = np.array([p.k for p in plans])

    methods = {
        "decode_bgr": lambda data, rng: cv2.imdecode(np.frombuffer(data, np.uint8),
                                                     cv2.IMREAD_COLOR),
        "unfused": lambda data, rng: recipe(decode_rgb(data), rng),
        "fused_float": lambda data, rng: f32(data, outs[f32], rng),
        "fused_uint8": lambda data, rng: u8(data, outs[u8], rng),
        **{name: (lambda data, rng, p=p: p(data, outs[p], rng)) for name, p in variants.items()},
    }
    if originals is not None:  # the same images without restart markers
        orig = {id(j): o for j, o in zip(jpegs, originals)}
        plain = variants["fused_plain"]
        methods["orig_fused"] = lambda data, rng: f32(orig[id(data)], outs[f32], rng)
        methods["orig_plain"] = lambda data, rng: plain(orig[id(data)], outs[plain], rng)
    times = timed(methods, samples, repeat)
    result = {"images": len(jpegs), "samples": len(samples),
              "mean_kb": round(float(np.mean([len(j) for j in jpegs])) / 1024, 1),
              "methods": {m: {"img_per_s": round(len(t) / t.sum(), 1),
                              "ms_per_img": round(1e3 * t.mean(), 3)} for m, t in times.items()},
              "reduced_share": round(float(np.mean(ks > 1)), 3),
              "k_counts": {int(k): int(np.sum(ks == k)) for k in (1, 2, 4, 8)},
              "rows_decoded_share": round(float(np.mean(rows_share)), 3),
              "speedup_all": _speedups(times, np.ones(len(samples), bool))}
    sel = ks > 1
    if sel.any():
        sub = [(data, int(k)) for (data, _), k in zip(samples, ks) if k > 1]
        decode = lambda data, k: _jw.decode(np.frombuffer(data, np.uint8), k)  # noqa: E731
        dec = timed({"full": lambda data, k: decode(data, 1), "reduced": decode}, sub, repeat,
                    make_arg=int)
        dec_full, dec_red = dec["full"], dec["reduced"]
        result["where_reduced"] = {
            "samples": int(sel.sum()),
            "fused_ms": round(1e3 * times["fused_float"][sel].mean(), 3),
            "fused_plain_ms": round(1e3 * times["fused_plain"][sel].mean(), 3),
            **_speedups(times, sel),
            "reduced_decode_only_speedup": round(dec_full.sum() / dec_red.sum(), 2),
        }
    result["eval"] = bench_eval(jpegs, repeat)
    # The floor: the smallest decode libjpeg can do (1/8 scale) still entropy-decodes
    # every coefficient; its time against the full decode bounds any DCT-scaling gain.
    eighth = timed({"full": lambda data, k: _jw.decode(np.frombuffer(data, np.uint8), 1),
                    "eighth": lambda data, k: _jw.decode(np.frombuffer(data, np.uint8), 8)},
                   [(data, 0) for data in jpegs], repeat, make_arg=int)
    result["max_dct_scaling_speedup"] = round(eighth["full"].sum() / eighth["eighth"].sum(), 2)
    return result


def _speedups(times: dict[str, np.ndarray], sel: np.ndarray) -> dict[str, float]:
    """Plain path's time over each variant's, on the samples ``sel``."""
    plain = times["fused_plain"][sel].sum()
    out = {"speedup": round(plain / times["fused_float"][sel].sum(), 2),
           "speedup_reduced_only": round(plain / times["fused_reduced"][sel].sum(), 2),
           "speedup_partial_only": round(plain / times["fused_partial"][sel].sum(), 2)}
    if "orig_plain" in times:  # against the plain path on the original (marker-less) bytes
        orig = times["orig_plain"][sel].sum()
        out.update(speedup_vs_orig_plain=round(orig / times["fused_float"][sel].sum(), 2),
                   orig_speedup=round(orig / times["orig_fused"][sel].sum(), 2))
    return out


def bench_eval(jpegs: list[bytes], repeat: int) -> dict:
    """The evaluation recipe, fused with vs without decoding less, on every image: in
    ``eval_mode="approximate"`` (the only one that decodes at reduced scale), and the
    default exact mode's time on the same samples."""
    recipe = Compose([Resize(256), CenterCrop(224), ToTensor(), Normalize(MEAN, STD)])
    red = compile_fused(recipe, eval_mode="approximate")
    full = compile_fused(recipe, reduced_decode=False, partial_decode=False,
                         eval_mode="approximate")
    exact = compile_fused(recipe)
    outs = {p: np.empty(p.out_shape, p.out_dtype) for p in (red, full, exact)}
    samples = [(data, i) for i, data in enumerate(jpegs)]
    ks = np.array([red.plan(*jpeg_frame(d)[:2], np.random.default_rng(s)).k
                   for d, s in samples])
    times = timed({"fused": lambda data, rng: red(data, outs[red], rng),
                   "fused_plain": lambda data, rng: full(data, outs[full], rng),
                   "fused_exact": lambda data, rng: exact(data, outs[exact], rng)},
                  samples, repeat)
    out = {"reduced_share": round(float(np.mean(ks > 1)), 3),
           "exact_ms": round(1e3 * times["fused_exact"].mean(), 3),
           "approximate_ms": round(1e3 * times["fused"].mean(), 3),
           "k_counts": {int(k): int(np.sum(ks == k)) for k in (1, 2, 4, 8)}}
    sel = ks > 1
    if sel.any():
        out.update(fused_ms=round(1e3 * times["fused"][sel].mean(), 3),
                   fused_plain_ms=round(1e3 * times["fused_plain"][sel].mean(), 3),
                   speedup=round(times["fused_plain"][sel].sum() / times["fused"][sel].sum(), 2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=200, help="JPEGs per set (default 200)")
    ap.add_argument("--draws", type=int, default=2, help="random crops per image (default 2)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per sample; the fastest counts (default 3)")
    ap.add_argument("--quality", default="90",
                    help="JPEG quality, or a comma list of them (default 90)")
    ap.add_argument("--sets", default="imagenet,photos",
                    help="comma list of: imagenet (~500x375), photos (~1200x900), "
                         "large (2000x1500)")
    ap.add_argument("--restart-markers", action="store_true",
                    help="transcode every JPEG with restart markers at MCU rows first "
                         "(needs jpegtran) and also time the original bytes")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if min(args.images, args.draws, args.repeat) <= 0:
        ap.error("--images, --draws and --repeat must be positive")
    try:
        qualities = [int(q) for q in args.quality.split(",") if q]
    except ValueError:
        ap.error(f"--quality {args.quality!r}: give integers 1-100, e.g. 75,90")
    if not qualities or not all(1 <= q <= 100 for q in qualities):
        ap.error(f"--quality {args.quality!r}: give integers 1-100, e.g. 75,90")
    names = [s for s in args.sets.split(",") if s]
    for name in names:
        if name not in SIZES:
            ap.error(f"unknown set {name!r}; use {', '.join(SIZES)}")
    cv2.setNumThreads(1)
    results = {"cv2": cv2.__version__, "numpy": np.__version__, "python": platform.python_version(),
               "cpu": platform.processor() or platform.machine(), "repeat": args.repeat,
               "quality": qualities, "restart_markers": args.restart_markers, "sets": {}}
    for n, name in enumerate(names):
        for q in qualities:
            jpegs = make_set(SIZES[name], args.images, seed=n, quality=q)
            key = name if len(qualities) == 1 else f"{name}-q{q}"
            originals = None
            if args.restart_markers:
                originals, jpegs = jpegs, [add_restart_markers(j) for j in jpegs]
            results["sets"][key] = bench_set(key, jpegs, args.draws, args.repeat, originals)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def print_table(results: dict) -> None:
    print(f"cv2 {results['cv2']}, numpy {results['numpy']}, 1 thread, best of "
          f"{results['repeat']} runs per sample\n")
    print(f"{'set':<10} {'method':<16} {'img/s':>8} {'ms/img':>8} {'vs unfused':>11}")
    for name, r in results["sets"].items():
        base = r["methods"]["unfused"]["img_per_s"]
        for m, v in r["methods"].items():
            print(f"{name:<10} {m:<16} {v['img_per_s']:>8.1f} {v['ms_per_img']:>8.3f} "
                  f"{v['img_per_s'] / base:>10.2f}x")
        a = r["speedup_all"]
        print(f"{name:<10} ({r['images']} JPEGs, mean {r['mean_kb']} KB, {r['samples']} samples; "
              f"reduced decode on {100 * r['reduced_share']:.1f}%, k counts {r['k_counts']}; "
              f"{100 * r['rows_decoded_share']:.0f}% of rows decoded)")
        print(f"{name:<10} all samples, vs plain: {a['speedup']}x (reduced only "
              f"{a['speedup_reduced_only']}x, row-limited only {a['speedup_partial_only']}x)")
        if "speedup_vs_orig_plain" in a:
            print(f"{name:<10} all samples, vs plain on the original bytes: "
                  f"{a['speedup_vs_orig_plain']}x (fused on the original bytes: "
                  f"{a['orig_speedup']}x)")
        w = r.get("where_reduced")
        if w:
            print(f"{name:<10} where reduced applies ({w['samples']}): fused {w['fused_ms']} ms vs "
                  f"plain {w['fused_plain_ms']} ms -> {w['speedup']}x (reduced only "
                  f"{w['speedup_reduced_only']}x, row-limited only {w['speedup_partial_only']}x; "
                  f"reduced decode alone {w['reduced_decode_only_speedup']}x)")
            if "speedup_vs_orig_plain" in w:
                print(f"{name:<10} where reduced applies, vs plain on the original bytes: "
                      f"{w['speedup_vs_orig_plain']}x (fused on the original bytes: "
                      f"{w['orig_speedup']}x)")
        e = r["eval"]
        if "speedup" in e:
            print(f"{name:<10} evaluation recipe (Resize 256 + CenterCrop 224): reduced on "
                  f"{100 * e['reduced_share']:.0f}%, k counts {e['k_counts']}: {e['fused_ms']} ms "
                  f"vs plain {e['fused_plain_ms']} ms -> {e['speedup']}x")
        print(f"{name:<10} ceiling of DCT scaling (1/8-scale decode vs full): "
              f"{r['max_dct_scaling_speedup']}x")
        print()


if __name__ == "__main__":
    main()
