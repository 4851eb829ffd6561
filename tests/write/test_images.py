import io

import cv2
import numpy as np
import pytest

from seqloader.format.imagecheck import sniff_format
from seqloader.write.prepare import decode_bgr, prepare_image
from seqloader.format.jpeg import jpeg_info


def _photo(h=48, w=64):
    y, x = np.mgrid[0:h, 0:w]
    return np.dstack([(x * 4) % 256, (y * 5) % 256, ((x + y) * 2) % 256]).astype(np.uint8)


def _jpeg(img, q=95):
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, q])[1].tobytes()


def test_plain_jpeg_is_stored_untouched():
    data = _jpeg(_photo())
    p = prepare_image(data)
    assert p.data is data and p.reencoded is None and p.error is None
    assert jpeg_info(data) == (48, 64, 3)


def test_grayscale_jpeg_is_kept_and_decodes_to_three_channels():
    data = _jpeg(_photo()[:, :, 0])
    assert jpeg_info(data)[2] == 1
    p = prepare_image(data)
    assert p.data is data
    img = decode_bgr(p.data)
    assert img.shape == (48, 64, 3) and (img[..., 0] == img[..., 2]).all()


def test_png_named_jpeg_is_reencoded_as_rgb_jpeg():
    bgr = _photo()
    png = cv2.imencode(".png", bgr)[1].tobytes()
    assert sniff_format(png) == "png"
    p = prepare_image(png)
    assert p.reencoded == "png" and sniff_format(p.data) == "jpeg"
    assert np.abs(decode_bgr(p.data).astype(int) - bgr).mean() < 3


def test_cmyk_jpeg_is_reencoded_with_correct_colours():
    Image = pytest.importorskip("PIL.Image")
    rgb = _photo()[:, :, ::-1]
    buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buf, "JPEG", quality=95)
    data = buf.getvalue()
    assert jpeg_info(data)[2] == 4
    p = prepare_image(data)
    assert p.reencoded == "cmyk" and jpeg_info(p.data)[2] == 3
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    got = decode_bgr(p.data)[:, :, ::-1]
    assert np.abs(got.astype(int) - want).mean() < 4


@pytest.mark.parametrize("data,reason", [
    (b"", "empty file"),
    (b"hello, I am text", "not an image"),
    (b"\xff\xd8\xff\xe0" + b"\x00" * 50, "damaged"),
])
def test_undecodable_data_is_rejected_with_reason(data, reason):
    p = prepare_image(data)
    assert p.data is None and reason in p.error


def test_truncated_jpeg_is_rejected_only_when_verifying():
    data = _jpeg(_photo(200, 200))[:1500]
    assert "truncated" in prepare_image(data).error
    assert prepare_image(data, verify=False).data is data


def test_data_after_the_end_of_image_is_not_truncation():
    """Camera trailers (or a second picture) after the EOI: whole files, stored as they
    are.  An EXIF thumbnail's EOI comes before the scan: a truncated file with one is
    still truncated."""
    from seqloader.format.imagecheck import check_stored

    good = _jpeg(_photo(200, 200))
    for trailer in (b"SEFH" + bytes(range(256)) * 20, good):  # opaque bytes; an MPF-like 2nd JPEG
        data = good + trailer
        assert prepare_image(data).data == data and check_stored(data) is None
    thumb = _jpeg(_photo(16, 16))
    app1 = b"\xff\xe1" + (len(thumb) + 8).to_bytes(2, "big") + b"Exif\x00\x00" + thumb
    with_thumb = good[:2] + app1 + good[2:]
    assert prepare_image(with_thumb).data == with_thumb
    assert "truncated" in prepare_image(with_thumb[:-3000]).error


def test_max_size_shrinks_only_large_images():
    big = _jpeg(_photo(300, 500))
    p = prepare_image(big, max_size=100)
    assert p.reencoded == "resized" and jpeg_info(p.data)[:2] == (100, 167)
    small = _jpeg(_photo(80, 120))
    assert prepare_image(small, max_size=100).data is small


