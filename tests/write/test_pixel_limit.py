"""The pixel limit (NOTE [ pixel limit ]): decompression bombs are refused from their
headers, before anything decodes them, in bounded memory -- as bad files of the write,
with their size -- and the Loader refuses a record over its limit with a RecordError."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import read_records
from seqloader.cli import main
from seqloader.format.imagesize import DEFAULT_MAX_PIXELS, image_size
from seqloader.tools.bombs import jpeg_bomb, png_bomb
from test_damaged_inputs import _jpeg

REPO = Path(__file__).resolve().parents[2]


def _run(argv, capsys):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        rc = main(["preprocess", *argv, "--workers", "1", "--no-progress"])
    return rc, capsys.readouterr().err


def _encoded(ext: str, h: int, w: int) -> bytes:
    img = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), np.uint8)
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def test_the_default_follows_pillow():
    from PIL import Image

    assert DEFAULT_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS == 178_956_970


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".tiff", ".ppm", ".pgm",
                                 ".jp2", ".hdr", ".ras", ".pfm", ".pam", ".exr"])
def test_sizes_come_from_the_header_of_every_format_opencv_writes(ext):
    if ext == ".exr" and os.environ.get("OPENCV_IO_ENABLE_OPENEXR") is None:
        pytest.skip("OpenCV writes EXR only with OPENCV_IO_ENABLE_OPENEXR")
    img = np.random.default_rng(0).integers(0, 256, (37, 53, 3), np.uint8)
    if ext in (".hdr", ".pfm", ".exr"):
        img = img.astype(np.float32) / 255
    ok, buf = cv2.imencode(ext, img if ext != ".pgm" else img[:, :, 0])
    if not ok:
        pytest.skip(f"this OpenCV does not write {ext}")
    assert image_size(buf.tobytes()) == (53, 37)


def test_gif_and_headers_pillow_reads():
    from io import BytesIO

    from PIL import Image

    for fmt in ("GIF", "TGA", "PCX"):
        b = BytesIO()
        Image.new("RGB", (53, 37)).save(b, fmt)
        assert image_size(b.getvalue()) == (53, 37), fmt


#: Prepares each bomb in a fresh process: prints its reason and seconds, and how far the
#: process's peak RSS rose above its RSS before (MB; the peak reset first: it is inherited
#: across fork and exec, so the parent's own peak would hide a rise).
_PROBE = textwrap.dedent("""
    import json, time
    from seqloader.tools.bombs import jpeg_bomb, png_bomb
    from seqloader.write.prepare import prepare_image

    def kb(key):
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))

    bombs = [jpeg_bomb(20000, 20000), png_bomb(30000, 30000)]
    prepare_image(b"warm-up")
    open("/proc/self/clear_refs", "w").write("5")  # (resets the peak, VmHWM)
    base, out = kb("VmRSS"), []
    for data in bombs:
        t = time.perf_counter()
        p = prepare_image(data)
        out.append([len(data), p.error, time.perf_counter() - t])
    print(json.dumps([out, (kb("VmHWM") - base) / 1024]))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")
def test_bombs_are_refused_quickly_in_bounded_memory():
    """A 631-byte JPEG of 20000x20000 and an 875 KB PNG of 30000x30000: on main stored
    as 400- and 900-megapixel records (16 s / 2.4 GB, 44 s / 5.3 GB)."""
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    (jpeg, png), rise_mb = json.loads(r.stdout.strip().splitlines()[-1])
    assert jpeg[0] < 1000 and 800_000 < png[0] < 1_000_000, (jpeg, png)
    assert "20000x20000 = 400,000,000 pixels is over the pixel limit" in (jpeg[1] or "")
    assert "30000x30000 = 900,000,000 pixels" in (png[1] or "")
    assert jpeg[2] < 2 and png[2] < 2, (jpeg, png)  # (main: 16 s and 44 s; here ~0.1 ms)
    assert rise_mb < 50, rise_mb  # (main: 1,200 MB for the JPEG's pixels alone)


def _tree_with_bombs(root: Path) -> Path:
    for c in ("n01", "n02"):
        d = root / "train" / c
        d.mkdir(parents=True)
        for i in range(3):
            (d / f"{c}_{i}.JPEG").write_bytes(_jpeg(10 * len(c) + i))
    (root / "train" / "n01" / "bomb.JPEG").write_bytes(jpeg_bomb())
    (root / "train" / "n02" / "bomb.png").write_bytes(png_bomb())
    (root / "train" / "n02" / "big.png").write_bytes(_encoded(".png", 50, 40))  # 2,000 px
    return root


