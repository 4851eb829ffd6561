"""Tests for seqloader.tools.synth (fast: size="small", tmp_path)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from seqloader.tools import synth
from seqloader.tools.synth import MARKER, SynthReport, make_synthetic_imagenet
from seqloader.tools.synth_draw import draw_size, make_image

HAVE_PIL = synth._pil_available()

_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_components(data: bytes) -> int:
    """Number of colour components from the JPEG SOFn header (1 gray, 3 YCbCr, 4 CMYK)."""
    assert data[:2] == b"\xff\xd8", "not a JPEG (no SOI)"
    i = 2
    while i + 4 <= len(data):
        assert data[i] == 0xFF, f"bad marker at {i}"
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        seg_len = int.from_bytes(data[i + 2:i + 4], "big")
        if marker in _SOF_MARKERS:
            return data[i + 9]
        i += 2 + seg_len
    raise AssertionError("no SOF marker found")


def small(root: Path, **kw) -> SynthReport:
    args = dict(classes=3, per_class=4, val_per_class=2, size="small", progress=False)
    args.update(kw)
    return make_synthetic_imagenet(root, **args)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every image file's bytes (the record of the options, .seqloader-synth.json, aside)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER}


def decode(path: Path, flags: int = cv2.IMREAD_COLOR):
    return cv2.imdecode(np.frombuffer(path.read_bytes(), np.uint8), flags)


# ----------------------------------------------------------------------------


def test_layout_classes_and_counts(tmp_path):
    rep = small(tmp_path / "ds", odd_fraction=0.0)
    root = tmp_path / "ds"
    assert rep.root == root
    assert len(rep.classes) == 3 and len(set(rep.classes)) == 3
    assert rep.classes == sorted(rep.classes)
    assert all(re.fullmatch(r"n\d{8}", c) for c in rep.classes)
    assert sorted(p.name for p in (root / "train").iterdir()) == rep.classes
    assert sorted(p.name for p in (root / "val").iterdir()) == rep.classes
    for split, n in (("train", 4), ("val", 2)):
        for wnid in rep.classes:
            names = sorted(p.name for p in (root / split / wnid).iterdir())
            assert names == sorted(f"{wnid}_{i}.JPEG" for i in range(n))
    assert rep.counts == {"train": 12, "val": 6}
    assert rep.odd_files == {"gray": [], "png": [], "cmyk": []}
    assert rep.bad_files == []
    files = tree_bytes(root)
    assert len(files) == 18
    assert rep.total_bytes == sum(len(b) for b in files.values())
    assert not any(k.endswith(".tmp") for k in files)
    for rel, data in files.items():  # all plain 3-component JPEGs that decode
        assert jpeg_components(data) == 3, rel
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.ndim == 3 and img.shape[2] == 3
        assert 64 <= img.shape[0] <= 128 and 64 <= img.shape[1] <= 128


def test_val_skipped_when_zero(tmp_path):
    rep = small(tmp_path, val_per_class=0, odd_fraction=0.0)
    assert not (tmp_path / "val").exists()
    assert rep.counts == {"train": 12}


def test_deterministic_and_independent_of_workers(tmp_path):
    kw = dict(odd_fraction=0.1, bad=3)
    r1 = small(tmp_path / "a", workers=1, **kw)
    r2 = small(tmp_path / "b", workers=2, **kw)
    r3 = small(tmp_path / "c", workers=1, **kw)
    t1, t2, t3 = (tree_bytes(tmp_path / d) for d in "abc")
    assert t1 == t2 == t3
    for r in (r2, r3):
        assert (r.classes, r.counts, r.odd_files, r.bad_files, r.total_bytes) == \
            (r1.classes, r1.counts, r1.odd_files, r1.bad_files, r1.total_bytes)
    r4 = small(tmp_path / "d", seed=1, **kw)
    assert r4.classes != r1.classes
    t4 = tree_bytes(tmp_path / "d")
    assert sorted(t4.values()) != sorted(t1.values())


def test_odd_files(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with Pillow there must be no warning
        if not HAVE_PIL:
            warnings.simplefilter("ignore")
        rep = small(tmp_path, classes=2, per_class=5, val_per_class=2, odd_fraction=0.01)
    kinds = ("gray", "png", "cmyk") if HAVE_PIL else ("gray", "png")
    for kind in kinds:
        assert len(rep.odd_files[kind]) == 1, kind
    odd = {p for v in rep.odd_files.values() for p in v}
    assert rep.counts == {"train": 10, "val": 4}
    for rel, data in tree_bytes(tmp_path).items():
        path = tmp_path / rel
        assert path.suffix == ".JPEG"
        img = decode(path)
        assert img is not None and img.ndim == 3 and img.shape[2] == 3, rel
        if rel not in odd:
            assert jpeg_components(data) == 3, rel
    (gray,) = rep.odd_files["gray"]
    data = (tmp_path / gray).read_bytes()
    assert jpeg_components(data) == 1
    assert decode(tmp_path / gray, cv2.IMREAD_UNCHANGED).ndim == 2
    (png,) = rep.odd_files["png"]
    assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if HAVE_PIL:
        (cmyk,) = rep.odd_files["cmyk"]
        assert jpeg_components((tmp_path / cmyk).read_bytes()) == 4


@pytest.mark.skipif(not HAVE_PIL, reason="Pillow not installed")
def test_cmyk_decodes_to_correct_colours(tmp_path):
    import io

    from PIL import Image

    rep = small(tmp_path, classes=1, per_class=3, val_per_class=0, odd_fraction=1.0)
    (cmyk,) = rep.odd_files["cmyk"]
    data = (tmp_path / cmyk).read_bytes()
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "CMYK"
        ref = np.asarray(im.convert("RGB")).astype(np.int16)
    got = decode(tmp_path / cmyk)[..., ::-1].astype(np.int16)
    assert got.shape == ref.shape
    assert np.abs(got - ref).mean() < 2.0  # measured ~1.0 (OpenCV rounds +1)


def test_cmyk_skipped_with_warning_without_pillow(tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "_pil_available", lambda: False)
    with pytest.warns(UserWarning, match="pip install pillow"):
        rep = small(tmp_path, classes=2, per_class=5, val_per_class=2, odd_fraction=0.01)
    assert rep.odd_files["cmyk"] == []
    assert len(rep.odd_files["gray"]) == 1 and len(rep.odd_files["png"]) == 1
    assert rep.counts == {"train": 10, "val": 4}
    for rel, data in tree_bytes(tmp_path).items():
        assert data[:2] == b"\xff\xd8" or data[:4] == b"\x89PNG", rel
        if data[:2] == b"\xff\xd8":
            assert jpeg_components(data) in (1, 3), rel


def test_odd_fraction_rounding(tmp_path):
    rep = small(tmp_path / "a", classes=4, per_class=10, val_per_class=0, odd_fraction=0.5)
    n = sum(len(v) for v in rep.odd_files.values())
    assert n == (20 if HAVE_PIL else 20 - len(range(2, 20, 3)))
    rep = small(tmp_path / "b", classes=1, per_class=2, val_per_class=0, odd_fraction=0.5)
    assert sum(len(v) for v in rep.odd_files.values()) == 1  # < 3 images: no minimum


def test_bad_files(tmp_path):
    rep = small(tmp_path, bad=4, odd_fraction=0.0)
    assert rep.counts == {"train": 12, "val": 6}  # bad files are not counted
    assert len(rep.bad_files) == 4
    good_sizes = [len(b) for rel, b in tree_bytes(tmp_path).items() if rel not in rep.bad_files]
    sizes = []
    for rel in rep.bad_files:
        assert rel.startswith("train/") and rel.endswith(".JPEG")
        assert re.fullmatch(r"train/(n\d{8})/\1_\d+\.JPEG", rel)
        data = (tmp_path / rel).read_bytes()
        sizes.append(len(data))
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if data else None
        truncated = data[:2] == b"\xff\xd8" and not data.endswith(b"\xff\xd9")
        assert img is None or truncated, rel
    assert sizes.count(0) == 1  # empty
    kinds = [("jpeg" if (tmp_path / r).read_bytes()[:2] == b"\xff\xd8" else
              "empty" if not (tmp_path / r).read_bytes() else "text") for r in rep.bad_files]
    assert sorted(kinds) == ["empty", "jpeg", "jpeg", "text"]
    assert max(s for s, k in zip(sizes, kinds) if k == "jpeg") < max(good_sizes)
    assert rep.total_bytes == sum(len(b) for b in tree_bytes(tmp_path).values())


@pytest.mark.parametrize("kw, name", [
    (dict(classes=0), "classes"),
    (dict(classes=2.5), "classes"),
    (dict(per_class=0), "per_class"),
    (dict(val_per_class=-1), "val_per_class"),
    (dict(seed=-1), "seed"),
    (dict(odd_fraction=1.5), "odd_fraction"),
    (dict(odd_fraction=-0.1), "odd_fraction"),
    (dict(bad=-1), "bad"),
    (dict(size="huge"), "size"),
    (dict(quality=0), "quality"),
    (dict(quality=101), "quality"),
    (dict(workers=0), "workers"),
])
def test_argument_validation(tmp_path, kw, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        small(tmp_path / "x", **kw)
    assert not (tmp_path / "x").exists()


def test_the_same_call_twice_is_done_once_and_another_is_refused(tmp_path, capsys):
    """The identical command run twice used to be refused, naming an internal function."""
    from seqloader.cli import main

    argv = ["synth", str(tmp_path / "t"), "--classes", "2", "--per-class", "2",
            "--val-per-class", "1", "--size", "small", "--no-progress"]
    assert main(argv) == 0
    before = tree_bytes(tmp_path / "t")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and tree_bytes(tmp_path / "t") == before, out
    assert main(argv[:-1] + ["--seed", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "other options (seed 0 (now 3))" in err and "make_synthetic" not in err, err
    again = small(tmp_path / "t", classes=2, per_class=2, val_per_class=1)
    assert again.already and sum(again.counts.values()) == 6


def test_an_interrupted_tree_is_written_again(tmp_path, monkeypatch):
    from seqloader.tools import synth

    real, calls = synth._run_task, []

    def dies(task, root):
        calls.append(task)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(task, root)
    monkeypatch.setattr(synth, "_run_task", dies)
    with pytest.raises(KeyboardInterrupt):
        small(tmp_path / "a")
    monkeypatch.setattr(synth, "_run_task", real)
    rep = small(tmp_path / "a")
    assert not rep.already and tree_bytes(tmp_path / "a") == tree_bytes(small(tmp_path / "b").root)


def test_refuses_non_empty_split(tmp_path):
    (tmp_path / "train" / "mine").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="not empty"):
        small(tmp_path, classes=1, per_class=1, val_per_class=0)


def test_make_image_contract():
    for h, w in [(1, 1), (7, 300), (64, 96), (375, 500)]:
        img = make_image(np.random.default_rng(0), 3, 10, h, w)
        assert img.shape == (h, w, 3) and img.dtype == np.uint8 and img.flags.c_contiguous
    a = make_image(np.random.default_rng(5), 1, 10, 80, 90)
    b = make_image(np.random.default_rng(5), 1, 10, 80, 90)
    c = make_image(np.random.default_rng(6), 1, 10, 80, 90)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.std() > 10  # not flat
    with pytest.raises(ValueError, match="label"):
        make_image(np.random.default_rng(0), 10, 10, 8, 8)
    with pytest.raises(ValueError, match="height"):
        make_image(np.random.default_rng(0), 0, 10, 0, 8)


def test_classes_differ_in_colour():
    # mean hue signature: class means of many images differ more than within-class noise
    means = []
    for label in range(4):
        imgs = [make_image(np.random.default_rng(i), label, 4, 48, 48) for i in range(20)]
        means.append(np.mean([im.reshape(-1, 3).mean(0) for im in imgs], axis=0))
    means = np.array(means)
    d = np.abs(means[:, None] - means[None]).sum(-1)
    assert d[~np.eye(4, dtype=bool)].min() > 5


def test_imagenet_size_distribution():
    rng = np.random.default_rng(0)
    sizes = np.array([draw_size(rng, "imagenet") for _ in range(4000)])
    long = sizes.max(1)
    assert 0.03 < (long >= 800).mean() < 0.08
    assert 0.015 < (long < 250).mean() < 0.05
    assert 0.6 < ((long >= 450) & (long <= 540)).mean()
    assert 350 < sizes.mean() < 550
    sizes = np.array([draw_size(rng, "small") for _ in range(500)])
    assert sizes.min() >= 64 and sizes.max() <= 128


def test_workers_after_parent_used_opencv_threads(tmp_path):
    # Regression: calling cv2.setNumThreads() in a forked child after the parent ran a
    # multi-threaded OpenCV op deadlocks. Run in a subprocess so a hang becomes a failure.
    import subprocess
    import sys

    code = (
        "import cv2, numpy as np, sys\n"
        "n0 = cv2.getNumThreads()\n"
        "cv2.resize(np.zeros((1500, 1500, 3), np.float32), (2000, 2000))\n"
        "from seqloader.tools.synth import make_synthetic_imagenet\n"
        "r = make_synthetic_imagenet(sys.argv[1], classes=2, per_class=6, val_per_class=0,\n"
        "                            size='small', workers=2, progress=False)\n"
        "assert r.counts == {'train': 12}, r.counts\n"
        "assert cv2.getNumThreads() == n0  # the caller's setting is restored\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ds")], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")