def test_reduced_decode_check_rejects_what_a_full_decode_rejects():
    """NOTE [ decode check ]: damaged JPEGs (header, tables, entropy data, truncation),
    checked at 1/8 scale, are accepted or rejected exactly as a full decode would."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (96, 128, 3), np.uint8)
    img = cv2.GaussianBlur(img, (5, 5), 0)
    good = []
    for q, flags in ((95, []), (80, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])):
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, q, *flags])
        good.append(buf.tobytes())
    variants = []
    for data in good:
        n = len(data)
        for _ in range(60):  # random byte damage anywhere, including headers and tables
            b = bytearray(data)
            for pos in rng.integers(2, n - 2, int(rng.integers(1, 6))):
                b[pos] = int(rng.integers(0, 256))
            variants.append(bytes(b))
        dht = data.index(b"\xff\xc4")  # a bogus Huffman table: fatal for libjpeg
        variants.append(data[:dht + 4] + b"\x00" + b"\xff" * 16 + data[dht + 21:])
        variants.append(data[:n // 2] + b"\xff\xd9")  # cut short, but "ends" with EOI
    rejected = 0
    for data in variants:
        full = decode_bgr(data) if data[-2:] == b"\xff\xd9" else None
        want_ok = full is not None and full.size > 0
        got = prepare_image(data, verify=True)
        if sniff_format(data) == "jpeg" and jpeg_info(data) is not None \
                and jpeg_info(data)[2] in (1, 3):
            assert (got.data is not None) == want_ok, got.error
        rejected += got.data is None
    assert rejected >= 2  # the bogus table, at least
    assert all(prepare_image(d).data == d for d in good)


@pytest.mark.needs("jpegtran")
def test_restart_markers_transcode_is_lossless_and_leaves_damaged_data_alone():
    from seqloader.write.prepare import add_restart_markers, restart_blocks
    from seqloader.format.jpeg import jpeg_frame, jpeg_scan, restart_grid
    img = _photo(200, 320)
    data = _jpeg(img)
    assert not restart_grid(data)
    out = add_restart_markers(data)
    frame = jpeg_frame(out)
    assert jpeg_scan(out, frame).restart == 4  # 20 MCUs of 16 px per row: 5 segments
    assert jpeg_scan(out, frame).index != (0, 0)  # NOTE [ restart index ]
    assert restart_blocks(19) == 1 and restart_blocks(32) == 4 and restart_blocks(125) == 5
    assert np.array_equal(decode_bgr(out), decode_bgr(data))
    # optimal Huffman tables: smaller than the original despite 19 markers (mutation:
    # without -optimize it is larger)
    assert len(out) < len(data)
    assert add_restart_markers(out) is out  # already there: kept
    from seqloader.transforms import Compose, RandomResizedCrop, compile_fused
    pipe = compile_fused(Compose([RandomResizedCrop(32)]))
    for seed in range(20):  # windows of the transcoded file: the samples do not change
        a, b = (np.empty(pipe.out_shape, pipe.out_dtype) for _ in range(2))
        pipe(data, a, np.random.default_rng(seed))
        pipe(out, b, np.random.default_rng(seed))
        assert np.array_equal(a, b), seed
    truncated = data[:len(data) // 2]
    assert add_restart_markers(truncated) is truncated  # jpegtran warns: kept as it was
    assert "truncated" in prepare_image(truncated, restart=True).error  # and still checked
    p = prepare_image(data, restart=True)
    assert p.data == out and p.reencoded == "restart"
    png = cv2.imencode(".png", img)[1].tobytes()
    reencoded = prepare_image(png, restart=True).data
    assert restart_grid(reencoded)  # re-encoded with markers, and their index
    assert jpeg_scan(reencoded, jpeg_frame(reencoded)).index != (0, 0)


def test_restart_index_only_where_it_fits():
    """NOTE [ restart index ]: one uint16 per segment in one APP15 segment -- a file with
    more segments than that holds (here a restart marker after every 8x8 MCU of a grey
    1448 px square: 32,760) gets no index and is returned as it is."""
    from seqloader.format.jpeg import _INDEX_MAX, add_restart_index, jpeg_frame, jpeg_scan
    assert (1440 // 8) ** 2 - 1 <= _INDEX_MAX < (1448 // 8) ** 2 - 1
    for side, fits in ((1440, True), (1448, False)):
        grey = (np.indices((side, side)).sum(0) % 251).astype(np.uint8)
        data = cv2.imencode(".jpg", grey, [cv2.IMWRITE_JPEG_RST_INTERVAL, 1])[1].tobytes()
        out = add_restart_index(data)
        assert (out is not data) == fits
        assert (jpeg_scan(out, jpeg_frame(out)).index != (0, 0)) == fits
        assert np.array_equal(decode_bgr(out), decode_bgr(data))


def test_restart_marked_jpeg_that_cannot_decode_is_rejected_with_restart_markers():
    """A JPEG whose restart markers tile it already only gets an index (no jpegtran
    pass), so it must still go through the decode check: here its scan names Huffman
    tables that are never defined."""
    from seqloader.write.prepare import restart_blocks
    from seqloader.format.jpeg import restart_grid

    img = np.random.default_rng(1).integers(0, 256, (64, 128, 3), np.uint8)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90,
                                         cv2.IMWRITE_JPEG_RST_INTERVAL, restart_blocks(8)])
    good = buf.tobytes()
    data = bytearray(good)
    data[data.index(b"\xff\xda") + 6] = 0x33  # first component: tables 3/3, undefined
    data = bytes(data)
    assert restart_grid(data) and cv2.imdecode(np.frombuffer(data, np.uint8), 1) is None
    assert prepare_image(data, restart=True).error is not None
    stored = prepare_image(good, restart=True)  # the good one gets its index, still valid
    assert stored.error is None and stored.data != good and decode_bgr(stored.data) is not None


def _png_claiming(width, height):
    """A valid PNG signature and IHDR that claim ``width`` x ``height`` grey pixels, with a
    tiny IDAT: the header alone is what OpenCV's size limit looks at."""
    import struct
    import zlib

    def chunk(tag, body):
        crc = struct.pack(">I", zlib.crc32(tag + body))
        return struct.pack(">I", len(body)) + tag + body + crc
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 100)) + chunk(b"IEND", b""))