def _bad(out: Path) -> dict[str, str]:
    tsv = out / "ILSVRC-train.lmdb.bad-files.tsv"
    rows = [line.split("\t") for line in tsv.read_text().splitlines()] if tsv.exists() else []
    return {Path(r[0]).name: r[-1] for r in rows}


def test_preprocess_lists_bombs_as_bad_files_with_their_size(tmp_path, capsys):
    root = _tree_with_bombs(tmp_path / "data")
    rc, err = _run([str(root), str(tmp_path / "a")], capsys)
    assert rc == 0, err
    names = sorted(r.path for _, r in read_records(tmp_path / "a" / "ILSVRC-train.lmdb"))
    assert len(names) == 7 and "n02/big.png" in names and not any("bomb" in n for n in names)
    bad = _bad(tmp_path / "a")
    assert "20000x20000" in bad["bomb.JPEG"] and "30000x30000" in bad["bomb.png"], bad

    # the same from a tar of the tree, and --max-pixels moves the limit
    tar = tmp_path / "train.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root / "train", arcname="train")
    rc, err = _run([str(tar), str(tmp_path / "b"), "--max-pixels", "1000"], capsys)
    assert rc == 0, err
    names = sorted(r.path for _, r in read_records(tmp_path / "b" / "ILSVRC-train.lmdb"))
    assert len(names) == 6 and "n02/big.png" not in names
    assert "40x50 = 2,000 pixels is over the pixel limit of 1,000" in _bad(tmp_path / "b")[
        "big.png"]

    # the limit is part of what a database was written with
    rc, err = _run([str(root), str(tmp_path / "a"), "--max-pixels", "1000"], capsys)
    assert rc == 2 and "--max-pixels 178956970 then, 1000 now" in err, err
    rc, err = _run([str(tar), str(tmp_path / "b")], capsys)
    assert rc == 2 and "already exists" in err, err
    rc, err = _run([str(root), str(tmp_path / "c"), "--max-pixels", "-3"], capsys)
    assert rc == 2 and "max_pixels (--max-pixels) must be a positive number" in err, err


def test_write_dataset_refuses_bombs_as_bad_samples(tmp_path):
    from seqloader import write_dataset
    from seqloader.errors import NoRecordsError

    samples = [(_jpeg(i), i % 2) for i in range(4)] + [(jpeg_bomb(), 0), (png_bomb(), 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = write_dataset(samples, tmp_path / "out", workers=1, progress=False)
    assert report.num_records == 4
    reasons = " ".join(b[-1] for b in report.bad_files)
    assert "20000x20000" in reasons and "30000x30000" in reasons
    with warnings.catch_warnings(), pytest.raises(
            NoRecordsError, match="24x24 = 576 pixels is over the pixel limit of 100"):
        warnings.simplefilter("ignore")  # (24x24 = 576 > 100: every sample is bad)
        write_dataset(samples[:4], tmp_path / "out2", workers=1, progress=False, max_pixels=100)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_loader_refuses_a_record_over_its_limit(tmp_path, capsys, workers):
    """A database written without the limit (--max-pixels 0) holding a 2-megapixel
    image: Loader(max_pixels=10**6) names the record and the option."""
    from seqloader import Loader
    from seqloader.errors import RecordError
    from seqloader.transforms import CenterCrop, Compose, Resize, ToTensor

    d = tmp_path / "data" / "train" / "n01"
    d.mkdir(parents=True)
    (d / "small.JPEG").write_bytes(_jpeg(1))
    (d / "large.JPEG").write_bytes(_encoded(".jpg", 1000, 2000))
    rc, err = _run([str(tmp_path / "data"), str(tmp_path / "db"), "--max-pixels", "0",
                    "--no-shuffle"], capsys)
    assert rc == 0, err
    t = Compose([Resize(16), CenterCrop(16), ToTensor()])
    with Loader(tmp_path / "db", "train", t, batch_size=2, num_workers=workers) as loader:
        assert next(iter(loader))[0].shape == (2, 3, 16, 16)  # (the default limit: read)
    with Loader(tmp_path / "db", "train", t, batch_size=2, num_workers=workers,
                max_pixels=10**6) as loader:
        with pytest.raises(RecordError) as e:
            next(iter(loader))
    assert "n01/large.JPEG" in str(e.value) and "2000x1000 = 2,000,000 pixels" in str(e.value)
    assert "max_pixels" in str(e.value)
    with pytest.raises(ValueError, match="max_pixels must be a positive number"):
        Loader(tmp_path / "db", "train", t, max_pixels=0)
