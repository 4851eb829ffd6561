"""Preprocessing into object storage: shards written locally, uploaded (multipart) to a
real S3 endpoint (moto's server), skipped on re-runs, never visible half-uploaded."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/ (remote_servers.py, nginx.conf)
sys.path.insert(0, str(HERE))
import remote_servers as rs  # noqa: E402

PART = 64 << 10  # multipart part size in these tests (moto is told to accept it)


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    with pytest.MonkeyPatch.context() as mp:  # (the server inherits it)
        mp.setenv("S3_UPLOAD_PART_MIN_SIZE", str(PART))
        server = rs.MotoServer(tmp_path_factory.mktemp("moto-upload"))
    server.s3 = boto3.client("s3", aws_access_key_id=rs.KEY, aws_secret_access_key=rs.SECRET,
                             endpoint_url=server.endpoint, region_name="us-east-1")
    server.s3.create_bucket(Bucket="seqloader-up")
    yield server
    server.stop()


@pytest.fixture
def small_parts(monkeypatch):
    import seqloader.write.upload as upload

    monkeypatch.setattr(upload, "PART_BYTES", PART)


def _objects(moto, prefix: str) -> dict[str, int]:
    resp = moto.s3.list_objects_v2(Bucket="seqloader-up", Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1:]: o["Size"] for o in resp.get("Contents", [])}


def _records(path, split, **kw) -> list[tuple[int, bytes]]:
    from seqloader.read.database import open_database
    from seqloader.read.reader import RangeReader

    db = open_database(path, split, **kw)
    reader = RangeReader(db)
    try:
        return [(i, bytes(v)) for i, v in reader.read([(0, db.num_records)])]
    finally:
        reader.close()


def _preprocess(src, url, moto, staging, splits=None, **opts):
    from seqloader import WriteOptions, preprocess

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        reports = preprocess(src, url, splits=splits,
                             options=WriteOptions(progress=False, workers=2, **opts),
                             staging=staging, storage_options=moto.storage_options())
    return reports, [str(m.message) for m in w]


def _puts(moto, key_part: str) -> int:
    return len([ln for ln in moto.log.read_text(errors="replace").splitlines()
                if ("PUT /" in ln or "POST /" in ln) and key_part in ln
                and ".seqloader-write-check" not in ln])  # (the destination's probe)


@pytest.mark.needs("s3fs", "moto")
def test_preprocess_to_s3_multipart_skip_on_rerun(moto, synth_tree, lmdb_dir, tmp_path,
                                                  small_parts):
    """Shards arrive complete (multipart), read back as a local write's records, the
    bad-files report beside its shard, staging emptied; a re-run uploads nothing."""
    from seqloader.read.database import open_database
    from seqloader.read.remote import RemoteOptions

    url, staging = "s3://seqloader-up/sharded", tmp_path / "staging"
    reports, said = _preprocess(synth_tree.root, url, moto, staging, shards=2)
    objs = _objects(moto, "sharded")
    names = [f"ILSVRC-{s}-0000{k}-of-00002.lmdb" for s in ("train", "val") for k in (0, 1)]
    assert set(names) <= set(objs)
    assert [s.path for r in reports for s in r.shards] == [f"{url}/{n}" for n in names]
    log = moto.log.read_text()
    assert log.count("?uploads") >= 2 and "partNumber=2" in log  # multipart, several parts
    reported = [n for n in objs if n.endswith(".bad-files.tsv")]
    assert reported and any(".bad-files.tsv" in m and url in m for m in said)
    assert not staging.exists()  # every shard removed once uploaded
    opts = RemoteOptions(storage_options=moto.storage_options())
    for split in ("train", "val"):  # (the same records as the unsharded local write)
        assert _records(url, split, remote=opts) == _records(lmdb_dir, split)
        # (each record checked against the uploaded digest table: NOTE [ record digests ])
        assert all(len(m.digests) == 8 * m.num_records > 0
                   for m in open_database(url, split, remote=opts).metas)
    body = moto.s3.get_object(Bucket="seqloader-up", Key=f"sharded/{reported[0]}")["Body"].read()
    assert set(body.splitlines()) <= set(
        (lmdb_dir / "ILSVRC-train.lmdb.bad-files.tsv").read_bytes().splitlines())
    before = _puts(moto, "/seqloader-up/sharded/")
    reports, _ = _preprocess(synth_tree.root, url, moto, staging, shards=2)
    assert all(s.skipped for r in reports for s in r.shards)
    assert _puts(moto, "/seqloader-up/sharded/") == before  # nothing written again
    with pytest.raises(FileExistsError, match="not written by this command"):
        _preprocess(synth_tree.root, url, moto, staging, shards=2, seed=7)
    with pytest.raises(FileExistsError, match="in another layout"):
        _preprocess(synth_tree.root, url, moto, staging, shards=3)


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_failed_upload_leaves_no_object_and_rerun_completes(moto, synth_tree, tmp_path,
                                                            small_parts):
    """A part refused (403) mid-upload: the multipart upload is aborted, no object (so
    no shard a reader could open), the complete local shard stays in staging; the
    re-run uploads it without writing it again, and only the missing shard."""
    from seqloader.read.remote import RemoteOptions

    url, staging = "s3://seqloader-up/faulty", tmp_path / "staging"
    proxy = rs.FaultProxy(moto.port, lambda n, line: "403" if "partNumber=2" in line
                          and "train-00001" in line else None)
    from seqloader import WriteOptions, preprocess

    try:
        with pytest.raises(OSError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            preprocess(synth_tree.root, url, splits=["train"],
                       options=WriteOptions(progress=False, workers=2, shards=2),
                       staging=staging, storage_options=moto.storage_options(proxy.url))
    finally:
        proxy.down()
    assert "403" in proxy.injected
    objs = _objects(moto, "faulty")
    assert "ILSVRC-train-00000-of-00002.lmdb" in objs
    assert "ILSVRC-train-00001-of-00002.lmdb" not in objs
    assert not moto.s3.list_multipart_uploads(Bucket="seqloader-up").get("Uploads")  # aborted
    assert (staging / "ILSVRC-train-00001-of-00002.lmdb").exists()
    before = _puts(moto, "/seqloader-up/faulty/ILSVRC-train-00000")
    reports, _ = _preprocess(synth_tree.root, url, moto, staging, splits=["train"], shards=2)
    assert [s.skipped for s in reports[0].shards] == [True, False]
    assert _puts(moto, "/seqloader-up/faulty/ILSVRC-train-00000") == before
    assert "ILSVRC-train-00001-of-00002.lmdb" in _objects(moto, "faulty")
    opts = RemoteOptions(storage_options=moto.storage_options())
    assert len(_records(url, "train", remote=opts)) == reports[0].num_records


def test_preprocess_to_a_non_atomic_filesystem(synth_tree, tmp_path):
    """Filesystems without atomic uploads (fsspec's memory:// here) get the shard under
    ``.partial`` and then renamed; the result reads like a local write."""
    fsspec = pytest.importorskip("fsspec")
    from seqloader import WriteOptions, preprocess

    url = "memory://seqloader-upload-test/db"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, url, splits=["val"], staging=tmp_path / "s",
                   options=WriteOptions(progress=False, workers=1))
        preprocess(synth_tree.root, tmp_path / "local", splits=["val"],
                   options=WriteOptions(progress=False, workers=1))
    fs = fsspec.filesystem("memory")
    try:
        assert sorted(p.rpartition("/")[2] for p in fs.ls("/seqloader-upload-test/db",
                                                            detail=False)) == ["ILSVRC-val.lmdb"]
        assert _records(url, "val") == _records(tmp_path / "local", "val")
    finally:
        fs.rm("/seqloader-upload-test", recursive=True)


@pytest.mark.slow
@pytest.mark.needs("s3fs", "moto")
def test_cli_killed_during_upload_then_resumed(moto, synth_tree, tmp_path, small_parts):
    """``seqloader preprocess SRC s3://...`` killed (SIGKILL) while its multipart upload
    is being completed: no object appears; the same command again finishes the job."""
    url, staging = "s3://seqloader-up/killed", tmp_path / "staging"
    stalled = []

    def fault(n, line):
        if line.startswith("POST") and "uploadId=" in line and "train" in line:
            stalled.append(n)
            return "slow:60"
        return None

    proxy = rs.FaultProxy(moto.port, fault)
    env = {**os.environ, **moto.env(proxy.url), "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", "import sys, seqloader.write.upload as u; u.PART_BYTES = "
           f"{PART}; from seqloader.cli import main; sys.exit(main(sys.argv[1:]))",
           "preprocess", str(synth_tree.root), url, "--splits", "train", "--staging",
           str(staging), "--no-progress", "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not stalled and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert stalled, proc.communicate(timeout=10)
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
        proxy.down()
    assert "ILSVRC-train.lmdb" not in _objects(moto, "killed")
    env.update(moto.env())
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{url}/ILSVRC-train.lmdb" in out.stdout
    assert "ILSVRC-train.lmdb" in _objects(moto, "killed") and not staging.exists()
