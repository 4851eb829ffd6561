"""Synthetic ImageNet-style datasets for demos, tests and benchmarks.

:func:`make_synthetic_imagenet` writes a tree in the ImageNet folder layout::

    root/train/<wnid>/<wnid>_<i>.JPEG
    root/val/<wnid>/<wnid>_<i>.JPEG

The images are drawn by :mod:`seqloader.tools.synth_draw` (natural-ish photos at
ImageNet-like sizes whose class survives crops and flips); this module writes them,
in parallel, each file atomically.

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

import io
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from .synth_draw import SIZES, draw_size, make_image
from ..errors import OutputExistsError

__all__ = ["SynthReport", "make_synthetic_imagenet"]

_SPLIT_IDS = {"train": 0, "val": 1}
_BAD_SPLIT_ID = 2
_ODD_KINDS = ("gray", "png", "cmyk")
_BAD_KINDS = ("truncated", "empty", "text")
_MAX_CLASSES = 100_000
#: The file in the root that records what a tree was made with (NOTE [ synth identity ]).
MARKER = ".seqloader-synth.json"


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
        already: True when the tree was complete already (the same call ran before:
            nothing was written; NOTE [ synth identity ]).
    """

    root: Path
    classes: list[str]
    counts: dict[str, int]
    odd_files: dict[str, list[str]]
    bad_files: list[str]
    total_bytes: int
    already: bool = False


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
        h, w = draw_size(rng, size)
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
    ``spawn``.  See NOTE [ OpenCV threads and fork ] in :mod:`seqloader.workers.threads`.
    """
    import multiprocessing as mp
    import sys

    from ..workers.threads import forking_single_threaded, limit_worker_threads

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
        * ``root`` may exist; ``root/train`` and ``root/val`` must be empty, or
          hold the tree of this very call (then it returns that tree's report
          with ``already`` True, or, if that call was interrupted, writes it
          again); another tree is refused with FileExistsError.

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
        progress: show a progress bar (on a terminal: NOTE [ bars on terminals only ]).

    Returns:
        A :class:`SynthReport`.

    Raises:
        ValueError: an argument is out of range (the message names it and the fix).
        FileExistsError: ``root/train`` or ``root/val`` holds another tree.
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
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not supported; use one of {SIZES}")

    root_p = Path(root)
    splits = [("train", per_class)] + ([("val", val_per_class)] if val_per_class > 0 else [])
    have_pil = _pil_available()
    identity = {"classes": classes, "per_class": per_class, "val_per_class": val_per_class,
                "seed": seed, "odd_fraction": odd_fraction, "bad": bad, "size": size,
                "quality": quality, "cmyk": have_pil}
    done = _check_root(root_p, [s for s, _ in splits], identity)
    if done is not None:
        return done
    root_p.mkdir(parents=True, exist_ok=True)
    _write_marker(root_p, identity, None)
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
    from ..progress import progress_bar

    root_s = str(root_p)
    results: list[tuple[str, str, int]] = []
    bar = progress_bar(total=len(tasks), unit="img", desc="synth", progress=progress,
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
    report = SynthReport(root=root_p, classes=names, counts=counts, odd_files=odd,
                         bad_files=bad_files, total_bytes=total)
    _write_marker(root_p, identity, report)
    return report


# NOTE [ synth identity ]
# ``root/.seqloader-synth.json`` records the options a tree is made with (before the
# first file; with the report once complete).  The same call again returns the report
# (``already``) without writing, or, after an interruption, writes every file again
# (the same bytes); other options, or a split folder holding anything else, are refused.


def _check_root(root: Path, splits: list[str], identity: dict) -> SynthReport | None:
    """The finished report of this very tree, None to (re)write it; OutputExistsError
    when ``root`` holds another tree (NOTE [ synth identity ])."""
    try:
        doc = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict) and doc.get("identity") == identity:
        rep = doc.get("report")
        if rep is None:
            return None  # an interrupted run of the same options: written again
        return SynthReport(root=root, **rep, already=True)
    if isinstance(doc, dict) and isinstance(doc.get("identity"), dict):
        old = doc["identity"]
        diff = ", ".join(f"{k} {old.get(k)!r} (now {v!r})" for k, v in identity.items()
                         if old.get(k) != v)
        raise OutputExistsError(f"{root} holds a synthetic dataset made with other options "
                                f"({diff}); delete it, or choose another folder")
    for split in splits:
        d = root / split
        if d.exists() and any(d.iterdir()):
            raise OutputExistsError(f"{d} is not empty (and not a synthetic dataset); "
                                    "delete it, or choose another folder")
    return None


def _write_marker(root: Path, identity: dict, report: SynthReport | None) -> None:
    rep = None if report is None else {
        "classes": report.classes, "counts": report.counts, "odd_files": report.odd_files,
        "bad_files": report.bad_files, "total_bytes": report.total_bytes}
    _write_atomic(str(root / MARKER), json.dumps({"identity": identity, "report": rep},
                                                 indent=1).encode())
