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
    "pyarrow": "pip install -c constraints.txt -e '.[parquet]'",
    "zstandard": "pip install -c constraints.txt -e '.[zstd]'",
}
_PROGRAMS = {"jpegtran", "nginx"}


# NOTE [ a test run leaves nothing ]
# Each run gets its own temp folder (tempfile's and $TMPDIR, for subprocesses too), so
# what the run leaves is known at its end, whatever else runs on the machine: pytest's
# own tmp_path folders go when the run passes (pytest.ini: tmp_path_retention_policy),
# anything else left there fails the run, naming it, and is removed; a shared-memory
# file the run left in /dev/shm (shared with other processes: a warning) is named too.
_RUN_TMP: dict[str, object] = {}
_TORCH_CACHE = "torchinductor-cache"


def pytest_configure(config):
    import tempfile

    parent = tempfile.gettempdir()
    run_tmp = tempfile.mkdtemp(prefix="seqloader-tests-", dir=parent)
    _RUN_TMP.update(path=run_tmp, environ=os.environ.get("TMPDIR"), tempdir=tempfile.tempdir,
                    shm=set(_shm_files()))
    os.environ["TMPDIR"] = run_tmp
    tempfile.tempdir = run_tmp
    # (importing torch._dynamo, as lightning does, makes torch's compile cache folder
    # there: named, so that an empty one is known and removed at the end)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(run_tmp, _TORCH_CACHE))


def _shm_files() -> list[str]:
    try:
        return os.listdir("/dev/shm")
    except OSError:
        return []


def _size(path: str) -> int:
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
                   if not os.path.islink(os.path.join(d, f)))
    return os.path.getsize(path) if os.path.exists(path) else 0


@pytest.hookimpl(trylast=True)  # (after pytest has removed its own tmp_path folders)
def pytest_sessionfinish(session, exitstatus):
    import tempfile

    run_tmp = _RUN_TMP.pop("path", None)
    if run_tmp is None:
        return
    tempfile.tempdir = _RUN_TMP["tempdir"]
    if _RUN_TMP["environ"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _RUN_TMP["environ"]
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", "").startswith(run_tmp):
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
    import multiprocessing

    own = multiprocessing.current_process()._config.get("tempdir")  # (removed at exit)
    left = []
    for e in sorted(os.listdir(run_tmp)):
        path = os.path.join(run_tmp, e)
        if path == own:
            continue
        if e.startswith("pytest-of-") and exitstatus != 0:
            continue  # (pytest keeps a failed run's failed tests' folders)
        if ((e.startswith(("pytest-of-", "torchelastic_")) or e == _TORCH_CACHE)
                and _size(path) == 0):
            # (empty: pytest's, torch's bookkeeping; torch.distributed.elastic's agent
            # folder, which torchrun and Lightning's launcher leave behind)
            shutil.rmtree(path, ignore_errors=True)
            continue
        left.append(e)
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    if left:
        sizes = ", ".join(f"{e} ({_size(os.path.join(run_tmp, e)) / 2**20:.1f} MiB)" for e in left)
        msg = (f"the test run left {len(left)} item(s) in its temp folder: {sizes}; a test "
               "writes under tmp_path and removes what else it (or the code) makes")
        if report is not None:
            report.write_line(f"ERROR: {msg}", red=True)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for e in left:
            path = os.path.join(run_tmp, e)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
    try:
        os.rmdir(run_tmp)  # (it holds what pytest keeps of a failed run: then it stays)
    except OSError:
        kept = [e for e in os.listdir(run_tmp) if os.path.join(run_tmp, e) != own]
        if kept and report is not None:  # (multiprocessing's own folder goes at exit)
            report.write_line(f"the failed tests' tmp_path folders are kept in {run_tmp}")
    shm = _orphans(sorted(set(_shm_files()) - _RUN_TMP["shm"]))
    if shm and report is not None:
        report.write_line(f"WARNING: /dev/shm holds {len(shm)} file(s) made during the run that "
                          f"no process has open or mapped (leaked): {shm[:5]}", yellow=True)


def _orphans(names: list[str]) -> list[str]:
    """Those of the /dev/shm files ``names`` that no live process has open or mapped: a
    file another process (another test run on the machine) is using is not a leak."""
    if not names:
        return []
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                used.update(line.rsplit("/dev/shm/", 1)[1].split()[0]
                            for line in f if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/"):].split()[0])
        except OSError:  # (the process ended, or is not ours to look at)
            continue
    return [n for n in names if n not in used and os.path.exists(f"/dev/shm/{n}")]


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
