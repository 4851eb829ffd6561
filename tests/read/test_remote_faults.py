"""Remote faults against real servers on 127.0.0.1 (moto's S3, nginx, the fault proxy):
bounded time to a clear error, errors naming the cause with any num_workers, no stale
or corrupt data, no secret printed (NOTE [ remote time budget ])."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
sys.path.insert(0, str(HERE))
import remote_servers as rs  # noqa: E402


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    server = rs.MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_url(moto, lmdb_dir) -> str:
    return moto.upload(lmdb_dir, "seqloader-faults", "imagenet")


@pytest.fixture
def proxy_factory():
    made = []

    def make(port, fault=lambda n, line: None, etags="keep"):
        p = rs.FaultProxy(port, fault, etags)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


@pytest.fixture(scope="module")
def www(lmdb_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    shutil.copytree(lmdb_dir, root / "single")
    return root


@pytest.fixture(scope="module")
def nginx(www, tmp_path_factory):
    try:
        server = rs.Nginx(www, tmp_path_factory.mktemp("nginx"))
    except FileNotFoundError:
        pytest.skip("nginx is not installed")
    yield server
    server.stop()


def _mean_color(img, rng=None):
    """A user transform (so that batches go through the worker pool)."""
    return np.asarray(img, np.float32).mean(axis=(0, 1))


def _fast(storage_options=None, **kw):
    """Options with a small time budget (tests): 1 s per request, 3 s per block."""
    from seqloader.read.remote import RemoteOptions

    kw = {"timeout": 1.0, "connect_timeout": 1.0, "deadline": 3.0, **kw}
    return RemoteOptions(storage_options=storage_options or {}, **kw)


def _records(db):
    from seqloader.read.reader import RangeReader

    reader = RangeReader(db, prefetch_bytes=64 << 10)
    try:
        return [(i, bytes(v)) for i, v in reader.read([(0, db.num_records)])]
    finally:
        reader.close()


def _env(moto=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    if moto is not None:
        env.update(moto.env())
    return env


# ------------------------------------------------------------------ time budget

@pytest.mark.needs("s3fs", "moto")
def test_silent_server_at_opening_is_a_timeout_within_the_budget(moto, s3_url, proxy_factory):
    """A server that accepts and never answers: opening raises RemoteTimeoutError in
    about ``deadline`` seconds, not "does not exist" after minutes."""
    from seqloader.errors import RemoteTimeoutError
    from seqloader.read.database import open_database

    proxy = proxy_factory(moto.port, lambda n, line: "hang")
    t0 = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match="imagenet") as err:
        open_database(s3_url, "train", remote=_fast(moto.storage_options(proxy.url)))
    took = time.monotonic() - t0
    assert took < 3.0 + 1.0 + 2.0, took  # deadline + one connect + slack
    assert "does not exist" not in str(err.value) and rs.SECRET not in str(err.value)


_MID_EPOCH = r"""
import json, sys, time
import numpy as np
from seqloader import Loader, RemoteError
def mean_color(img, rng=None):  # (a transform: batches are decoded by the worker pool)
    return np.asarray(img, np.float32).mean(axis=(0, 1))
from seqloader.read.remote import RemoteOptions
url, endpoint, workers, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
opts = RemoteOptions(storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                     timeout=1.0, connect_timeout=1.0, deadline=3.0, block=16 << 10, depth=4)
loader = Loader(url, "train", mean_color, batch_size=4, num_workers=workers, remote=opts,
                prefetch_bytes=64 << 10, timeout=timeout)
