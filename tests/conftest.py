"""Shared fixtures: a tiny synthetic ImageNet tree, written through the real writer."""
from __future__ import annotations

import importlib.util
import os
import shutil
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

#: How to install each optional tool or library that ``@pytest.mark.needs(...)`` names.
#: Programs are looked up on PATH, anything else is a Python module.
OPTIONAL = {
    "jpegtran": "apt install libjpeg-turbo-progs",
    "nginx": "apt install nginx",
    "lightning": "pip install -c constraints.txt -e '.[integrations]'",
    "accelerate": "pip install -c constraints.txt -e '.[integrations]'",
    "s3fs": "pip install -c constraints.txt -e '.[remote,test-remote]'",
    "moto": "pip install -c constraints.txt -e '.[remote,test-remote]'",
    "fsspec": "pip install -c constraints.txt -e '.[remote]'",
    "aiohttp": "pip install -c constraints.txt -e '.[remote]'",
    "webdataset": "pip install -c constraints.txt -e '.[test-extras]'",
    "zstandard": "pip install -c constraints.txt -e '.[zstd]'",
}
_PROGRAMS = {"jpegtran", "nginx"}


def available(name: str) -> bool:
    if name in _PROGRAMS:
        return shutil.which(name) is not None or os.path.exists(f"/usr/sbin/{name}")
    return importlib.util.find_spec(name) is not None


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.needs("jpegtran", ...)``: skip cleanly, saying how to install what
    is missing (the README's commands install none of these; ``.ci/run``'s extras step
    installs them and runs ``-m needs``)."""
    for item in items:
        for mark in item.iter_markers("needs"):
            unknown = [n for n in mark.args if n not in OPTIONAL]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid}: needs{tuple(unknown)}: add them to "
                                        "tests/conftest.py's OPTIONAL")
            missing = [n for n in mark.args if not available(n)]
            if missing:
                item.add_marker(pytest.mark.skip(reason="needs " + ", ".join(
                    f"{n} ({OPTIONAL[n]})" for n in missing)))


@pytest.fixture(scope="session")
def synth_tree(tmp_path_factory):
    """A small ImageNet-layout tree: 4 classes x 12 train (+3 val) images, odd formats
    (gray, PNG-as-JPEG, CMYK when Pillow is installed) and 3 undecodable files."""
    from seqloader.tools.synth import make_synthetic_imagenet

    root = tmp_path_factory.mktemp("synth") / "imagenet"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_synthetic_imagenet(root, classes=4, per_class=12, val_per_class=3,
                                       seed=1, odd_fraction=0.15, bad=3, size="small",
                                       progress=False)


@pytest.fixture(scope="session")
def lmdb_dir(synth_tree, tmp_path_factory) -> Path:
    """``synth_tree`` preprocessed with default options (train shuffled, val sorted)."""
    from seqloader import WriteOptions, preprocess

    out = tmp_path_factory.mktemp("lmdb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, out, options=WriteOptions(progress=False, workers=2))
    return out


def _noise_jpeg(path, side, seed):
    import cv2
    import numpy as np

    img = np.random.default_rng(seed).integers(0, 256, (side, side, 3), np.uint8)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    path.write_bytes(buf.tobytes())


@pytest.fixture(scope="session")
def big_db(tmp_path_factory):
    """~25 MB: 2 classes x 60 noise JPEGs of ~170 KB, plus one of ~4 MB."""
    from seqloader import WriteOptions, preprocess
    from seqloader.read.database import open_database

    root = tmp_path_factory.mktemp("bigtree")
    for c in range(2):
        d = root / "train" / f"n{c:08d}"
        d.mkdir(parents=True)
        for i in range(60):
            _noise_jpeg(d / f"img_{i}.JPEG", 400, 100 * c + i)
    _noise_jpeg(root / "train" / "n00000001" / "huge.JPEG", 1400, 7)
    out = tmp_path_factory.mktemp("biglmdb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(root, out, options=WriteOptions(progress=False, workers=2))
    return open_database(out / "ILSVRC-train.lmdb")


def read_records(path) -> list:
    """All (global index, Record) of a database, via the public format helpers."""
    from seqloader.read.database import close_env, open_database, open_env
    from seqloader.format.keys import decode_key, encode_key, is_record_key
    from seqloader.format.records import unpack_record

    db = open_database(path)
    out = []
    for p, off in zip(db.paths, db.offsets):
        env = open_env(p)
        with env.begin() as txn:
            cur = txn.cursor()
            cur.set_range(encode_key(0))
            for k, v in cur:
                if is_record_key(k):
                    out.append((off + decode_key(k), unpack_record(v)))
        close_env(env)
    return out


def raw_items(path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of one LMDB file, metadata included."""
    from seqloader.read.database import close_env, open_env

    env = open_env(path)
    with env.begin() as txn:
        items = list(txn.cursor())
    close_env(env)
    return items


