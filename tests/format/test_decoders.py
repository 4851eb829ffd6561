"""Real-world images: whatever OpenCV or Pillow decodes is stored and loads, quietly
(NOTE [ damaged JPEGs ] in write/prepare.py, NOTE [ decoder chatter ] in decoders.py).

The corpus is written here with OpenCV and Pillow and then damaged the ways real
files are."""
import io
import os
import warnings

import cv2
import numpy as np
import pytest
import simplejpeg

from conftest import read_records
from seqloader import Loader, WriteOptions
from seqloader.write.scan import scan_class_tree
from seqloader.write.writer import write_split
from seqloader.format.decoders import captured_stderr, clean_jpeg_header
from seqloader.format.imagecheck import check_stored, sniff_format
from seqloader.write.prepare import prepare_image
from seqloader.transforms import Compose, RandomResizedCrop, ToTensor
from seqloader.write.outfiles import WARNED

Image = pytest.importorskip("PIL.Image")


def _photo(h=48, w=64):
    y, x = np.mgrid[0:h, 0:w]
    return np.dstack([(x * 4) % 256, (y * 5) % 256, ((x + y) * 2) % 256]).astype(np.uint8)


def _cv(ext, img=None, params=()):
    return cv2.imencode(ext, _photo() if img is None else img, list(params))[1].tobytes()


def _pil(fmt, **kw):
    buf = io.BytesIO()
    Image.fromarray(_photo()[:, :, ::-1]).save(buf, fmt, **kw)
    return buf.getvalue()


def _at(data, marker):
    return data.index(bytes([0xFF, marker]))


