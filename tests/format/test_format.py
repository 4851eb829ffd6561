import os

import lmdb
import msgpack
import pytest

from seqloader.read.database import open_database
from seqloader.format.meta import FORMAT_VERSION, PLAIN_VERSION, pack_meta, unpack_meta
from seqloader.format.keys import META_KEY, decode_key, encode_key, is_record_key
from seqloader.format.records import Record, pack_record, unpack_record
from seqloader.format.files import find_database, shard_path
from seqloader.errors import FormatError, IncompleteError


def test_keys_sort_in_index_order_and_after_meta():
    idx = [0, 1, 2, 255, 256, 65535, 10**9, 2**40]
    keys = [encode_key(i) for i in idx]
    assert sorted(keys) == keys
    assert all(META_KEY < k for k in keys)
    assert [decode_key(k) for k in keys] == idx
    assert all(is_record_key(k) for k in keys) and not is_record_key(META_KEY)
    with pytest.raises(ValueError, match="out of range"):
        encode_key(-1)


def test_record_roundtrip_keeps_optional_and_unknown_fields():
    rec = Record(b"\xff\xd8jpeg", 7, path="n1/x.JPEG", reencoded="cmyk", extra={"box": [1, 2]})
    back = unpack_record(pack_record(rec))
    assert back == rec
    minimal = unpack_record(msgpack.packb({"image": b"x", "label": 3}))
    assert (minimal.image, minimal.label, minimal.path) == (b"x", 3, None)


def test_malformed_record_names_where():
    with pytest.raises(FormatError, match="record 12"):
        unpack_record(b"\x93\x01", where="record 12")
    with pytest.raises(FormatError, match="label of type str"):
        unpack_record(msgpack.packb({"image": b"x", "label": "cat"}))


def test_pickle_payload_cannot_run_code(tmp_path):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps(Evil())
    with pytest.raises(FormatError):
        unpack_record(payload)
    with pytest.raises(FormatError):
        unpack_meta(payload, where="x")
    assert not marker.exists()


def _write_lmdb(path, items):
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for k, v in items:
            txn.put(k, v)
    env.close()


def _meta_dict(**over):
    d = dict(format="seqloader", version=FORMAT_VERSION, split="train", classes=["a"],
             num_records=0, complete=True, checksum="00" * 32, fingerprint="f")
    d.update(over)
    return d


def test_newer_version_and_incomplete_and_foreign_files_fail_clearly(tmp_path):
    newer = tmp_path / "newer.lmdb"
    _write_lmdb(newer, [(META_KEY, msgpack.packb(_meta_dict(version=FORMAT_VERSION + 1)))])
    with pytest.raises(FormatError, match=rf"version {FORMAT_VERSION + 1} is not supported.*upgrade"):
        open_database(newer)
    partial = tmp_path / "partial.lmdb"
    _write_lmdb(partial, [(META_KEY, msgpack.packb(_meta_dict(complete=False)))])
    with pytest.raises(IncompleteError, match="incomplete.*resume"):
        open_database(partial)
    assert open_database(partial, require_complete=False).metas[0].complete is False
    foreign = tmp_path / "foreign.lmdb"
    _write_lmdb(foreign, [(b"00000001", b"pickled stuff")])
    with pytest.raises(FormatError, match="not written by seqloader"):
        open_database(foreign)
    junk = tmp_path / "junk.lmdb"
    junk.write_bytes(b"not lmdb at all" * 1000)
    with pytest.raises(FormatError, match="cannot be opened as an LMDB"):
        open_database(junk)


def test_meta_roundtrip_ignores_unknown_fields():
    d = _meta_dict(future_field=1)
    meta = unpack_meta(msgpack.packb(d), where="x")
    assert meta.split == "train" and unpack_meta(pack_meta(meta), where="y") == meta


def test_shard_names_and_discovery(tmp_path):
    out = tmp_path / "ILSVRC-train.lmdb"
    assert shard_path(out, 0, 1) == out
    names = [shard_path(out, i, 3) for i in range(3)]
    assert names[1].name == "ILSVRC-train-00001-of-00003.lmdb"
    for p in names[::2]:
        p.write_bytes(b"")
    with pytest.raises(FormatError, match=r"shard\(s\) \[1\] of 3 are missing"):
        find_database(tmp_path, "train")
    names[1].write_bytes(b"")
    assert find_database(tmp_path, "train") == names
    assert find_database(names[2]) == names
    with pytest.raises(FileNotFoundError, match="ILSVRC-val.lmdb"):
        find_database(tmp_path, "val")
    (tmp_path / "ILSVRC-val.lmdb.partial").write_bytes(b"")  # an interrupted write
    with pytest.raises(FileNotFoundError, match=r"interrupted: ILSVRC-val\.lmdb\.partial; re-run"):
        find_database(tmp_path, "val")


