"""Synthetic ImageNet-style datasets for demos, tests and benchmarks.

:func:`make_synthetic_imagenet` writes a tree in the ImageNet folder layout::

    root/train/<wnid>/<wnid>_<i>.JPEG
    root/val/<wnid>/<wnid>_<i>.JPEG

The images are *natural-ish*: a smooth multi-octave (1/f-like) colour field,
class-coloured stripes, a handful of anti-aliased shapes and fine film grain, so
that they compress like photos (about 100 KB mean at ~500x375, quality 90) and
so that a small CNN can learn the classes, but not trivially.  Each class has a
signature that survives RandomResizedCrop and horizontal flips because it
covers the whole image:

* a dominant hue (evenly spaced around the colour wheel, jittered per image,
  and replaced by a random hue in ~20% of the images),
* a stripe pattern (horizontal, vertical, diagonal cross-hatch or grid; all
  four are invariant under a horizontal flip) with a class-dependent period,
* a shape type (ellipse, triangle, rectangle, ring, cross, star) drawn in a
  class-dependent secondary colour, plus random distractor shapes.

Like real ImageNet, a small fraction of files are *odd* (grayscale JPEG, PNG
bytes under a ``.JPEG`` name, CMYK JPEG) and optionally some are *bad*
(undecodable: truncated, empty, text).

Everything is byte-for-byte deterministic for the same arguments, whatever
``workers`` is: image ``i`` of class ``c`` in split ``s`` is generated from
``np.random.default_rng(np.random.SeedSequence([seed, split_id, c, i]))``
(split_id: train=0, val=1, bad files=2).  CMYK files are written with Pillow,
which is optional: without it those files are written as ordinary RGB JPEGs and
a warning is emitted (so the tree then differs from one made with Pillow).

CMYK finding (checked with opencv-python-headless 5.0.0 and Pillow 13.0.0):
Pillow writes CMYK JPEGs Adobe-style (APP14 "Adobe" marker first, inverted
CMYK, and its naive RGB->CMYK conversion leaves K = 0).
``cv2.imdecode(buf, cv2.IMREAD_COLOR)`` (and ``IMREAD_UNCHANGED``) decodes
them to 3-channel BGR with the *correct* colours -- not inverted, channels not
swapped.  Versus ``PIL.Image.open(...).convert('RGB')`` (after BGR->RGB) the
mean abs difference is ~1.0 grey level, max 1: OpenCV's CMYK->BGR formula is
systematically +1 brighter (e.g. pure red (255,0,0) -> (255,1,1)).  Both are
~2.2 grey levels (mean abs) from the original RGB pixels at quality 90, i.e.
just JPEG loss.  So a loader using cv2 needs no CMYK special case for these
files (real Photoshop CMYK files with K > 0 were not tested here).
"""

from __future__ import annotations

import colorsys
import io
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

__all__ = ["SynthReport", "make_synthetic_imagenet", "make_image"]

_SPLIT_IDS = {"train": 0, "val": 1}
_BAD_SPLIT_ID = 2
_ODD_KINDS = ("gray", "png", "cmyk")
_BAD_KINDS = ("truncated", "empty", "text")
_SIZES = ("imagenet", "small")
_N_SHAPES = 6  # ellipse, triangle, rectangle, ring, cross, star
_N_STRIPES = 4  # horizontal, vertical, diagonal cross-hatch, grid
_MAX_CLASSES = 100_000
_GRAIN_LO, _GRAIN_HI = 2.0, 5.0  # percent
_TEX_LO, _TEX_HI, _TEX_DIV, _TEX_CHROMA = 25.0, 55.0, 3, 0.4


@dataclass(frozen=True)
class SynthReport:
    """What :func:`make_synthetic_imagenet` wrote.

    Attributes:
        root: the dataset root (contains ``train/`` and, if any, ``val/``).
        classes: class folder names (WordNet-id-like, ``n`` + 8 digits) in
            label order; label ``k`` is ``classes[k]`` and the list is sorted.
        counts: split -> number of image files written in that split (good +
            odd; bad files are *not* counted). Only splits that were written
            are present (``'val'`` is absent when ``val_per_class == 0``).
        odd_files: kind (``'gray'``, ``'png'``, ``'cmyk'``; all three keys are
            always present) -> sorted posix paths relative to ``root`` of files
            that decode but are not plain 3-channel JPEGs.
        bad_files: sorted posix paths relative to ``root`` of deliberately
            undecodable files (all in ``train/``).
        total_bytes: total size of all files written (good + odd + bad).
    """

    root: Path
    classes: list[str]
    counts: dict[str, int]
    odd_files: dict[str, list[str]]
    bad_files: list[str]
    total_bytes: int


