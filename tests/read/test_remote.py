"""Reading databases at URLs: real S3 (moto's server) and HTTP (nginx) endpoints on
127.0.0.1, a fault-injecting proxy, and the block cache."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import lmdb
import numpy as np
import pytest

from seqloader.format.keys import META_KEY
from seqloader.read.lmdbpages import lookup_first_leaf

HERE = Path(__file__).resolve().parents[1]  # tests/ (remote_servers.py, nginx.conf)
sys.path.insert(0, str(HERE))
import remote_servers as rs  # noqa: E402


# ------------------------------------------------------------------ fixtures

def _need_s3() -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    _need_s3()
    server = rs.MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sharded_dir(synth_tree, tmp_path_factory) -> Path:
    """``synth_tree`` written as 3 shards per split."""
    from seqloader import WriteOptions, preprocess

    out = tmp_path_factory.mktemp("sharded")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, out, options=WriteOptions(progress=False, workers=2, shards=3))
    return out


@pytest.fixture(scope="module")
def s3_url(moto, lmdb_dir) -> str:
    return moto.upload(lmdb_dir, "seqloader-test", "imagenet")


@pytest.fixture(scope="module")
def nginx(sharded_dir, lmdb_dir, tmp_path_factory):
    try:
        www = tmp_path_factory.mktemp("www")
        shutil.copytree(sharded_dir, www / "sharded")
        shutil.copytree(lmdb_dir, www / "single")
        server = rs.Nginx(www, tmp_path_factory.mktemp("nginx"))
    except FileNotFoundError:
        pytest.skip("nginx is not installed")
    yield server
    server.stop()


def _opts(moto, endpoint=None, **kw):
    from seqloader.read.remote import RemoteOptions

    return RemoteOptions(storage_options=moto.storage_options(endpoint), **kw)


def _all_records(db, prefetch: int = 64 << 10, at: int | None = None,
                 then=None) -> list[tuple[int, bytes]]:
    """Every record of ``db`` in order, read by a RangeReader; ``then()`` is called once
    record number ``at`` has arrived (to break the server mid-epoch)."""
    from seqloader.read.reader import RangeReader

    reader = RangeReader(db, prefetch_bytes=prefetch)
    got = []
    try:
        for k, (i, v) in enumerate(reader.read([(0, db.num_records)])):
            got.append((i, bytes(v)))
            if k == at:
                then()
        return got
    finally:
        reader.close()


def _batches(loader) -> list:
    return [(list(map(bytes, x)), y.tolist()) for x, y in loader]


# ------------------------------------------------------------------ metadata by pages

def test_metadata_from_pages_matches_lmdb(tmp_path):
    """Inline and overflow values, a B-tree of several levels, an empty database."""
    path = tmp_path / "t.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 28)
    big = os.urandom(300_000)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, big)
        for i in range(20_000):
            txn.put(b"r" + i.to_bytes(8, "big"), os.urandom(200))
    env.close()
    data = path.read_bytes()
    read = lambda o, n: data[o:o + n]  # noqa: E731
    assert lmdb.open(str(path), subdir=False, readonly=True).stat()["depth"] >= 3
    assert lookup_first_leaf(read, len(data), META_KEY, where="t") == big
    assert lookup_first_leaf(read, len(data), b"__a", where="t") is None  # sorts first, absent
    small = tmp_path / "s.lmdb"
    env = lmdb.open(str(small), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, b"tiny")
    env.close()
    data2 = small.read_bytes()
    assert lookup_first_leaf(lambda o, n: data2[o:o + n], len(data2), META_KEY, where="s") == b"tiny"
    from seqloader.errors import FormatError

    with pytest.raises(FormatError, match="truncated"):
        lookup_first_leaf(read, len(data) // 2, META_KEY, where="t")
    with pytest.raises(FormatError, match="not an LMDB"):
        lookup_first_leaf(lambda o, n: bytes(n), 1 << 20, META_KEY, where="zeros")


# ------------------------------------------------------------------ S3

@pytest.mark.needs("s3fs", "moto")
def test_s3_loader_one_epoch_as_local(moto, s3_url, lmdb_dir):
    from seqloader import Loader

    remote = Loader(s3_url, "train", batch_size=8, shuffle=True, num_workers=0, remote=_opts(moto))
    local = Loader(lmdb_dir, "train", batch_size=8, shuffle=True, num_workers=0)
    assert len(remote) == len(local) and _batches(remote) == _batches(local)


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_s3_loader_same_batches_as_local(moto, s3_url, lmdb_dir):
    """Loader(url) yields exactly Loader(local)'s batches (2 workers, shuffled, 2 epochs;
    evaluation order) and reads the split with a few large GETs."""
    from seqloader import Loader

    opts = _opts(moto)
    before = moto.gets("imagenet/ILSVRC-train")
    for shuffle in (True, False):
        remote = Loader(s3_url, "train", batch_size=8, shuffle=shuffle, num_workers=2, remote=opts)
        local = Loader(lmdb_dir, "train", batch_size=8, shuffle=shuffle, num_workers=2)
        with remote, local:
            assert len(remote) == len(local)
            for _ in range(2 if shuffle else 1):
                assert _batches(remote) == _batches(local)
    # metadata: meta pages + B-tree leaf; data: one GET per epoch (one 8 MiB block)
    assert moto.gets("imagenet/ILSVRC-train") - before <= 3 * 2 + 3


@pytest.mark.needs("s3fs", "moto")
def test_s3_sharded_opens_in_few_requests(moto, sharded_dir, monkeypatch):
    """A sharded split opens with one listing and two ranged GETs per shard, no HEADs
    (NOTE [ opening over ranged reads ]); without a listing, one HEAD per shard more;
    either way the metadata equals the local files'."""
    from seqloader.read import remoteopen
    from seqloader.read.database import open_database

    url = moto.upload(sharded_dir, "seqloader-test", "sharded")
    log = lambda verb: len(re.findall(verb + r' /seqloader-test/sharded/ILSVRC-train',  # noqa: E731
                                      moto.log.read_text(errors="replace")))
    local = open_database(sharded_dir, "train")
    before = log("GET"), log("HEAD")
    db = open_database(url, "train", remote=_opts(moto))
    assert db.metas == local.metas
    gets, heads = log("GET") - before[0], log("HEAD") - before[1]
    assert 3 <= gets <= 2 * 3 and heads == 0
    monkeypatch.setattr(remoteopen, "_listing", lambda folder, options: None)
    before = log("GET"), log("HEAD")
    shard = url + "/ILSVRC-train-00001-of-00003.lmdb"
    db = open_database(shard, remote=_opts(moto))
    assert db.metas == local.metas
    assert (log("GET") - before[0], log("HEAD") - before[1]) == (gets, 3)