def test_version_1_files_keep_their_blake2b_checksum(lmdb_dir, tmp_path):
    """A file written before format version 2 (BLAKE2b chain, no algorithm field) still
    opens and verifies; a wrong checksum in it is still caught; a new file's chain is
    SHA-256 -- computed here from the raw records, independently of the writer."""
    import hashlib
    import shutil

    from seqloader.read.verify import verify_database
    from conftest import raw_items

    src = lmdb_dir / "ILSVRC-val.lmdb"
    items = [(k, v) for k, v in raw_items(src) if is_record_key(k)]

    def chain(h):
        c = bytes(32)
        for k, v in items:
            c = h(c + k + h(v).digest()).digest()
        return c.hex()

    sha = open_database(src).metas[0]
    assert sha.version == PLAIN_VERSION == 2 and sha.checksum_algorithm == "sha256"
    assert sha.checksum == chain(hashlib.sha256)

    old = tmp_path / "v1.lmdb"
    shutil.copy(src, old)
    d = msgpack.unpackb(pack_meta(sha))
    del d["checksum_algorithm"], d["digests"]  # (neither existed in version 1)
    d.update(version=1, checksum=chain(lambda b: hashlib.blake2b(b, digest_size=32)))
    env = lmdb.open(str(old), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, msgpack.packb(d, use_bin_type=True))
    env.close()
    meta = open_database(old).metas[0]
    assert (meta.version, meta.checksum_algorithm) == (1, "blake2b-256")
    assert verify_database(old, progress=False).ok
    d["checksum"] = sha.checksum  # right records, the other algorithm's chain: damaged
    env = lmdb.open(str(old), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(META_KEY, msgpack.packb(d, use_bin_type=True))
    env.close()
    res = verify_database(old, progress=False)
    assert not res.ok and "checksum" in res.problems[0]


def test_unknown_checksum_algorithm_fails_clearly():
    with pytest.raises(FormatError, match="checksum algorithm 'crc7'.*upgrade"):
        unpack_meta(msgpack.packb(_meta_dict(checksum_algorithm="crc7")), where="x.lmdb")


@pytest.mark.parametrize("keep", [0.5, 0.03])
def test_a_truncated_copy_is_named_not_a_crash(lmdb_dir, tmp_path, keep):
    """LMDB maps the file: reading a page past a cut-short copy's end would be SIGBUS
    (the process dies with no message).  The size the meta page records is checked
    first.  Run in a child process so a regression cannot kill the test run."""
    import subprocess
    import sys

    src = lmdb_dir / "ILSVRC-train.lmdb"
    data = src.read_bytes()
    cut = tmp_path / "ILSVRC-train.lmdb"
    cut.write_bytes(data[:int(len(data) * keep)])
    code = ("from seqloader.read.database import open_database\n"
            f"open_database({str(cut)!r})\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r
    assert "FormatError" in r.stderr and "truncated" in r.stderr and "copy it again" in r.stderr


def test_shard_files_of_a_split_name_with_glob_characters(tmp_path):
    """A split named ``tr[a]in`` globbed as ``train``: --overwrite of it deleted train's
    shards."""
    from pathlib import Path

    from seqloader.format.files import is_shard_name, shard_files, shard_path

    for k in range(2):
        shard_path(tmp_path / "ILSVRC-train.lmdb", k, 2).write_bytes(b"")
    odd = tmp_path / "ILSVRC-tr[a]in.lmdb"
    assert shard_files(odd) == []
    shard_path(odd, 0, 2).write_bytes(b"")
    assert shard_files(odd) == [tmp_path / "ILSVRC-tr[a]in-00000-of-00002.lmdb"]
    assert len(shard_files(tmp_path / "ILSVRC-train.lmdb")) == 2
    assert not is_shard_name("ILSVRC-train-00000-of-00002.lmdb", Path("ILSVRC-tr[a]in.lmdb"))


def test_image_and_label_are_found_without_unpacking():
    """NOTE [ record layout ]: the image's bytes and the label of every integer width
    from the record's head and the bytes after the image; None for another layout."""
    from seqloader.format.records import IMAGE_HEAD, LABEL_TAIL, image_span, label_at

    for image in (b"", b"\xff\xd8" * 5, b"x" * 300, b"y" * 70000):
        for label in (0, 5, 127, 128, 255, 256, 65535, 65536, 2**32, -1, -32, -33, -200, -2**40):
            v = pack_record(Record(image=image, label=label, path="a/b.JPEG", extra={"k": 1}))
            start, stop = image_span(v[:IMAGE_HEAD], len(v))
            assert v[start:stop] == image
            assert label_at(v[stop:stop + LABEL_TAIL]) == label
    other = msgpack.packb({"label": 3, "image": b"abc"}, use_bin_type=True)
    assert image_span(other[:IMAGE_HEAD], len(other)) is None
    v = pack_record(Record(image=b"abc", label=3))
    assert image_span(v[:IMAGE_HEAD], len(v) - 8) is None  # a cut record
    assert label_at(b"\xa5other\x03") is None