# ----------------------------------------------------------------------------
# image content
# ----------------------------------------------------------------------------


def _class_params(label: int, num_classes: int) -> tuple[float, float, int, int, float]:
    """(hue_deg, secondary_hue_deg, stripe_kind, shape_kind, stripe_cycles)."""
    hue = (360.0 * label / num_classes + 15.0) % 360.0
    hue2 = (hue + 150.0 + 40.0 * ((label // 3) % 2)) % 360.0
    stripe_kind = label % _N_STRIPES
    shape_kind = label % _N_SHAPES
    # cycles across the short side; varies with the class, independently-ish
    stripe_cycles = (5.0, 8.0, 12.0)[(label // 2) % 3]
    return hue, hue2, stripe_kind, shape_kind, stripe_cycles


def _smooth_field(rng: np.random.Generator, lh: int, lw: int, channels: int,
                  beta: float = 1.0) -> np.ndarray:
    """Multi-octave 1/f-like noise at (lh, lw, channels), float32, ~zero mean, ~unit range."""
    out = np.zeros((lh, lw, channels), np.float32)
    s = 2
    total = 0.0
    while True:
        gh = max(2, min(s, lh))
        gw = max(2, min(int(round(s * lw / max(lh, 1))), lw))
        amp = 1.0 / (s ** beta)
        small = rng.standard_normal((gh, gw, channels), dtype=np.float32)
        up = cv2.resize(small, (lw, lh), interpolation=cv2.INTER_CUBIC)
        if up.ndim == 2:
            up = up[:, :, None]
        out += amp * up
        total += amp * amp
        if s >= lh and gw >= lw:
            break
        s *= 2
        if s > 4 * max(lh, lw):
            break
    out *= 1.0 / math.sqrt(total)
    return out


def _hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float32 HSV (h in degrees, s/v in [0,1]) -> float32 RGB in [0,1] via OpenCV."""
    hsv = np.stack([np.mod(h, 360.0), np.clip(s, 0, 1), np.clip(v, 0, 1)], axis=-1)
    return cv2.cvtColor(hsv.astype(np.float32), cv2.COLOR_HSV2RGB)


def _hsv_color(hue: float, sat: float, val: float) -> tuple[float, float, float]:
    """One HSV colour (hue in degrees, s/v in [0, 1]) -> RGB tuple in [0, 255]."""
    r, g, b = colorsys.hsv_to_rgb((hue % 360.0) / 360.0, min(max(sat, 0.0), 1.0),
                                  min(max(val, 0.0), 1.0))
    return (r * 255.0, g * 255.0, b * 255.0)


def _stripes(rng: np.random.Generator, kind: int, cycles: float, h: int, w: int) -> np.ndarray:
    """Stripe pattern in [-1, 1], float32, shape (h, w) or broadcastable (h, 1)/(1, w)."""
    period = min(h, w) / (cycles * rng.uniform(0.8, 1.25))
    period = max(period, 3.0)
    phase = rng.uniform(0, 2 * math.pi)
    k = np.float32(2 * math.pi / period)
    ys = np.arange(h, dtype=np.float32)
    xs = np.arange(w, dtype=np.float32)
    if kind == 0:  # horizontal stripes
        return np.sin(ys * k + phase)[:, None]
    if kind == 1:  # vertical stripes
        return np.sin(xs * k + phase)[None, :]
    if kind == 2:  # diagonal cross-hatch (both diagonals => flip-invariant)
        # 0.5 * (sin(a + b + p) + sin(a - b + p)) == sin(a + p) * cos(b): an outer product
        kd = k / np.float32(math.sqrt(2))
        return np.outer(np.sin(ys * kd + phase), np.cos(xs * kd))
    # grid: horizontal + vertical
    return 0.5 * (np.sin(ys * k + phase)[:, None] + np.sin(xs * k + phase)[None, :])


def _draw_shape(img: np.ndarray, rng: np.random.Generator, kind: int,
                color: tuple[float, float, float], h: int, w: int) -> None:
    m = min(h, w)
    r = max(2.0, m * rng.uniform(0.04, 0.13))
    cx = rng.uniform(-0.05, 1.05) * w
    cy = rng.uniform(-0.05, 1.05) * h
    lt = cv2.LINE_AA
    thick = max(1, int(round(r * rng.uniform(0.15, 0.35))))
    if kind == 0:  # ellipse
        axes = (int(r), int(r * rng.uniform(0.45, 0.95)))
        cv2.ellipse(img, (int(cx), int(cy)), axes, float(rng.uniform(0, 180)), 0, 360,
                    color, -1, lt)
    elif kind == 1:  # triangle
        a0 = rng.uniform(0, 2 * math.pi)
        ang = a0 + np.array([0, 2.1, 4.2]) + rng.uniform(-0.25, 0.25, 3)
        pts = np.stack([cx + r * np.cos(ang), cy + r * np.sin(ang)], 1).astype(np.int32)
        cv2.fillPoly(img, [pts], color, lt)
    elif kind == 2:  # axis-aligned rectangle
        rw, rh = r * rng.uniform(0.6, 1.2), r * rng.uniform(0.6, 1.2)
        cv2.rectangle(img, (int(cx - rw), int(cy - rh)), (int(cx + rw), int(cy + rh)),
                      color, -1, lt)
    elif kind == 3:  # ring
        cv2.circle(img, (int(cx), int(cy)), int(r), color, thick, lt)
    elif kind == 4:  # cross '+'
        cv2.line(img, (int(cx - r), int(cy)), (int(cx + r), int(cy)), color, thick, lt)
        cv2.line(img, (int(cx), int(cy - r)), (int(cx), int(cy + r)), color, thick, lt)
    else:  # 5-point star
        a0 = rng.uniform(0, 2 * math.pi)
        ang = a0 + np.arange(10) * (math.pi / 5)
        rad = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
        pts = np.stack([cx + rad * np.cos(ang), cy + rad * np.sin(ang)], 1).astype(np.int32)
        cv2.fillPoly(img, [pts], color, lt)


def make_image(rng: np.random.Generator, label: int, num_classes: int, height: int,
               width: int) -> np.ndarray:
    """Generate one synthetic photo-like image of class ``label``.

    Args:
        rng: source of all randomness (the result is a pure function of the
            generator state and the other arguments; the generator is advanced).
        label: class index, ``0 <= label < num_classes``.
        num_classes: number of classes (hues are spaced ``360/num_classes``
            degrees apart, so classes are visually separable for small counts).
        height, width: output size in pixels, both >= 1.

    Returns:
        ``(height, width, 3)`` uint8 array, **RGB** channel order, C-contiguous.

    The class signature (hue, stripe pattern, shape type + secondary colour,
    see the module docstring) covers the whole image, so it survives crops and
    horizontal flips; per-image jitter (hue noise, 20% off-palette images,
    random stripe strength/period/phase, distractor shapes, texture, grain)
    keeps it from being trivial. Reference point: a 4-layer CNN trained on
    10 classes x 300 images with RandomResizedCrop(48)+flip reached ~75% val
    accuracy after 2 epochs and ~90% after 8 (64 px, 500 per class).

    Cost: ~3 ms at 500x375 on one core (plus ~1 ms for JPEG encoding).
    """
    if num_classes < 1 or not 0 <= label < num_classes:
        raise ValueError(f"label={label} must satisfy 0 <= label < num_classes={num_classes}")
    if height < 1 or width < 1:
        raise ValueError(f"height={height}, width={width}: both must be >= 1")
    h, w = int(height), int(width)
    hue_c, hue2_c, stripe_kind, shape_kind, cycles = _class_params(label, num_classes)
    spacing = 360.0 / num_classes

    # --- per-image global variation
    if rng.random() < 0.2:  # off-palette image: hue says nothing about the class
        hue = rng.uniform(0, 360)
    else:
        hue = hue_c + rng.normal(0, min(0.3 * spacing, 25.0))
    sat0 = rng.uniform(0.25, 0.8)
    val0 = rng.uniform(0.35, 0.8)

    # --- smooth 1/f background at 1/12 resolution (HSV -> RGB), upsampled to 1/3
    # resolution where a mid-frequency colour texture is added (foliage / gravel /
    # fabric-like detail, the main source of photo-like JPEG sizes), then upsampled
    # once to full resolution.
    mh, mw = max(4, -(-h // _TEX_DIV)), max(4, -(-w // _TEX_DIV))
    lh, lw = max(4, -(-h // 12)), max(4, -(-w // 12))
    f = _smooth_field(rng, lh, lw, 3)
    rgb_low = _hsv_to_rgb(hue + 20.0 * f[..., 0], sat0 + 0.25 * f[..., 1],
                          val0 + 0.3 * f[..., 2])
    rgb_low *= 255.0
    mid = cv2.resize(rgb_low, (mw, mh), interpolation=cv2.INTER_CUBIC)
    tex_amp = rng.uniform(_TEX_LO, _TEX_HI)
    # mostly luminance texture (shared by the 3 channels) plus weaker colour texture
    t = rng.integers(-128, 128, size=(mh, mw, 4), dtype=np.int8).astype(np.float32)
    t *= np.float32(tex_amp / 74.0)  # uniform(-128,128) has sd ~74
    mid += t[..., :1]
    mid += np.float32(_TEX_CHROMA) * t[..., 1:]
    img = cv2.resize(mid, (w, h), interpolation=cv2.INTER_LINEAR)

    # --- shapes: class shapes in the class secondary colour + random distractors
    n_cls = int(rng.integers(4, 11))
    n_dis = int(rng.integers(1, 5))
    for _ in range(n_cls):
        c = _hsv_color(hue2_c + rng.normal(0, 15), rng.uniform(0.5, 1.0), rng.uniform(0.5, 1.0))
        _draw_shape(img, rng, shape_kind, c, h, w)
    for _ in range(n_dis):
        c = _hsv_color(rng.uniform(0, 360), rng.uniform(0, 1), rng.uniform(0.1, 1))
        _draw_shape(img, rng, int(rng.integers(0, _N_SHAPES)), c, h, w)

    # --- class stripes + fine grain: one multiplicative luminance modulation of the
    # whole image (grain is multiplicative like photon noise: stronger in bright areas)
    amp = np.float32(rng.uniform(0.08, 0.3))
    s = _stripes(rng, stripe_kind, cycles, h, w)
    grain = rng.uniform(_GRAIN_LO, _GRAIN_HI) / 100.0  # relative sd
    mod = rng.integers(-128, 128, size=(h, w), dtype=np.int8).astype(np.float32)
    mod *= np.float32(grain / 74.0)  # uniform(-128,128) has sd ~74
    mod += np.float32(1.0)
    mod += amp * s
    # multiply + round + saturate to uint8 in one OpenCV pass (much faster than a
    # numpy (h,w,3)*(h,w,1) broadcast followed by clip and astype)
    out = cv2.multiply(img, cv2.merge((mod, mod, mod)), dtype=cv2.CV_8U)
    return np.ascontiguousarray(out)


# ----------------------------------------------------------------------------
# sizes, names, encoding
# ----------------------------------------------------------------------------


def _draw_size(rng: np.random.Generator, size: str) -> tuple[int, int]:
    """(height, width) drawn like ImageNet ('imagenet') or tiny ('small')."""
    if size == "small":
        return int(rng.integers(64, 129)), int(rng.integers(64, 129))
    u = rng.random()
    if u < 0.03:  # small photos, long side < 250
        long = int(rng.integers(90, 250))
        ratio = rng.uniform(0.6, 1.0)
        short = max(32, int(round(long * ratio)))
        return (short, long) if rng.random() < 0.7 else (long, short)
    if u < 0.08:  # large photos, long side 800-1600
        long = int(rng.integers(800, 1601))
        ratio = (0.75, 0.6667, 0.5625, 0.8)[int(rng.integers(0, 4))]
        short = int(round(long * ratio))
        return (short, long) if rng.random() < 0.75 else (long, short)
    v = rng.random()
    if v < 0.50:
        h, w = 375, 500
    elif v < 0.72:
        h, w = 500, 375
    elif v < 0.85:
        h, w = 333, 500
    elif v < 0.91:
        h, w = 500, 500
    else:  # other aspect ratios with one side 500
        other = int(rng.integers(250, 500))
        h, w = (other, 500) if rng.random() < 0.7 else (500, other)
    if rng.random() < 0.15:  # a bit of variation around the common sizes
        h = max(32, h + int(rng.integers(-40, 41)))
        w = max(32, w + int(rng.integers(-40, 41)))
    return h, w


def _wnids(seed: int, n: int) -> list[str]:
    """n distinct WordNet-id-like names, sorted, deterministic from the seed."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED_C1A5]))
    seen: set[int] = set()
    out: list[int] = []
    while len(out) < n:
        for v in rng.integers(1_000_000, 15_000_000, size=max(16, n - len(out))).tolist():
            if v not in seen:
                seen.add(v)
                out.append(v)
                if len(out) == n:
                    break
    return sorted(f"n{v:08d}" for v in out)


def _pil_available() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def _encode(rgb: np.ndarray, kind: str, quality: int) -> bytes:
    """Encode an RGB uint8 image as 'jpeg' | 'gray' | 'png' | 'cmyk'."""
    if kind == "jpeg":
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                               [cv2.IMWRITE_JPEG_QUALITY, quality])
    elif kind == "gray":
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY),
                               [cv2.IMWRITE_JPEG_QUALITY, quality])
    elif kind == "png":
        ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                               [cv2.IMWRITE_PNG_COMPRESSION, 1])
    elif kind == "cmyk":
        from PIL import Image  # optional dependency, imported lazily

        bio = io.BytesIO()
        Image.fromarray(rgb).convert("CMYK").save(bio, "JPEG", quality=quality)
        return bio.getvalue()
    else:  # pragma: no cover - internal
        raise AssertionError(kind)
    if not ok:  # pragma: no cover - cv2 failure
        raise RuntimeError(f"cv2.imencode failed for kind {kind!r}")
    return buf.tobytes()


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# A task: (relpath, split_id, class_idx, i, kind, num_classes, seed, size, quality)
_Task = tuple[str, int, int, int, str, int, int, str, int]


def _run_task(task: _Task, root: str) -> tuple[str, str, int]:
    """Generate and write one file. Returns (relpath, kind, nbytes)."""
    rel, split_id, cls, i, kind, num_classes, seed, size, quality = task
    rng = np.random.default_rng(np.random.SeedSequence([seed, split_id, cls, i]))
    if kind in ("empty", "text"):
        data = b"" if kind == "empty" else (
            b"<html><body>404 Not Found: this is not a JPEG</body></html>\n")
    else:
        h, w = _draw_size(rng, size)
        rgb = make_image(rng, cls, num_classes, h, w)
        if kind == "truncated":
            full = _encode(rgb, "jpeg", quality)
            data = full[: max(1, int(len(full) * 0.4))]
        else:
            data = _encode(rgb, kind, quality)
    _write_atomic(os.path.join(root, rel), data)
    return rel, kind, len(data)


def _run_chunk(args: tuple[list[_Task], str]) -> list[tuple[str, str, int]]:
    tasks, root = args
    return [_run_task(t, root) for t in tasks]


def _make_pool(workers: int):
    """A multiprocessing Pool whose workers run OpenCV single-threaded.

    Linux: ``fork`` (no ``__main__`` guard needed in callers, fast start); elsewhere
    ``spawn``.  See NOTE [ OpenCV threads and fork ] in :mod:`seqloader.dataflow.threads`.
    """
    import multiprocessing as mp
    import sys

    from ..dataflow.threads import forking_single_threaded, limit_worker_threads

    method = "fork" if sys.platform.startswith("linux") else "spawn"
    with forking_single_threaded(method):
        return mp.get_context(method).Pool(workers, initializer=limit_worker_threads)


# ----------------------------------------------------------------------------
# public entry point
# ----------------------------------------------------------------------------


def _check_int(name: str, value: object, lo: int, hi: int | None = None, fix: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r} must be an int{'; ' + fix if fix else ''}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng_txt = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}={v} must be {rng_txt}{'; ' + fix if fix else ''}")
    return v