def assert_extents_match(path) -> None:
    """The metadata's record extents point at exactly the bytes LMDB holds for each record."""
    from seqloader.read.database import open_database
    from seqloader.format.keys import META_KEY
    from seqloader.format.meta import meta_extents

    db = open_database(path)  # (finds the whole shard set)
    meta = db.metas[[p.resolve() for p in db.paths].index(path.resolve())]
    ext = meta_extents(meta, path.stat().st_size, where=str(path))
    assert ext is not None and len(ext) == meta.num_records
    data = path.read_bytes()
    want = [v for k, v in raw_items(path) if k != META_KEY]
    assert [data[o:o + n] for o, n in ext.tolist()] == want


def assert_digests_match(path) -> None:
    """The metadata's digest table holds each record's ``record_digest`` (first 8 bytes),
    in record order (NOTE [ record digests ])."""
    from seqloader.format.checksum import record_digest
    from seqloader.format.keys import META_KEY
    from seqloader.read.database import open_env, close_env, read_meta

    env = open_env(path)
    try:
        meta = read_meta(env, path)
    finally:
        close_env(env)
    want = b"".join(record_digest(v)[:8] for k, v in raw_items(path) if k != META_KEY)
    assert len(want) == 8 * meta.num_records and meta.digests == want


def resident_fraction(path) -> float:
    """The share of ``path``'s pages in the page cache (the benchmarks' mincore probe)."""
    from seqloader.tools.bench import residency

    share = residency([path])
    assert share is not None, f"mincore cannot see {path}"
    return share


def skip_unless_pages_can_be_dropped(tmp_path) -> None:
    """Skip on a file system that keeps a synced file's pages after fadvise(DONTNEED)
    (tmpfs): page-cache tests cannot see anything there."""
    probe = tmp_path / "probe"
    with open(probe, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if resident_fraction(probe) > 0.5:
        pytest.skip(f"{tmp_path} keeps written pages cached after fadvise(DONTNEED) (tmpfs?)")


def junk_tree(root: Path, classes: int = 2, per_class: int = 2) -> Path:
    """An ImageNet-layout tree ``root/train/<class>/<image>`` whose every image is
    undecodable (text named .JPEG, as a Git LFS pointer is)."""
    for c in range(classes):
        d = root / "train" / f"n{c:08d}"
        d.mkdir(parents=True)
        for i in range(per_class):
            (d / f"img_{i}.JPEG").write_text("version https://git-lfs.github.com/spec/v1\n")
    return root


def old_empty_database(tmp_path: Path) -> Path:
    """A folder holding what writers before the zero-records check left for a split whose
    every image was undecodable: a complete ``ILSVRC-train.lmdb`` of 0 records and its
    bad-files report (the real writer, with its removal of that file switched off)."""
    from unittest import mock

    from seqloader import NoRecordsError, WriteOptions, preprocess
    from seqloader.write import writer

    tree, out = junk_tree(tmp_path / "junk"), tmp_path / "old-empty"
    with mock.patch.object(writer, "remove_db", lambda path: None), \
            pytest.raises(NoRecordsError):
        preprocess(tree, out, options=WriteOptions(progress=False, workers=1))
    assert (out / "ILSVRC-train.lmdb").is_file()
    return out
