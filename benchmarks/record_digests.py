"""The cost of checking records read over the network (NOTE [ records checked on
arrival ] in seqloader/read/remotecheck.py): each record's SHA-256 against the
metadata's digest table, against the checks files without a table get (msgpack unpack,
label, JPEG start), run by ``checked_records`` itself on a real database's records
held in memory (what a remote reader hands it), in this process.

    python benchmarks/record_digests.py DB [--split train] [--records 1000] [--rounds 7]

Prints JSON: for each check, microseconds per record, seconds of CPU per GB of records
and GB/s (best of ``--rounds``, CPU time of this process), and the records' mean size.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from seqloader.read.database import open_database
from seqloader.read.reader import RangeReader
from seqloader.read.remotecheck import checked_records


def _records(path: str, split: str | None, limit: int):
    db = open_database(path, split)
    n = min(limit, db.metas[0].num_records)
    reader = RangeReader(db)
    try:
        values = [bytes(v) for _, v in reader.read([(0, n)])]
    finally:
        reader.close()
    return db, values


def _best(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db")
    ap.add_argument("--split")
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args(argv)
    db, values = _records(a.db, a.split, a.records)
    meta = db.metas[0]
    assert meta.digests, f"{a.db} has no digest table: write it with this seqloader"
    n, total = len(values), sum(len(v) for v in values)
    views = [memoryview(v) for v in values]
    urls, offsets = ["http://host/db.lmdb"], [0, meta.num_records]

    def run(metas) -> None:
        for _ in checked_records(iter(enumerate(views)), urls, offsets, metas):
            pass

    checks = {"digest table (sha256)": [meta],
              "no table (unpack, label, SOI)": [dataclasses.replace(meta, digests=b"")],
              "loop only": None}
    out = {"records": n, "mean_record_bytes": round(total / n)}
    for name, metas in checks.items():
        s = _best((lambda m=metas: run(m)) if metas else
                  (lambda: [None for _ in enumerate(views)]), a.rounds)
        out[name] = {"us_per_record": round(s / n * 1e6, 2), "s_per_GB": round(s / total * 1e9, 3),
                     "GB_per_s": round(total / s / 1e9, 2) if s else None}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