def make_synthetic_imagenet(root: str | os.PathLike[str], *, classes: int = 10,
                            per_class: int = 20, val_per_class: int = 5, seed: int = 0,
                            odd_fraction: float = 0.01, bad: int = 0,
                            size: str = "imagenet", quality: int = 90, workers: int = 1,
                            progress: bool = True) -> SynthReport:
    """Write a synthetic dataset in the ImageNet folder layout and describe it.

    Layout: ``root/train/<wnid>/<wnid>_<i>.JPEG`` for ``i in range(per_class)``
    and ``root/val/<wnid>/<wnid>_<i>.JPEG`` for ``i in range(val_per_class)``
    (no ``val/`` when ``val_per_class == 0``). ``<wnid>`` is ``n`` + 8 digits,
    distinct, deterministic from ``seed``; the sorted folder names are the
    label order (``report.classes``).

    Contracts:
        * The output is byte-for-byte identical for identical arguments,
          independent of ``workers`` and ``progress`` (and of Pillow's
          presence except for the CMYK files, see below).
        * Odd files: ``round(odd_fraction * N)`` of the ``N`` train+val images
          (at least 3 -- one of each kind -- when ``odd_fraction > 0`` and
          ``N >= 3``), chosen deterministically, are written as grayscale JPEG,
          PNG bytes (under the ``.JPEG`` name) or CMYK JPEG, cycling through
          these kinds. CMYK needs Pillow (imported lazily); without it those
          images are written as ordinary RGB JPEGs, not listed as odd, and a
          ``UserWarning`` says to ``pip install pillow``.
        * ``bad`` undecodable files are added to ``train/`` (named like the
          others, ``<wnid>_<per_class + k // classes>.JPEG`` in class
          ``k % classes``), cycling through: truncated JPEG (first 40% of the
          bytes), zero-byte file, text file. They are not counted in
          ``counts`` and are listed in ``bad_files``.
        * Every file is written to ``<name>.tmp`` and then ``os.replace``-d, so
          an interrupted run never leaves a partial file under a final name.
        * ``root`` may exist, but ``root/train`` and ``root/val`` must not
          already contain anything (FileExistsError otherwise).

    Args:
        root: output directory (created if missing).
        classes: number of classes, 1..100000.
        per_class: train images per class, >= 1.
        val_per_class: val images per class, >= 0.
        seed: non-negative int seed.
        odd_fraction: fraction of images written as odd files, in [0, 1].
        bad: number of undecodable files to add to train, >= 0.
        size: ``"imagenet"`` (ImageNet-like sizes, mostly ~500x375, ~5% with
            the long side 800-1600 px, ~3% with the long side < 250 px) or
            ``"small"`` (64-128 px per side, for fast tests).
        quality: JPEG quality 1..100.
        workers: processes to use (``1`` = in-process, OpenCV threading left
            as the caller set it). Workers run OpenCV single-threaded. On
            Linux the pool uses ``fork`` (works from any script, no
            ``__main__`` guard needed; the caller's ``cv2.setNumThreads`` is
            set to 1 only while forking, then restored); elsewhere ``spawn``
            (callers need the usual ``if __name__ == "__main__":`` guard).
        progress: show a tqdm progress bar.

    Returns:
        A :class:`SynthReport`.

    Raises:
        ValueError: an argument is out of range (the message names it and the fix).
        FileExistsError: ``root/train`` or ``root/val`` is not empty.
    """
    classes = _check_int("classes", classes, 1, _MAX_CLASSES, "use at least one class")
    per_class = _check_int("per_class", per_class, 1, None,
                           "every class needs at least one train image")
    val_per_class = _check_int("val_per_class", val_per_class, 0, None,
                               "use 0 to skip the val split")
    seed = _check_int("seed", seed, 0, None, "use a non-negative int seed")
    bad = _check_int("bad", bad, 0, None, "use 0 for no undecodable files")
    quality = _check_int("quality", quality, 1, 100, "JPEG quality is 1..100 (90 is typical)")
    workers = _check_int("workers", workers, 1, None, "use 1 for in-process generation")
    if isinstance(odd_fraction, bool) or not isinstance(odd_fraction, (int, float, np.floating)) \
            or not 0.0 <= float(odd_fraction) <= 1.0:
        raise ValueError(f"odd_fraction={odd_fraction!r} must be a float in [0, 1]; "
                         "use 0 for no odd (gray/PNG/CMYK) files")
    odd_fraction = float(odd_fraction)
    if size not in _SIZES:
        raise ValueError(f"size={size!r} is not supported; use one of {_SIZES}")

    root_p = Path(root)
    splits = [("train", per_class)] + ([("val", val_per_class)] if val_per_class > 0 else [])
    for split, _ in splits:
        d = root_p / split
        if d.exists() and any(d.iterdir()):
            raise FileExistsError(f"{d} is not empty; delete it or choose another root "
                                  "(make_synthetic_imagenet never overwrites a dataset)")
    names = _wnids(seed, classes)

    # --- plan every file (deterministic order)
    good: list[tuple[str, int, int, int]] = []  # (rel, split_id, cls, i)
    for split, n in splits:
        sid = _SPLIT_IDS[split]
        for c, wnid in enumerate(names):
            for i in range(n):
                good.append((f"{split}/{wnid}/{wnid}_{i}.JPEG", sid, c, i))
    n_good = len(good)
    n_odd = int(round(odd_fraction * n_good))
    if odd_fraction > 0 and n_good >= 3:
        n_odd = max(n_odd, len(_ODD_KINDS))
    n_odd = min(n_odd, n_good)
    kinds = ["jpeg"] * n_good
    if n_odd:
        sel_rng = np.random.default_rng(np.random.SeedSequence([seed, 0x0DD_F11E]))
        chosen = sel_rng.choice(n_good, size=n_odd, replace=False)
        for j, idx in enumerate(chosen.tolist()):
            kinds[idx] = _ODD_KINDS[j % len(_ODD_KINDS)]
    have_pil = _pil_available()
    if not have_pil and "cmyk" in kinds:
        n_skip = kinds.count("cmyk")
        warnings.warn(f"Pillow is not installed: writing {n_skip} CMYK file(s) as ordinary "
                      "RGB JPEGs instead; `pip install pillow` to include CMYK JPEGs",
                      UserWarning, stacklevel=2)
        kinds = ["jpeg" if k == "cmyk" else k for k in kinds]

    tasks: list[_Task] = [(rel, sid, c, i, k, classes, seed, size, quality)
                          for (rel, sid, c, i), k in zip(good, kinds)]
    for k in range(bad):
        c, i = k % classes, per_class + k // classes
        wnid = names[c]
        tasks.append((f"train/{wnid}/{wnid}_{i}.JPEG", _BAD_SPLIT_ID, c, i,
                      _BAD_KINDS[k % len(_BAD_KINDS)], classes, seed, size, quality))

    for split, _ in splits:
        for wnid in names:
            (root_p / split / wnid).mkdir(parents=True, exist_ok=True)

    # --- run
    from tqdm import tqdm

    root_s = str(root_p)
    results: list[tuple[str, str, int]] = []
    bar = tqdm(total=len(tasks), unit="img", desc="synth", disable=not progress,
               dynamic_ncols=True)
    try:
        if workers == 1:
            for t in tasks:
                results.append(_run_task(t, root_s))
                bar.update(1)
        else:
            chunk = max(1, min(32, len(tasks) // (workers * 8) or 1))
            chunks: Iterator[tuple[list[_Task], str]] = (
                (tasks[j:j + chunk], root_s) for j in range(0, len(tasks), chunk))
            with _make_pool(workers) as pool:
                for res in pool.imap_unordered(_run_chunk, chunks):
                    results.extend(res)
                    bar.update(len(res))
    finally:
        bar.close()

    counts = {split: 0 for split, _ in splits}
    odd: dict[str, list[str]] = {k: [] for k in _ODD_KINDS}
    bad_files: list[str] = []
    total = 0
    for rel, kind, nbytes in results:
        total += nbytes
        if kind in _BAD_KINDS:
            bad_files.append(rel)
            continue
        counts[rel.split("/", 1)[0]] += 1
        if kind in odd:
            odd[kind].append(rel)
    for v in odd.values():
        v.sort()
    bad_files.sort()
    return SynthReport(root=root_p, classes=names, counts=counts, odd_files=odd,
                       bad_files=bad_files, total_bytes=total)