@pytest.mark.needs("s3fs", "moto")
def test_s3_data_takes_the_plain_http_path(moto, s3_url, lmdb_dir, monkeypatch):
    """Data GETs go to a presigned URL over http.client (NOTE [ plain ranged GETs ]), not
    through fsspec's event loop; without a signer they fall back to fsspec."""
    from seqloader.read import httprange, remote, remotefs
    from seqloader.read.database import open_database

    want = _all_records(open_database(lmdb_dir, "train"))
    db = open_database(s3_url, "train", remote=_opts(moto))
    calls = []
    real_get = remote.RemoteFile._get
    monkeypatch.setattr(remote.RemoteFile, "_get", lambda self, a, b, t: calls.append(a) or
                        real_get(self, a, b, t))
    assert _all_records(db) == want and calls == []
    monkeypatch.setattr(httprange, "_SIGN_SECONDS", 0)  # (signed again on every GET)
    monkeypatch.setattr(remotefs, "_PLAIN", {})
    fs, _ = remote.filesystem(db.paths[0], db.remote.options)
    monkeypatch.setattr(type(fs), "sign", lambda *a, **k: (_ for _ in ()).throw(
        NotImplementedError("no signer")))
    assert _all_records(db) == want and calls  # fsspec's path, same bytes


def test_opening_reads_outside_the_prefetched_ranges(tmp_path):
    """A file whose metadata lies outside the head and tail ranges is still read right."""
    from seqloader.read.remoteopen import _HEAD, _TAIL, _Ranges

    path = tmp_path / "t.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 28)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, b"m" * 100_000)
    with env.begin(write=True) as txn:
        for i in range(2_000):
            txn.put(b"r" + i.to_bytes(8, "big"), os.urandom(300))
    env.close()
    data = path.read_bytes()
    assert len(data) > _HEAD + _TAIL

    class File:
        size, url = len(data), "mem://t.lmdb"
        fetched: list = []

        def fetch(self, start, end):
            self.fetched.append((start, end))
            return data[start:end]

    r = _Ranges(File())
    for a, b in r.ahead():
        r.fetch(a, b)
    ahead = len(File.fetched)
    assert lookup_first_leaf(r.read, len(data), META_KEY, where="t") == b"m" * 100_000
    assert ahead == 2 and len(File.fetched) > ahead  # (the value lies early in the file)


