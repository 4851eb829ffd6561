#!/usr/bin/env python
"""A/B of two seqloader trees reading raw from S3 (moto) and HTTP (nginx) on loopback (issue 37).

    python benchmarks/remote_loopback_ab.py DB WORK --a TREE_A --b TREE_B
                                            [--rounds 5] [--epochs 2] [--json OUT]

``DB``: a seqloader database folder with a ``train`` split (one file or shards);
``WORK``: a folder for the servers' files and logs; ``TREE_A`` / ``TREE_B``: source
trees (a checkout or ``git worktree`` of each commit), each put first on
``PYTHONPATH`` of its runs.  moto's S3 server (the database uploaded to it) and nginx
(serving ``DB``) start once, on 127.0.0.1 (``tests/remote_servers.py``); then runs
alternate A B, B A, A B... (``--rounds``), each a new process reading the whole split raw
with a :class:`~seqloader.read.reader.RangeReader` (default ``RemoteOptions``: records
checked on arrival, no cache) for ``--epochs`` passes after a warm-up pass, from S3
then from HTTP: payload MB/s and the client's CPU seconds per GB.  Loopback is a fast
link with no latency: what it measures is the client's per-GET and per-record cost.
Prints one JSON document: every run, and per server the median of each tree, the
ratio of the medians and the median of the rounds' A/B ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import remote_servers as rs  # noqa: E402

_CLIENT = r"""
import json, resource, sys, time
from seqloader.read.database import open_database
from seqloader.read.reader import RangeReader
from seqloader.read.remote import RemoteOptions
url, epochs, endpoint = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opts = RemoteOptions(storage_options={"client_kwargs": {"endpoint_url": endpoint}}
                     if url.startswith("s3://") else {})
db = open_database(url, "train", remote=opts)
reader = RangeReader(db)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
for epoch in range(1 + epochs):  # pass 0 warms up
    if epoch == 1:
        start, c0, nbytes = time.perf_counter(), cpu(), 0
    for i, v in reader.read([(0, db.num_records)]):
        if epoch:
            nbytes += len(v)
dt, c = time.perf_counter() - start, cpu() - c0
reader.close()
print(json.dumps({"mb_per_s": round(nbytes / dt / 1e6, 1),
                  "cpu_s_per_gb": round(c / (nbytes / 1e9), 3)}))
"""


def _client(tree: str, url: str, epochs: int, env: dict) -> dict:
    env = {**env, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _CLIENT, url, str(epochs),
                          env.get("AWS_ENDPOINT_URL", "")], env=env, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"client failed ({tree}, {url}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--a", required=True, help="source tree A (e.g. this branch)")
    ap.add_argument("--b", required=True, help="source tree B (e.g. main)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--servers", default="s3,http", help="which to read from (%(default)s)")
    ap.add_argument("--json", type=Path, help="also write the document here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    www = Path(tempfile.mkdtemp(dir=args.work, prefix="www-"))
    (www / "db").symlink_to(args.db.resolve())
    moto = rs.MotoServer(args.work)
    nginx = None
    try:
        s3 = moto.upload(args.db, "bench", "db")
        nginx = rs.Nginx(www, args.work)
        name = "ILSVRC-train.lmdb" if (args.db / "ILSVRC-train.lmdb").exists() else next(
            p.name for p in sorted(args.db.glob("ILSVRC-train-*.lmdb")))
        urls = {k: v for k, v in (("s3", s3), ("http", f"{nginx.url}/db/{name}"))
                if k in args.servers.split(",")}
        env = {**os.environ, **moto.env()}
        runs = []
        for r in range(args.rounds):  # (A B, B A, A B...: no tree always goes first)
            for label, tree in (("A", args.a), ("B", args.b))[::1 if r % 2 == 0 else -1]:
                for server, url in urls.items():
                    res = {"round": r, "tree": label, "server": server,
                           **_client(tree, url, args.epochs, env)}
                    runs.append(res)
                    print(json.dumps(res), file=sys.stderr, flush=True)
    finally:
        moto.stop()
        if nginx is not None:
            nginx.stop()
    summary = {}
    for server in urls:
        med = {t: {k: statistics.median(x[k] for x in runs if x["tree"] == t
                                        and x["server"] == server)
                   for k in ("mb_per_s", "cpu_s_per_gb")} for t in ("A", "B")}
        pairs = [a["mb_per_s"] / b["mb_per_s"] for r in range(args.rounds)
                 for a in runs for b in runs if a["round"] == b["round"] == r
                 and a["server"] == b["server"] == server and a["tree"] == "A"
                 and b["tree"] == "B"]
        summary[server] = {**med, "a_over_b_mb_per_s": round(med["A"]["mb_per_s"]
                                                            / med["B"]["mb_per_s"], 3),
                           # (each round's A/B, then their median: robust to the host's drift)
                           "a_over_b_per_round": [round(x, 3) for x in pairs],
                           "a_over_b_median_of_rounds": round(statistics.median(pairs), 3)}
    doc = {"a": args.a, "b": args.b, "rounds": args.rounds, "epochs": args.epochs,
           "summary": summary, "runs": runs}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