def _corpus():
    """name -> (bytes, expected: 'as-is' | 'repaired' | a reencoded format | 'bad')."""
    j = _cv(".jpg", params=[cv2.IMWRITE_JPEG_QUALITY, 90])
    sof, dqt, sos = _at(j, 0xC0), _at(j, 0xDB), _at(j, 0xDA)
    exif = b"Exif\x00\x00II*\x00" + bytes(30)
    blur = cv2.GaussianBlur(np.random.default_rng(1).integers(0, 256, (96, 128, 3), np.uint8),
                            (5, 5), 0)
    big = _cv(".jpg", blur)
    c = {
        "plain_jpeg": (j, "as-is"),
        "junk_before_sof": (j[:sof] + b"\x00junk" + j[sof:], "repaired"),
        "junk_before_dqt": (j[:dqt] + b"\x12\x34" + j[dqt:], "repaired"),
        "junk_before_sos": (j[:sos] + b"abc" + j[sos:], "repaired"),
        # an APP1 whose length says less than it holds: the rest is junk to libjpeg
        "app1_length_short": (j[:2] + b"\xff\xe1\x00\x08" + exif + j[2:], "repaired"),
        # the scan cut short, an EOI appended: libjpeg fills the rest grey, warning
        "scan_cut_with_eoi": (big[:len(big) // 2] + b"\xff\xd9", "repaired"),
        "png": (_pil("PNG"), "png"), "bmp": (_pil("BMP"), "bmp"), "webp": (_pil("WEBP"), "webp"),
        "tiff": (_pil("TIFF"), "tiff"), "ppm": (_pil("PPM"), "pnm"), "gif": (_pil("GIF"), "gif"),
        "pgm": (_cv(".pgm", _photo()[:, :, 0]), "pnm"),
        "tga_pillow_only": (_pil("TGA"), "tga"),
        "empty": (b"", "bad"),
        "random_bytes": (np.random.default_rng(0).integers(0, 256, 5000, np.uint8).tobytes(), "bad"),
        "truncated_header": (j[:100], "bad"),
        "truncated_scan": (big[:len(big) // 2], "bad"),  # neither OpenCV 5 nor Pillow reads it
        # an APP0 length running into the tables: no decoder finds them
        "app0_length_long": (j[:_at(j, 0xE0) + 2] + b"\x00\x30" + j[_at(j, 0xE0) + 4:], "bad"),
    }
    try:
        c["bigtiff"] = (_pil("TIFF", big_tiff=True), "bigtiff")
    except (TypeError, ValueError, OSError):  # a Pillow without BigTIFF writing
        pass
    for ext, name in ((".jp2", "jp2"), (".hdr", "hdr"), (".ras", "sunraster"),
                      (".pfm", "pfm"), (".avif", "avif")):
        img = _photo().astype(np.float32) if name in ("hdr", "pfm") else _photo()
        try:
            ok, buf = cv2.imencode(ext, img)
        except cv2.error:
            continue
        if ok and cv2.imdecode(buf, cv2.IMREAD_COLOR) is not None:
            c[name] = (buf.tobytes(), name)
    return c


CORPUS = _corpus()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_class_is_stored_or_reported_as_decoders_read_it_and_quietly(name, capfd):
    data, want = CORPUS[name]
    p = prepare_image(data)
    out, err = capfd.readouterr()
    assert out == err == "", f"decoder chatter reached the terminal: {err!r}"
    if want == "bad":
        assert p.data is None and p.error
        return
    assert p.error is None, p.error
    assert (p.data is data) == (want == "as-is")
    assert p.reencoded == (None if want == "as-is" else want)
    assert (p.warning is not None) == (want == "repaired"), p.warning
    # what is stored decodes, without a warning, with our reader's decoder
    img = simplejpeg.decode_jpeg(p.data, colorspace="RGB", strict=True)
    ref = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if ref is None:  # Pillow only
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[:, :, ::-1]
    capfd.readouterr()
    assert img.shape == ref.shape
    if name not in ("hdr", "pfm"):  # (floats: OpenCV's conversion to 8 bits varies by flags)
        assert np.abs(img[:, :, ::-1].astype(int) - ref).mean() < 3
    assert check_stored(p.data) is None


def test_header_junk_is_dropped_losslessly():
    data, _ = CORPUS["junk_before_sos"]
    clean = clean_jpeg_header(data)
    assert clean is not None and len(clean) == len(data) - 3
    assert np.array_equal(simplejpeg.decode_jpeg(clean), simplejpeg.decode_jpeg(CORPUS["plain_jpeg"][0]))
    assert clean_jpeg_header(CORPUS["plain_jpeg"][0]) is None  # nothing to drop
    assert "extraneous bytes before marker 0xda" in prepare_image(data).warning


def test_the_warning_names_libjpegs_complaint():
    p = prepare_image(CORPUS["junk_before_sof"][0])
    assert "5 extraneous bytes before marker 0xc0" in p.warning
    assert "premature end of data segment" in prepare_image(CORPUS["scan_cut_with_eoi"][0]).warning


def test_signatures_of_every_container_opencv_decodes():
    for name, (data, want) in CORPUS.items():
        if want not in ("as-is", "repaired", "bad", "tga"):
            assert sniff_format(data) == want, name
    assert sniff_format(b"II+\x00\x08\x00\x00\x00") == "bigtiff"


def test_capture_returns_what_was_printed_and_restores_fd2(capfd):
    with captured_stderr() as cap:
        os.write(2, b"libpng warning: iCCP: known incorrect sRGB profile\n")
        warnings.warn("a PIL warning")
    os.write(2, b"after\n")
    assert cap.text == "libpng warning: iCCP: known incorrect sRGB profile; a PIL warning"
    assert capfd.readouterr().err == "after\n"


def _small(img):
    return img[:8, :8].mean(axis=(0, 1))


def test_corpus_through_the_writer_and_the_loader(tmp_path, capfd):
    """The real preprocess path, then the real Loader (worker processes, the fused
    path and a user transform): every file a decoder reads is a record, each warning is
    in the report with its path, the rest are bad files -- and nothing on stderr."""
    root = tmp_path / "train" / "n0"
    root.mkdir(parents=True)
    for name, (data, _) in CORPUS.items():
        (root / f"{name}.JPEG").write_bytes(data)  # misnamed, as in real datasets
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rep = write_split(scan_class_tree(tmp_path / "train"), tmp_path / "db" / "ILSVRC-train.lmdb",
                          "train", WriteOptions(progress=False, workers=2))
    good = {f"n0/{n}.JPEG" for n, (_, w) in CORPUS.items() if w != "bad"}
    warned = {f"n0/{n}.JPEG" for n, (_, w) in CORPUS.items() if w == "repaired"}
    assert rep.num_records == len(good)
    assert {p for p, _ in rep.bad_files} == {f"n0/{n}.JPEG" for n in CORPUS} - good
    assert {p for p, _ in rep.warned_files} == warned
    assert any("decoded with a warning" in str(w.message) for w in said)
    lines = (tmp_path / "db" / "ILSVRC-train.lmdb.bad-files.tsv").read_text().splitlines()
    assert {ln.split("\t")[0] for ln in lines if WARNED in ln} == warned
    recs = {r.path: r for _, r in read_records(tmp_path / "db" / "ILSVRC-train.lmdb")}
    assert set(recs) == good and recs["n0/junk_before_sof.JPEG"].reencoded == "repaired"
    capfd.readouterr()
    for transform in (Compose([RandomResizedCrop(16), ToTensor()]), _small):
        loader = Loader(tmp_path / "db", "train", transform, batch_size=4, num_workers=2)
        assert sum(len(y) for _, y in loader) == len(good)
        loader.close()
    assert capfd.readouterr().err == ""


def test_damaged_jpegs_stored_without_verify_load_quietly(tmp_path, capfd):
    """--no-verify stores JPEGs unchecked: the reader's fallback for one that decodes
    only with a warning must not print libjpeg's complaint every epoch."""
    data, _ = CORPUS["scan_cut_with_eoi"]
    root = tmp_path / "train" / "n0"
    root.mkdir(parents=True)
    for i in range(3):
        (root / f"{i}.JPEG").write_bytes(data)
    write_split(scan_class_tree(tmp_path / "train"), tmp_path / "db" / "ILSVRC-train.lmdb",
                "train", WriteOptions(progress=False, workers=2, verify=False))
    capfd.readouterr()
    for transform in (Compose([RandomResizedCrop(16), ToTensor()]), _small):
        loader = Loader(tmp_path / "db", "train", transform, batch_size=2, num_workers=1)
        assert sum(len(y) for _, y in loader) == 3
        loader.close()
    assert capfd.readouterr().err == ""