print("opened", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
try:
    for _ in loader:
        pass
    out = {"error": None}
except RemoteError as e:
    out = {"error": type(e).__name__, "msg": str(e), "took": time.monotonic() - t0,
           "reader_tb": bool(getattr(e, "reader_traceback", None)) or workers == 0}
print(json.dumps(out), flush=True)
"""


def fault_mid_epoch(moto, s3_url, proxy_factory, fault: str, workers: int, timeout: float = 0):
    """Open a Loader over ``s3_url`` through a proxy that answers normally until the
    Loader has opened, then injects ``fault`` into every later request; iterate in a
    subprocess (``_MID_EPOCH``).  Returns (its JSON line, seconds from that line to
    the process's exit, its stderr, the proxy: ``injected`` says what it did)."""
    allowed = [1 << 30]  # (record 0 still answered: the fault starts after opening)
    proxy = proxy_factory(moto.port, lambda n, line: fault if n >= allowed[0] else None)
    proc = subprocess.Popen([sys.executable, "-c", _MID_EPOCH, s3_url, proxy.url, str(workers),
                             str(timeout)],
                            env=_env(moto), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "opened", proc.stderr.read()
        allowed[0] = proxy.count + 1
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        printed = time.monotonic()
        proc.wait(30)
        exit_after = time.monotonic() - printed
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert line.startswith("{"), stderr[-3000:]
    return json.loads(line), exit_after, stderr, proxy


@pytest.mark.needs("s3fs", "moto")
@pytest.mark.parametrize("workers,timeout", [(0, 0), (2, 0), (2, 2.0)])
def test_silent_server_mid_epoch_same_error_and_prompt_exit(moto, s3_url, proxy_factory, workers,
                                                            timeout):
    """The server goes silent after opening: with 0 and 2 workers the Loader raises the
    same RemoteTimeoutError (caught by ``except RemoteError``) within the budget, and
    the process exits promptly after it (no retries left running).  With the Loader's
    own ``timeout`` (2 s, below the 3 s deadline) the remote error still names the
    server, not a worker that was given nothing to do."""
    out, exit_after, stderr, _ = fault_mid_epoch(moto, s3_url, proxy_factory, "hang", workers,
                                              timeout)
    assert out["error"] == "RemoteTimeoutError", (out, stderr)
    assert out["took"] < 3.0 + 1.0 + 3.0, out
    assert out["reader_tb"]
    assert exit_after < 5.0, exit_after
    assert rs.SECRET not in out["msg"]


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_restart_of_30_s_is_ridden_out(moto, s3_url, lmdb_dir, proxy_factory):
    """The endpoint refuses connections for 30 s mid-epoch: with the default budget
    every record arrives once, in order."""
    from seqloader.read.database import open_database
    from seqloader.read.reader import RangeReader
    from seqloader.read.remote import RemoteOptions

    proxy = proxy_factory(moto.port)
    want = _records(open_database(lmdb_dir, "train"))
    db = open_database(s3_url, "train", remote=RemoteOptions(
        storage_options=moto.storage_options(proxy.url), block=16 << 10))
    reader = RangeReader(db, prefetch_bytes=48 << 10)
    got = []
    try:
        for k, (i, v) in enumerate(reader.read([(0, db.num_records)])):
            got.append((i, bytes(v)))
            if k == 10:
                proxy.down()
                threading.Timer(30.0, proxy.up).start()
    finally:
        reader.close()
    assert got == want


# ------------------------------------------------------------------ errors naming the cause

@pytest.mark.needs("s3fs", "moto")
def test_wrong_credentials_say_so(moto, s3_url, proxy_factory):
    """Every request answered 403 (wrong credentials): opening a folder URL raises
    RemoteAccessError naming credentials, not "no database for split"."""
    from seqloader.errors import RemoteAccessError
    from seqloader.read.database import open_database

    proxy = proxy_factory(moto.port, lambda n, line: "403")
    with pytest.raises(RemoteAccessError, match="credentials") as err:
        open_database(s3_url, "train", remote=_fast(moto.storage_options(proxy.url)))
    assert "no database" not in str(err.value) and rs.SECRET not in str(err.value)


@pytest.mark.needs("s3fs", "moto")
@pytest.mark.parametrize("workers", [0, 2])
def test_except_remote_error_catches_with_any_workers(moto, s3_url, proxy_factory, workers):
    """403 mid-epoch: RemoteAccessError with 0 and with 2 workers, the reader's
    traceback attached with workers; WorkerError is not what arrives."""
    from seqloader import Loader
    from seqloader.errors import RemoteAccessError, WorkerError

    allowed = [1 << 30]
    proxy = proxy_factory(moto.port, lambda n, line: "403" if n >= allowed[0] else None)
    loader = Loader(s3_url, "train", _mean_color, batch_size=4, num_workers=workers,
                    remote=_fast(moto.storage_options(proxy.url), block=16 << 10))
    allowed[0] = proxy.count + 1  # (record 0, read in this process for the batch shape)
    try:
        with pytest.raises(RemoteAccessError) as err:
            for _ in loader:
                pass
    finally:
        loader.close()  # (no workers left for later tests)
    assert not isinstance(err.value, WorkerError)
    if workers:
        assert "Traceback" in err.value.reader_traceback


# ------------------------------------------------------------------ no stale or corrupt data

def _padded_pair(lmdb_dir, synth_tree, tmp_path) -> tuple[bytes, bytes]:
    """Two train databases of the same size: the fixture's and one written with another
    seed (other order, so other labels at each position), padded to equal length."""
    from seqloader import WriteOptions, preprocess

    other = tmp_path / "other"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, other, splits=["train"],
                   options=WriteOptions(progress=False, workers=1, seed=12345))
    a = (lmdb_dir / "ILSVRC-train.lmdb").read_bytes()
    b = (other / "ILSVRC-train.lmdb").read_bytes()
    n = max(len(a), len(b))
    return a + bytes(n - len(a)), b + bytes(n - len(b))


@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_same_size_replacement_without_etags_not_served_from_cache(
        nginx, www, lmdb_dir, synth_tree, tmp_path, proxy_factory):
    from seqloader.read.database import open_database

    a, b = _padded_pair(lmdb_dir, synth_tree, tmp_path)
    assert len(a) == len(b) and a != b
    (www / "swap").mkdir(exist_ok=True)
    target = www / "swap" / "ILSVRC-train.lmdb"
    proxy = proxy_factory(nginx.port, etags="strip")
    url = proxy.url + "/swap/ILSVRC-train.lmdb"
    opts = _fast(cache_dir=str(tmp_path / "cache"), cache_bytes=64 << 20, block=16 << 10)
    local = tmp_path / "local"
    local.mkdir()
    for data in (a, b):
        target.write_bytes(data)
        (local / "ILSVRC-train.lmdb").write_bytes(data)
        db = open_database(url, remote=opts)
        assert db.remote.files[0].etag is None
        assert _records(db) == _records(open_database(local / "ILSVRC-train.lmdb"))


@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_flipped_label_byte_is_caught(nginx, lmdb_dir, proxy_factory):
    """A proxy inverts one byte of a record (its label) in transit: RemoteDataError
    naming the record; with ``verify=False`` the wrong label would pass."""
    from seqloader.errors import RemoteDataError
    from seqloader.format.records import IMAGE_HEAD, image_span
    from seqloader.read.database import open_database

    local = open_database(lmdb_dir, "val")
    ext = np.frombuffer(local.metas[0].extents, [("offset", "<u8"), ("length", "<u4")])
    data = (lmdb_dir / "ILSVRC-val.lmdb").read_bytes()
    k = 3
    off, n = int(ext["offset"][k]), int(ext["length"][k])
    _, stop = image_span(data[off:off + IMAGE_HEAD], n)
    at = off + stop + 6  # the label's byte (NOTE [ record layout ])
    proxy = proxy_factory(nginx.port, lambda n_, line: f"flip:{at}" if "GET" in line else None)
    url = proxy.url + "/single/ILSVRC-val.lmdb"
    with pytest.raises(RemoteDataError, match=rf"ILSVRC-val.lmdb record {k} .*digest"):
        _records(open_database(url, remote=_fast()))
    got = dict(_records(open_database(url, remote=_fast(verify=False))))
    assert got[k] != data[off:off + n]  # (what went unnoticed before)


def _scan_byte(data: bytes, off: int, n: int) -> int:
    """The file offset of a byte in the middle of record ``data[off:off + n]``'s
    entropy-coded JPEG data whose inversion makes no marker (it decodes to other pixels,
    silently)."""
    from seqloader.format.records import IMAGE_HEAD, image_span

    start, stop = image_span(data[off:off + IMAGE_HEAD], n)
    image = data[off + start:off + stop]
    sos = image.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(image[sos + 2:sos + 4], "big")
    at = (scan + len(image) - 2) // 2
    while image[at] in (0x00, 0xFF) or image[at - 1] == 0xFF:
        at += 1
    assert scan < at < len(image) - 2
    return off + start + at


@pytest.mark.needs("nginx", "fsspec", "aiohttp")
@pytest.mark.parametrize("workers", [0, 2])
def test_flipped_image_byte_is_caught(nginx, lmdb_dir, proxy_factory, workers):
    """A proxy inverts one byte inside a record's image data in transit: the record's
    entry in the metadata's digest table (NOTE [ record digests ]) catches it, with 0 and
    2 workers; with ``verify=False`` the changed image is decoded and served silently
    (as every remote read was before the table)."""
    from seqloader import Loader
    from seqloader.errors import RemoteDataError
    from seqloader.read.database import open_database

    local = open_database(lmdb_dir, "val")
    ext = np.frombuffer(local.metas[0].extents, [("offset", "<u8"), ("length", "<u4")])
    data = (lmdb_dir / "ILSVRC-val.lmdb").read_bytes()
    k = 5
    at = _scan_byte(data, int(ext["offset"][k]), int(ext["length"][k]))
    proxy = proxy_factory(nginx.port, lambda n_, line: f"flip:{at}" if "GET" in line else None)
    url = proxy.url + "/single/ILSVRC-val.lmdb"

    def epoch(**kw):
        loader = Loader(url, "val", _mean_color, batch_size=4, num_workers=workers,
                        remote=_fast(block=16 << 10, **kw))
        try:
            return [x for x, _ in loader]
        finally:
            loader.close()

    with pytest.raises(RemoteDataError, match=rf"ILSVRC-val.lmdb record {k} \(global {k}\): "
                                              r"its digest .* differs.*seqloader verify"):
        epoch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a decoder may warn of corrupt data)
        assert len(epoch(verify=False)) == 3  # 12 records, all served
    if not workers:  # `seqloader verify URL` reports it (and goes on)
        from seqloader.tools.dbtools.verify import verify_database

        res = verify_database(url, workers=1, progress=False)
        assert any(f"digests of 1 records (first: record {k})" in p for p in res.problems)
        assert any("checksum" in p for p in res.problems), res.problems


def test_records_of_files_without_digests_get_the_older_checks(lmdb_dir):
    """A file of an older writer (no ``digests``) is checked as before: it unpacks, its
    label matches the metadata's, its image starts as a JPEG; a changed image byte
    passes (what the table is for)."""
    import dataclasses

    from seqloader.errors import RemoteDataError
    from seqloader.format.records import IMAGE_HEAD, image_span
    from seqloader.read.database import open_database
    from seqloader.read.remotecheck import checked_records

    db = open_database(lmdb_dir, "val")
    old = [dataclasses.replace(m, digests=b"") for m in db.metas]
    records = _records(db)
    n = len(records)
    url = ["http://host/ILSVRC-val.lmdb"]

    def check(metas, k, change):
        pairs = [(i, memoryview(change(bytearray(v)) if i == k else v)) for i, v in records]
        return [i for i, _ in checked_records(iter(pairs), url, [0, n], metas)]

    def image_byte(v):
        v[len(v) // 2] ^= 0xFF
        return v

    def label(v):
        v[image_span(bytes(v[:IMAGE_HEAD]), len(v))[1] + 6] ^= 0xFF  # (NOTE [ record layout ])
        return v

    assert check(old, 2, image_byte) == list(range(n))
    with pytest.raises(RemoteDataError, match=r"record 2 \(global 2\): has label"):
        check(old, 2, label)
    for change in (image_byte, label):
        with pytest.raises(RemoteDataError, match=r"record 2 \(global 2\): its digest"):
            check(db.metas, 2, change)


@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_weak_etags_are_not_sent_in_if_match(nginx, lmdb_dir, proxy_factory):
    """A server with weak ETags that answers a weak If-Match with 412 (RFC 9110)."""
    from seqloader.read.database import open_database

    proxy = proxy_factory(nginx.port, etags="weak")
    db = open_database(proxy.url + "/single/ILSVRC-val.lmdb", remote=_fast())
    assert db.remote.files[0].etag.startswith("W/")
    assert _records(db) == _records(open_database(lmdb_dir, "val"))


def test_cache_falls_back_and_counts_once(tmp_path):
    """A cache_dir that cannot be created: no cache, a warning; a block stored twice
    (two ranks) is counted once in the usage."""
    from seqloader.read.remote import RemoteFile, RemoteOptions
    from seqloader.read.remotecache import BlockCache, open_cache

    (tmp_path / "file").write_text("x")
    with pytest.warns(RuntimeWarning, match="cache"):
        assert open_cache(tmp_path / "file" / "cache", 1 << 20, 4096) is None
    cache = BlockCache(tmp_path / "c", 1 << 20, 4096)
    f = RemoteFile("s3://b/k", 1 << 20, None, RemoteOptions(), identity="fp:abc")
    for _ in range(3):
        cache.put(f, 0, bytes(4096))
    assert int((tmp_path / "c" / "usage").read_text()) == cache.cached_bytes()
    other = RemoteFile("s3://b/k", 1 << 20, None, RemoteOptions(), identity="fp:other")
    assert not cache.read_into(other, 0, memoryview(bytearray(4096)))


# ------------------------------------------------------------------ secrets, listings, writing

@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_password_in_url_never_printed(nginx):
    secret = "hunter2-do-not-print"
    url = nginx.url.replace("http://", f"http://user:{secret}@") + "/single"
    for extra in ([], ["--json"]):
        out = subprocess.run([sys.executable, "-m", "seqloader.cli", "info", url, *extra],
                             env=_env(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert secret not in out.stdout + out.stderr
        assert "'train'" in out.stdout or '"train"' in out.stdout  # (splits listed, no --split)
    dead = f"http://user:{secret}@127.0.0.1:{rs.free_port()}/x/ILSVRC-val.lmdb"
    out = subprocess.run([sys.executable, "-m", "seqloader.cli", "info", dead], env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and secret not in out.stdout + out.stderr


@pytest.mark.needs("s3fs", "moto")
def test_repr_hides_storage_options_secrets(moto, s3_url):
    from seqloader import Loader

    loader = Loader(s3_url, "val", batch_size=4, num_workers=0,
                    remote=_fast(moto.storage_options()))
    text = repr(loader.db) + repr(loader.db.remote) + str(loader.db.remote.options)
    assert rs.SECRET not in text and rs.KEY not in text and "s3://" in text


@pytest.mark.needs("s3fs", "moto")
def test_cli_verify_lists_url_splits(moto, s3_url):
    out = subprocess.run([sys.executable, "-m", "seqloader.cli", "verify", s3_url,
                          "--no-progress"], env=_env(moto), capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "train:" in out.stdout and "val:" in out.stdout


@pytest.mark.needs("s3fs", "moto")
def test_preprocess_to_missing_bucket_fails_before_writing(moto, synth_tree, tmp_path):
    from seqloader import WriteOptions, preprocess
    from seqloader.errors import RemoteNotFoundError

    staging = tmp_path / "staging"
    t0 = time.monotonic()
    with pytest.raises(RemoteNotFoundError, match="no-such-bucket"):
        preprocess(synth_tree.root, "s3://no-such-bucket/imagenet", staging=staging,
                   storage_options=moto.storage_options(),
                   options=WriteOptions(progress=False, workers=1))
    assert not staging.exists()
    assert time.monotonic() - t0 < 30
