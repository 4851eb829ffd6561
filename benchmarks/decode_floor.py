"""How fast can a "decode less" training pipeline be, at best, on a set of photos?

The fused pipeline's gain on large photos comes from decoding less: a reduced-scale
(DCT-scaled) decode, and with restart markers only the restart segments around the crop
(NOTEs [ row-limited decode ] and [ restart windows ] in
``seqloader/transforms/jpegwindow.py``).  What no decoder built on libjpeg(-turbo) can skip is the Huffman (entropy) decoding of every
8x8 block inside the crop: codes have no boundaries, so the bits of each block must be
walked, at any output scale.  This script measures, on the draws of RandomResizedCrop(224)
where a reduced decode applies, against the plain path (whole image decoded at full
scale, then the same crop/resize/flip/normalise -- ``fused_plain`` of
``transforms_bench.py``, on the original bytes):

  plain         the plain path, ms per image
  fused         what ships: ``compile_fused`` on the bytes ``preprocess --restart-markers``
                stores (restart segments every ~4 MCUs, optimal Huffman tables)
  perfect       an ideal cropper with free splicing: the crop's own MCUs (a copy of the
                image with a restart marker after *every* MCU, spliced to exactly the
                crop, no margins) decoded at the plan's scale, plus the real render
                (crop/resize/flip/normalise) of that decode
  floor         a lower bound on any such pipeline's time: the same exact-crop copy
                decoded at 1/8 scale (entropy decoding plus the cheapest IDCT, 1 px per
                block) plus the render -- everything but the entropy decoding is assumed
                free except the render
  floor(bytes)  the same bound estimated without the every-MCU markers (which slow
                libjpeg-turbo's Huffman decoder): a 1/8-scale decode of the whole
                original image x the share of its entropy-coded bytes inside the crop
                (per-MCU byte counts from the every-MCU copy), plus the render

and prints each as a speed-up over ``plain``, with the shipped path's stages, and the
decoding alone (each stage timed on its own): the plain path's whole-image full-scale
decode against the shipped path's window + splice + reduced decode -- the renders differ
too (the plain path's resamples a crop 2-4x larger).  Then
(unless ``--no-grids``) whether a finer restart grid would pay: the fused path over
copies with a marker every MCU, every ~2 MCUs and every ~4 (what the writer stores).  If the floor's speed-up is below a goal,
no amount of cropping, splicing or scaling reaches that goal on those images with this
decoder; only decoding fewer bits would (smaller files, or a different codec).

    python benchmarks/decode_floor.py [--images 60] [--draws 2] [--quality 75,90]
        [--sets photos,large] [--no-grids] [--json out.json]

``--sets`` takes the named sets of ``transforms_bench.py`` (photos: ~1200x900 and
1024x768 mixed; large: 2000x1500) and, as ``reduced_by_size.py`` does, long sides in px
(e.g. ``1024``: 4:3 photos of 1024x768, half landscape, half portrait).

One thread (``cv2.setNumThreads(1)``), best of ``--repeat`` per sample, methods
interleaved per sample as in ``transforms_bench.timed``.  Needs ``jpegtran``
(libjpeg-turbo-progs) and simplejpeg.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transforms_bench import MEAN, SIZES, STD, make_set, timed  # noqa: E402

from seqloader.transforms import jpegwindow as _jw  # noqa: E402
from seqloader.transforms.geometry import Window  # noqa: E402
from seqloader.format.jpeg import (add_restart_index, jpeg_frame, jpeg_scan,  # noqa: E402
                                   restart_marks)
from seqloader.write.prepare import add_restart_markers  # noqa: E402
from seqloader.transforms import (Compose, Normalize, RandomHorizontalFlip,  # noqa: E402
                                  RandomResizedCrop, ToTensor, compile_fused)


def every_mcu(data: bytes, mcus: int = 1) -> bytes:
    """``data`` losslessly transcoded with a restart marker after every ``mcus`` MCUs."""
    return subprocess.run(["jpegtran", "-restart", f"{mcus}B", "-optimize", "-copy", "none"],
                          input=data, capture_output=True, check=True).stdout


def grid_costs(originals: list[bytes], draws: int, repeat: int) -> dict:
    """Would a finer restart grid pay?  A finer grid rounds a window out less (the
    decoded region shrinks), but every marker costs bytes, Huffman-decoder restarts and
    splice work.  The fused pipeline on the same draws (those with a reduced decode) over
    copies with a marker every MCU, every ~2 MCUs (2, else 3, else 1: a divisor of the
    row) and as ``preprocess --restart-markers`` stores them (~4), each with a restart index
    (NOTE [ restart index ]), against the plain
    path; methods interleaved per sample (``transforms_bench.timed``)."""
    recipe = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                      Normalize(MEAN, STD)])
    fused = compile_fused(recipe)
    plain = compile_fused(recipe, reduced_decode=False, partial_decode=False)
    out = np.empty(fused.out_shape, fused.out_dtype)

    def near2(o: bytes) -> bytes:
        fr = jpeg_frame(o)
        per = -(-fr.width // fr.mcu_width)
        return every_mcu(o, next(m for m in (2, 3, 1) if per % m == 0))

    copies = {"every MCU": [add_restart_index(every_mcu(o)) for o in originals],
              "~2 MCUs": [add_restart_index(near2(o)) for o in originals],
              "stored (~4 MCUs)": [add_restart_markers(o) for o in originals]}
    samples = []
    for d in range(draws):
        for i, o in enumerate(originals):
            fr = jpeg_frame(o)
            if fused.plan(fr.height, fr.width, np.random.default_rng(1000 * d + i)).k >= 2:
                samples.append((i, 1000 * d + i))
    if not samples:
        return {}
    methods = {"plain": lambda i, rng: plain(originals[i], out, rng)}
    for name, files in copies.items():
        methods[name] = lambda i, rng, files=files: fused(files[i], out, rng)
    best = timed(methods, samples, repeat)
    base = float(best["plain"].mean())
    return {name: {"kb": round(float(np.mean([len(f) for f in files])) / 1e3, 1),
                   "fused_ms": round(float(best[name].mean()) * 1e3, 3),
                   "speedup": round(base / float(best[name].mean()), 2)}
            for name, files in copies.items()}


def exact_crop(fine: np.ndarray, frame, w: Window) -> tuple[np.ndarray, _jw.Region]:
    """The every-MCU copy spliced to the MCUs that hold the crop (no margins)."""
    mh, mw = frame.mcu_height, frame.mcu_width
    reg = _jw.Region(math.floor(w.y0) // mh * mh, min(-(-math.ceil(w.y1) // mh) * mh, frame.height),
                     math.floor(w.x0) // mw * mw, min(-(-math.ceil(w.x1) // mw) * mw, frame.width))
    scan = jpeg_scan(fine, frame)
    out = _jw._splice(fine, frame, scan, reg)
    if out is None:
        raise RuntimeError("every-MCU copy does not tile: unexpected jpegtran output")
    return out, reg


def crop_byte_share(fine: np.ndarray, frame, reg: _jw.Region) -> float:
    """Share of the entropy-coded bytes (markers excluded) that code the MCUs of ``reg``."""
    scan = jpeg_scan(fine, frame)
    data = fine[scan.offset:]
    marks = restart_marks(data)
    ends = np.concatenate((marks, [len(data) - 2]))  # EOI at the end
    starts = np.concatenate(([0], marks + 2))
    sizes = (ends - starts).astype(np.float64)
    per_row = -(-frame.width // frame.mcu_width)
    rows = -(-frame.height // frame.mcu_height)
    if len(sizes) != per_row * rows:
        raise RuntimeError("every-MCU copy: segment count does not match the MCU grid")
    grid = sizes.reshape(rows, per_row)
    r0, r1 = reg.top // frame.mcu_height, -(-reg.bottom // frame.mcu_height)
    c0, c1 = reg.left // frame.mcu_width, -(-reg.right // frame.mcu_width)
    return float(grid[r0:r1, c0:c1].sum() / grid.sum())


def decode(data, k: int, h: int, w: int) -> np.ndarray:
    """Decode at the smallest scale, at most 1/``k``, whose size is at least ``h`` x ``w``
    (simplejpeg: 1 x 1 gives 1/8; 0 x 0 the full size)."""
    import simplejpeg
    return simplejpeg.decode_jpeg(bytes(data), colorspace="RGB", min_height=h, min_width=w,
                                  min_factor=k, strict=False)


def best_of(fn, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_set(name: str, originals: list[bytes], draws: int, repeat: int) -> dict:
    recipe = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                      Normalize(MEAN, STD)])
    fused = compile_fused(recipe)
    plain = compile_fused(recipe, reduced_decode=False, partial_decode=False)
    out = np.empty(fused.out_shape, fused.out_dtype)
    local = threading.local()
    rows = []
    for i, orig in enumerate(originals):
        stored = add_restart_markers(orig)
        fine = np.frombuffer(every_mcu(orig), np.uint8)
        frame = jpeg_frame(orig)
        for d in range(draws):
            seed = 1000 * d + i
            p = fused.plan(frame.height, frame.width, np.random.default_rng(seed))
            if p.k < 2:
                continue
            spliced, reg = exact_crop(fine, frame, p.window)
            h = -(-(reg.bottom - reg.top) // p.k)
            w = -(-(reg.right - reg.left) // p.k)
            img = decode(spliced, p.k, h, w)
            assert img.shape == (h, w, 3), (img.shape, h, w)
            share = crop_byte_share(fine, frame, reg)
            # the shipped path's stages (NOTE [ restart windows ]), for the breakdown
            sbuf = np.frombuffer(stored, np.uint8)
            sframe = jpeg_frame(stored)
            sreg, sscan = fused.decode_window(sbuf, sframe, p)
            simg, sreg2 = _jw.decode_jpeg(sbuf, sframe, p.k, sreg, local, sscan)
            simg = simg.copy()
            # the plain path's stages: the whole original image at full scale, then render
            obuf = np.frombuffer(orig, np.uint8)
            whole = _jw.Region(0, frame.height, 0, frame.width)
            pp = plain.plan(frame.height, frame.width, np.random.default_rng(seed))
            pimg, _ = _jw.decode_jpeg(obuf, frame, 1, whole, local)
            pimg = pimg.copy()
            # generators made before timing (default_rng costs ~30 us)
            gens = {m: iter([np.random.default_rng(seed) for _ in range(repeat + 1)])
                    for m in ("plain", "fused")}
            timings = {
                "plain": lambda: plain(orig, out, next(gens["plain"])),
                "fused": lambda: fused(stored, out, next(gens["fused"])),
                "crop_decode": lambda: decode(spliced, p.k, h, w),
                "crop_decode_8": lambda: decode(spliced, 8, 1, 1),
                "whole_decode_8": lambda: decode(orig, 8, 1, 1),
                "render": lambda: fused._render(img, p, reg, out),
                "fused_window": lambda: fused.decode_window(sbuf, sframe, p),
                "fused_splice": lambda: _jw._splice(sbuf, sframe, sscan, sreg)
                if sscan is not None else None,
                "fused_decode": lambda: _jw.decode_jpeg(sbuf, sframe, p.k, sreg, local, sscan),
                "fused_render": lambda: fused._render(simg, p, sreg2, out),
                "plain_decode": lambda: _jw.decode_jpeg(obuf, frame, 1, whole, local),
                "plain_render": lambda: plain._render(pimg, pp, whole, out),
            }
            for fn in timings.values():  # warm-up
                fn()
            order = np.random.default_rng(seed).permutation(len(timings))
            names = list(timings)
            t = {names[j]: best_of(timings[names[j]], repeat) for j in order}
            t["fused_decode"] -= t["fused_splice"]  # (decode_jpeg splices first)
            t["share"] = share
            t["region_px"] = (sreg2.bottom - sreg2.top) * (sreg2.right - sreg2.left)
            t["crop_px"] = (reg.bottom - reg.top) * (reg.right - reg.left)
            t["k"] = p.k
            rows.append(t)
    if not rows:
        return {"set": name, "samples": 0}
    mean = {key: float(np.mean([r[key] for r in rows])) for key in rows[0] if key != "k"}
    perfect = mean["crop_decode"] + mean["render"]
    floor = mean["crop_decode_8"] + mean["render"]
    floor_bytes = float(np.mean([r["whole_decode_8"] * r["share"] for r in rows])) + mean["render"]
    # the decoding alone, each path's own way (stages timed on their own, as above)
    fused_decoding = mean["fused_window"] + mean["fused_splice"] + mean["fused_decode"]
    return {
        "set": name, "samples": len(rows), "images": len(originals),
        "k_counts": {int(k): sum(r["k"] == k for r in rows) for k in (2, 4, 8)},
        "crop_bytes_share": round(mean["share"], 3),
        "region_vs_crop_px": round(mean["region_px"] / mean["crop_px"], 3),
        "ms": {**{key: round(v * 1e3, 3) for key, v in mean.items()
                  if key not in ("share", "region_px", "crop_px")},
               "fused_decoding": round(fused_decoding * 1e3, 3)},
        "speedup": {"fused": round(mean["plain"] / mean["fused"], 2),
                    "perfect": round(mean["plain"] / perfect, 2),
                    "floor": round(mean["plain"] / floor, 2),
                    "floor_bytes": round(mean["plain"] / floor_bytes, 2),
                    "decoding": round(mean["plain_decode"] / fused_decoding, 2)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--draws", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quality", default="75,90")
    ap.add_argument("--sets", default="photos,large")
    ap.add_argument("--no-grids", action="store_true",
                    help="skip the comparison of restart grids (every MCU / ~2 / ~4)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if shutil.which("jpegtran") is None:
        print("decode_floor.py needs jpegtran (apt install libjpeg-turbo-progs)", file=sys.stderr)
        return 2
    cv2.setNumThreads(1)
    results = []
    sets = {}
    for s in args.sets.split(","):
        if s.isdigit() and int(s) >= 16:
            sets[s] = [(int(s) * 3 // 4, int(s)), (int(s), int(s) * 3 // 4)]
        elif s in SIZES:
            sets[s] = SIZES[s]
        else:
            ap.error(f"--sets: unknown set {s!r}; use {', '.join(SIZES)} or a long side in px")
    for s, sizes in sets.items():
        for q in (int(v) for v in args.quality.split(",")):
            originals = make_set(sizes, args.images, 0, q)
            res = bench_set(f"{s}-q{q}", originals, args.draws, args.repeat)
            if not args.no_grids:
                res["restart_grids"] = grid_costs(originals, args.draws, args.repeat)
            results.append(res)
            if not res["samples"]:
                print(f"{res['set']}: no draw gets a reduced decode")
                continue
            ms, sp = res["ms"], res["speedup"]
            print(f"{res['set']}: {res['samples']} draws with a reduced decode (k {res['k_counts']}),"
                  f" crop = {res['crop_bytes_share']:.0%} of the entropy-coded bytes")
            print(f"  plain {ms['plain']:.3f} ms | fused {ms['fused']:.3f} ms = {sp['fused']}x |"
                  f" perfect crop {ms['crop_decode']:.3f} + render {ms['render']:.3f} ="
                  f" {sp['perfect']}x | floor {ms['crop_decode_8']:.3f} + render = {sp['floor']}x"
                  f" | floor(bytes) {sp['floor_bytes']}x")
            print(f"  fused's stages: window {ms['fused_window']:.3f} + splice {ms['fused_splice']:.3f}"
                  f" + decode {ms['fused_decode']:.3f} + render {ms['fused_render']:.3f} ms;"
                  f" decoded region = {res['region_vs_crop_px']}x the crop's MCUs")
            print(f"  decoding alone: plain {ms['plain_decode']:.3f} ms (whole image, full scale)"
                  f" vs fused {ms['fused_decoding']:.3f}"
                  f" ms (window + splice + decode) = {sp['decoding']}x; render: plain"
                  f" {ms['plain_render']:.3f} / fused {ms['fused_render']:.3f} ms")
            for m, c in res.get("restart_grids", {}).items():
                print(f"  restart grid {m:17s}: {c['kb']:7.1f} KB, fused {c['fused_ms']:.3f} ms"
                      f" = {c['speedup']}x plain")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
