"""A damaged source is refused, not copied into an output that passes verify
(NOTE [ checked sources ] in stream.py)."""
from __future__ import annotations

import dataclasses
import shutil

import lmdb
import numpy as np
import pytest

from seqloader.errors import FormatError
from seqloader.format.keys import META_KEY
from seqloader.format.meta import EXTENT_DTYPE, pack_meta
from seqloader.read.database import open_database
from seqloader.read.verify import verify_database
from seqloader.tools.dbtools import export, merge, reshard, subset


def damaged_copy(lmdb_dir, tmp_path, *, record=5, table=True):
    """The train file of ``lmdb_dir`` copied, one byte inside ``record``'s image flipped
    (``table=False``: and its digest table dropped, as older writers wrote it)."""
    src = tmp_path / "src"
    src.mkdir()
    f = src / "ILSVRC-train.lmdb"
    shutil.copy(lmdb_dir / "ILSVRC-train.lmdb", f)
    meta = open_database(f).metas[0]
    if not table:
        env = lmdb.open(str(f), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            txn.put(META_KEY, pack_meta(dataclasses.replace(meta, digests=b"")))
        env.close()
    ext = np.frombuffer(meta.extents, EXTENT_DTYPE)
    pos = int(ext["offset"][record]) + int(ext["length"][record]) // 2
    with open(f, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert not verify_database(f, workers=1, progress=False).ok
    return f


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("tool", ["reshard", "merge", "export"])
def test_a_damaged_source_is_refused(lmdb_dir, tmp_path, tool, table):
    f = damaged_copy(lmdb_dir, tmp_path, table=table)
    out = tmp_path / "out"
    with pytest.raises(FormatError, match=r"ILSVRC-train\.lmdb.*damaged.*seqloader verify"):
        if tool == "reshard":
            reshard(f, out, shards=2, progress=False)
        elif tool == "merge":
            merge([f], out, shuffle=True, progress=False)
        else:
            export(f, out, progress=False)
    if tool == "export":
        assert not out.exists()  # (only its .partial staging folder)
    else:  # (an older file's chain fails at its end: earlier output shards may be done)
        with pytest.raises((FormatError, FileNotFoundError)):
            open_database(out, "train")


def test_a_damaged_record_in_a_subset_is_refused(lmdb_dir, tmp_path):
    f = damaged_copy(lmdb_dir, tmp_path, record=0)
    with pytest.raises(FormatError, match=r"record 0 does not match its digest"):
        subset(f, tmp_path / "out", fraction=1.0, progress=False)