@pytest.mark.needs("s3fs", "moto")
def test_s3_ranks_read_only_their_chunks(moto, s3_url, lmdb_dir):
    from seqloader.read.database import open_database
    from seqloader.read.reader import RangeReader

    db = open_database(s3_url, "train", remote=_opts(moto, block=8192))
    local = dict(_all_records(open_database(lmdb_dir, "train")))
    reader = RangeReader(db, prefetch_bytes=32 << 10)
    try:
        got = [(i, bytes(v)) for i, v in reader.read([(5, 9), (20, 31)])]
        assert reader._source.oversized == 0
    finally:
        reader.close()
    assert got == [(i, local[i]) for i in list(range(5, 9)) + list(range(20, 31))]


@pytest.mark.needs("s3fs", "moto")
def test_s3_cache_second_epoch_reads_nothing(moto, s3_url, lmdb_dir, tmp_path):
    """Counted on the server: the second epoch (a new process's reader too) GETs nothing;
    a damaged cached block is detected and fetched again."""
    from seqloader.read.database import open_database

    opts = _opts(moto, cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30, block=64 << 10)
    db = open_database(s3_url, "train", remote=opts)
    want = _all_records(open_database(lmdb_dir, "train"))
    first = moto.gets("imagenet/ILSVRC-train")
    assert _all_records(db) == want
    fetched = moto.gets("imagenet/ILSVRC-train") - first
    assert fetched >= 2
    mid = moto.gets("imagenet/ILSVRC-train")
    assert _all_records(db) == want
    assert moto.gets("imagenet/ILSVRC-train") == mid  # epoch 2: all local
    blocks = sorted((tmp_path / "cache").rglob("*.blk"))
    with open(blocks[0], "r+b") as f:  # flip a byte: the CRC catches it
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    assert _all_records(db) == want
    assert moto.gets("imagenet/ILSVRC-train") == mid + 1


