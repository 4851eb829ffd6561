"""Migration of the original sequential loader's / tensorpack's LMDB files."""
from __future__ import annotations

import os
import pickle
import warnings

import lmdb
import msgpack
import numpy as np
import pytest

from conftest import read_records
from seqloader.read.database import open_database
from seqloader.write.migrate import UnsafePickleError, safe_loads
from seqloader.write.preprocess import preprocess_sources
from seqloader.write.writer import WriteOptions


def _jpegs(n: int) -> list[bytes]:
    import cv2

    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        ok, buf = cv2.imencode(".jpg", rng.integers(0, 256, (16, 16, 3), np.uint8))
        out.append(buf.tobytes())
    return out


def _tensorpack_lmdb(path, datapoints, dumps) -> None:
    """As tensorpack's LMDBSerializer.save writes: '{:08}' keys, then __keys__."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 26, meminit=False, map_async=True)
    keys = []
    with env.begin(write=True) as txn:
        for i, dp in enumerate(datapoints):
            keys.append(f"{i:08}".encode("ascii"))
            txn.put(keys[-1], dumps(dp))
        txn.put(b"__keys__", dumps(keys))
    env.sync()
    env.close()


def _msgpack_numpy(obj):
    def enc(o):
        if isinstance(o, np.ndarray):  # msgpack-numpy's encoding
            return {b"nd": True, b"type": o.dtype.str, b"kind": b"", b"shape": o.shape,
                    b"data": o.tobytes()}
        if isinstance(o, np.generic):
            return {b"nd": False, b"type": o.dtype.str, b"data": o.tobytes()}
        return o
    return msgpack.packb(obj, default=enc, use_bin_type=True)


@pytest.mark.parametrize("dumps", [lambda o: pickle.dumps(o, protocol=-1),
                                   lambda o: pickle.dumps(o, protocol=2), _msgpack_numpy],
                         ids=["pickle", "pickle2", "msgpack"])
def test_tensorpack_lmdb_migrates(tmp_path, dumps):
    imgs = _jpegs(12)
    dps = [[np.frombuffer(b, np.uint8), np.int64(i % 3)] for i, b in enumerate(imgs)]
    src = tmp_path / "ILSVRC-train.lmdb"
    _tensorpack_lmdb(src, dps, dumps)
    names = tmp_path / "classes.txt"
    names.write_text("n01\nn02\nn03\n")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess_sources([src], out, class_names=["n01", "n02", "n03"],
                           options=WriteOptions(progress=False, workers=2))
    db = open_database(out / "ILSVRC-train.lmdb")
    assert db.classes == ["n01", "n02", "n03"] and db.metas[0].shuffled
    got = sorted((r.path, r.label, r.image) for _, r in read_records(out / "ILSVRC-train.lmdb"))
    assert got == [(f"ILSVRC-train.lmdb/{i:08}", i % 3, b) for i, b in enumerate(imgs)]


def test_restricted_unpickler_refuses_code(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with pytest.raises(UnsafePickleError, match="system"):
        safe_loads(pickle.dumps([Evil(), 1]))
    assert not marker.exists()
    # the same record inside a database: the migration stops with the refusal
    src = tmp_path / "ILSVRC-train.lmdb"
    _tensorpack_lmdb(src, [[np.frombuffer(_jpegs(1)[0], np.uint8), 0], [Evil(), 1]],
                     lambda o: pickle.dumps(o, protocol=-1))
    with pytest.raises(UnsafePickleError, match="refused to load global"):
        preprocess_sources([src], tmp_path / "out", options=WriteOptions(progress=False))
    assert not marker.exists()
    with pytest.raises(UnsafePickleError, match="object"):
        safe_loads(pickle.dumps(np.array([1, "x"], dtype=object)))
    assert safe_loads(pickle.dumps([np.arange(3, dtype=np.uint8), "a", 1.5])
                      )[0].tolist() == [0, 1, 2]


def test_refused_and_damaged_pickles_name_the_file_and_record(tmp_path):
    """A refused pickle is a FormatError naming the file and record (it was a bare
    UnpicklingError naming neither); a pickle asking for a 1 TiB array is refused before
    anything is allocated (it was a raw _ArrayMemoryError); protocol 0/1 pickles are read
    (they failed as "unpack(b) received extra data")."""
    from seqloader.errors import FormatError

    img = np.frombuffer(_jpegs(1)[0], np.uint8)

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    src = tmp_path / "evil-train.lmdb"
    _tensorpack_lmdb(src, [[img, 0], [Evil(), 1]], lambda o: pickle.dumps(o, protocol=-1))
    with pytest.raises(FormatError, match=r"evil-train\.lmdb record '00000001': refused to load "
                                          r"global posix\.system"):
        preprocess_sources([src], tmp_path / "out", options=WriteOptions(progress=False))
    # _reconstruct(ndarray, (2**40,), 'b'): a few bytes asking for 1 TiB
    bomb = (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
            b"\x8a\x06\x00\x00\x00\x00\x00\x01\x85C\x01b\x87R.")
    with pytest.raises(UnsafePickleError, match="refused an array of 1,099,511,627,776 bytes"):
        safe_loads(bomb)
    src = tmp_path / "bomb-train.lmdb"
    _tensorpack_lmdb(src, [[img, 0]], lambda o: bomb)
    with pytest.raises(FormatError, match=r"bomb-train\.lmdb record '00000000': refused an array"):
        preprocess_sources([src], tmp_path / "out2", options=WriteOptions(progress=False))
    for protocol in (0, 1):
        src = tmp_path / f"p{protocol}-train.lmdb"
        _tensorpack_lmdb(src, [[img, np.int64(0)]] * 2,
                         lambda o, p=protocol: pickle.dumps(o, protocol=p))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            preprocess_sources([src], tmp_path / f"o{protocol}", class_names=["n01"],
                               options=WriteOptions(progress=False, workers=1))
        assert open_database(tmp_path / f"o{protocol}" / "ILSVRC-train.lmdb").num_records == 2