def test_image_too_large_for_opencv_is_a_bad_file_not_a_crash(tmp_path):
    """A header claiming more pixels than OpenCV's limit (2**30) makes cv2.imdecode raise
    cv2.error instead of returning None: it must be a bad file whose reason names the
    OPENCV_IO_MAX_IMAGE_PIXELS variable, and the run must go on (it used to die with a
    worker's traceback and leave a .partial no re-run got past).  (Our own pixel limit,
    far lower, refuses such a file first: lifted here, max_pixels=None.)"""
    import struct

    from seqloader import WriteOptions, preprocess
    from seqloader.format.imagecheck import check_stored

    png = _png_claiming(40000, 40000)
    jpeg = bytearray(_jpeg(_photo(16, 16)))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5:sof + 9] = struct.pack(">HH", 40000, 40000)
    jpeg = bytes(jpeg)
    for p in (prepare_image(png, max_pixels=None),
              prepare_image(png, verify=False, max_pixels=None),  # --max-size: decoded in full
              prepare_image(jpeg, max_size=256, max_pixels=None)):
        assert p.data is None
        assert "too large for OpenCV" in p.error and "OPENCV_IO_MAX_IMAGE_PIXELS" in p.error
    assert "OPENCV_IO_MAX_IMAGE_PIXELS" in check_stored(png)  # seqloader verify's check
    assert decode_bgr(png) is None
    for cls in ("a", "b"):
        d = tmp_path / "src" / "train" / cls
        d.mkdir(parents=True)
        for i in range(3):
            (d / f"{i}.JPEG").write_bytes(_jpeg(_photo() // (i + 1)))
    (tmp_path / "src" / "train" / "a" / "huge.png").write_bytes(png)
    with pytest.warns(UserWarning, match="1 file"):
        rep, = preprocess(tmp_path / "src", tmp_path / "out",
                          options=WriteOptions(progress=False, workers=2, max_pixels=None))
    assert rep.num_records == 6 and not list((tmp_path / "out").glob("*.partial"))
    path, reason = (tmp_path / "out" / "ILSVRC-train.lmdb.bad-files.tsv").read_text() \
        .rstrip("\n").split("\t")
    assert path == "a/huge.png" and "OPENCV_IO_MAX_IMAGE_PIXELS" in reason


def test_reencoded_images_ignore_exif_orientation():
    """PIL (torchvision's loader) and images stored as they are ignore the EXIF
    orientation, so re-encoding (CMYK, --max-size) must too: a 400x300 JPEG tagged
    Orientation=6 (rotate 90°, as phones write) stays 300 rows x 400 columns."""
    Image = pytest.importorskip("PIL.Image")
    rgb = np.zeros((300, 400, 3), np.uint8)
    rgb[:, :200] = (255, 0, 0)  # left half red, right half blue
    rgb[:, 200:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6
    datas = {}
    for mode in ("RGB", "CMYK"):
        buf = io.BytesIO()
        Image.fromarray(rgb).convert(mode).save(buf, "JPEG", exif=exif.tobytes(), quality=95)
        datas[mode] = buf.getvalue()
    assert np.asarray(Image.open(io.BytesIO(datas["RGB"])).convert("RGB")).shape == (300, 400, 3)
    for data, kw, why, shape in ((datas["RGB"], {"max_size": 150}, "resized", (150, 200)),
                                 (datas["CMYK"], {}, "cmyk", (300, 400)),
                                 (datas["CMYK"], {"max_size": 150}, "resized", (150, 200))):
        p = prepare_image(data, **kw)
        assert p.reencoded == why and jpeg_info(p.data)[:2] == shape
        bgr = decode_bgr(p.data)
        assert bgr[5, 5, 2] > 200 and bgr[5, -5, 0] > 200  # red on the left, blue on the right
    assert prepare_image(datas["RGB"]).data is datas["RGB"]  # stored as it is