def test_block_cache_is_bounded(tmp_path):
    from seqloader.read.remote import RemoteFile, RemoteOptions
    from seqloader.read.remotecache import BlockCache

    cache = BlockCache(tmp_path, limit=10 * 4096 + 100, block=4096)
    f = RemoteFile("s3://b/k", 1 << 20, '"e"', RemoteOptions())
    for k in range(30):
        cache.put(f, k * 4096, bytes([k]) * 4096)
        assert cache.cached_bytes() <= cache.limit
    buf = bytearray(4096)
    assert cache.read_into(f, 29 * 4096, memoryview(buf)) and buf == bytes([29]) * 4096
    assert not cache.read_into(f, 0, memoryview(buf))  # evicted first (least recently used)
    other = RemoteFile("s3://b/k", 1 << 20, '"changed"', RemoteOptions())
    assert not cache.read_into(other, 29 * 4096, memoryview(buf))  # another ETag: not reused


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_s3_faults_are_retried(moto, s3_url, lmdb_dir):
    """Resets, 503 SlowDown, a reply cut mid-body, a stuck reply (past ``timeout``) and the
    server gone for a second mid-epoch: every record arrives once, in order."""
    from seqloader.read.database import open_database

    faults = {3: "reset", 5: "503", 6: "503", 8: "cut", 10: "slow:3", 13: "500"}
    proxy = rs.FaultProxy(moto.port, lambda n, line: faults.get(n) if "GET" in line else None)
    db = open_database(s3_url, "train", remote=_opts(moto, proxy.url, block=16 << 10, timeout=1.0))
    want = _all_records(open_database(lmdb_dir, "train"))

    def gone_for_a_second():
        proxy.down()
        threading.Timer(1.0, proxy.up).start()

    try:
        got = _all_records(db, 48 << 10, at=20, then=gone_for_a_second)
    finally:
        proxy.down()
    assert got == want
    assert {"reset", "503", "cut", "slow:3", "500"} <= set(proxy.injected)


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_s3_permanent_errors_name_url_and_range(moto, s3_url, lmdb_dir, tmp_path):
    from seqloader.read.database import open_database
    from seqloader.read.reader import RangeReader
    from seqloader.read.remote import RemoteChangedError, RemoteError

    with pytest.raises(FileNotFoundError, match="no database for split"):
        open_database(s3_url + "-missing", "train", remote=_opts(moto))
    denied = threading.Event()  # (set once the database is open)
    proxy = rs.FaultProxy(moto.port, lambda n, line: "403" if denied.is_set() else None)
    try:
        db = open_database(s3_url, "train", remote=_opts(moto, proxy.url))
        denied.set()
        reader = RangeReader(db)
        with pytest.raises(RemoteError) as err:
            list(reader.read([(0, 4)]))
        reader.close()
    finally:
        proxy.down()
    msg = str(err.value)
    assert "s3://seqloader-test/imagenet/ILSVRC-train.lmdb bytes " in msg and "403" in msg
    assert rs.SECRET not in msg and rs.KEY not in msg
    # a file replaced on the server after opening: its ETag differs
    url = moto.upload(lmdb_dir, "seqloader-test", "changing")
    db = open_database(url, "val", remote=_opts(moto))
    alt = tmp_path / "alt"
    alt.mkdir()
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", alt / "ILSVRC-val.lmdb")
    moto.upload(alt, "seqloader-test", "changing")
    reader = RangeReader(db)
    with pytest.raises(RemoteChangedError, match=r"changing/ILSVRC-val.lmdb bytes \d+-\d+: the file "
                                                 "changed on the server"):
        list(reader.read([(0, db.num_records)]))
    reader.close()


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_cli_info_and_verify_accept_urls(moto, s3_url):
    env = {**os.environ, **moto.env(), "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "seqloader.cli", "info", s3_url, "--split", "train"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "records" in out.stdout and rs.SECRET not in out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "seqloader.cli", "verify", s3_url, "--split",
                          "train"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.needs("s3fs", "moto")
def test_verify_remote_finds_damage(moto, lmdb_dir, tmp_path, monkeypatch):
    """A record flipped on the server (metadata intact) fails the checksum."""
    from seqloader.read.database import open_database
    from seqloader.tools.dbtools.verify import verify_database

    bad = tmp_path / "bad"
    bad.mkdir()
    data = bytearray((lmdb_dir / "ILSVRC-val.lmdb").read_bytes())
    db = open_database(lmdb_dir, "val")
    ext = np.frombuffer(db.metas[0].extents, [("offset", "<u8"), ("length", "<u4")])
    off = int(ext["offset"][3]) + int(ext["length"][3]) // 2
    data[off] ^= 0xFF
    (bad / "ILSVRC-val.lmdb").write_bytes(bytes(data))
    url = moto.upload(bad, "seqloader-test", "damaged")
    for k, v in moto.env().items():  # credentials from the environment, as in production
        monkeypatch.setenv(k, v)
    res = verify_database(url, "val", workers=1, progress=False)
    assert not res.ok and any("checksum" in p for p in res.problems)


_DDP = r"""
import os, sys, json, torch.distributed as dist
from seqloader import Loader
from seqloader.read.remote import RemoteOptions
dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=2,
                        init_method="tcp://127.0.0.1:" + sys.argv[3])
loader = Loader(sys.argv[1], "train", batch_size=4, shuffle=True, num_workers=1)
seen = [[[bytes(i).hex() for i in x], y.tolist()] for x, y in loader]
print(json.dumps({"len": len(loader), "batches": seen}))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_ddp_two_ranks_from_s3(moto, s3_url, lmdb_dir):
    """2 ranks (gloo, CPU) read disjoint halves from the S3 endpoint: together every
    record once, equal batch counts, as from the local copy."""
    import json

    from seqloader import Loader

    env = {**os.environ, **moto.env(), "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    port = str(rs.free_port())
    procs = [subprocess.Popen([sys.executable, "-c", _DDP, s3_url, str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert results[0]["len"] == results[1]["len"] == len(results[0]["batches"])
    for rank, res in enumerate(results):
        local = Loader(lmdb_dir, "train", batch_size=4, shuffle=True, num_workers=0,
                       rank=rank, world_size=2)
        assert res["batches"] == [[[bytes(i).hex() for i in x], y.tolist()] for x, y in local]


# ------------------------------------------------------------------ HTTP (nginx)

@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_http_sharded_same_as_local(nginx, sharded_dir):
    """A sharded split over HTTP: from a folder URL (nginx lists it) and from one shard's
    URL; every record equals the local copy's."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from seqloader.read.database import open_database

    want = _all_records(open_database(sharded_dir, "train"))
    by_folder = open_database(nginx.url + "/sharded", "train")
    assert len(by_folder.paths) == 3
    assert _all_records(by_folder) == want
    one = [p for p in by_folder.paths if "-00001-of-" in p][0]
    assert _all_records(open_database(one)) == want


@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_http_server_restart_mid_epoch(nginx, lmdb_dir):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from seqloader.read.database import open_database
    from seqloader.read.remote import RemoteOptions

    db = open_database(nginx.url + "/single", "train", remote=RemoteOptions(block=16 << 10))
    want = _all_records(open_database(lmdb_dir, "train"))
    before = []

    def restart():
        before.append(nginx.gets("single/"))
        nginx.stop()
        time.sleep(0.5)
        nginx.start()

    got = _all_records(db, 48 << 10, at=10, then=restart)
    assert got == want and nginx.gets("single/") > before[0]


@pytest.mark.needs("nginx", "fsspec", "aiohttp")
def test_http_loader_same_batches(nginx, lmdb_dir):
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from seqloader import Loader

    remote = Loader(nginx.url + "/single", "val", batch_size=5, num_workers=0)
    local = Loader(lmdb_dir, "val", batch_size=5, num_workers=0)
    assert _batches(remote) == _batches(local)


def test_urls_never_show_credentials():
    from seqloader.read.remotefaults import describe, safe_url

    assert safe_url("https://user:pw@host/a/b.lmdb?X-Amz-Signature=abc") == "https://host/a/b.lmdb"
    e = OSError("GET https://user:pw@host/x?X-Amz-Signature=abc failed")
    text = describe(e, "https://user:pw@host/x?X-Amz-Signature=abc")
    assert "pw" not in text and "abc" not in text


def test_s3_loader_stats_give_the_block_caches_hit_rate(moto, s3_url, tmp_path):
    """``Loader.stats()["cache_hit_rate"]``: the share of blocks served by the local cache
    since the reader opened -- none in the first epoch, all in the second."""
    from seqloader import Loader

    opts = _opts(moto, cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30, block=64 << 10)
    with Loader(s3_url, "train", None, batch_size=8, num_workers=0, world_size=1, rank=0,
                remote=opts) as loader:
        list(loader)
        first = loader.stats()
        list(loader)
        second = loader.stats()
    assert first["cache_hit_rate"] == 0.0 and first["read_mb_per_s"] >= 0
    assert 0.4 <= second["cache_hit_rate"] <= 0.6  # (half of all the blocks read)
