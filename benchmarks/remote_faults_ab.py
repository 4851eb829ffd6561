#!/usr/bin/env python
"""A/B of two seqloader trees reading from S3 over a slow, distant link (issue 30).

    sudo python benchmarks/remote_faults_ab.py DB WORK --a OLD_TREE --b NEW_TREE
                                              [--rounds 2] [--epochs 3] [--seconds 10]

``DB``: a seqloader database folder with a sharded ``train`` split; ``OLD_TREE`` /
``NEW_TREE``: source trees (e.g. ``git archive <commit> | tar -x -C OLD_TREE``), each put
first on ``PYTHONPATH`` of its runs.  The link is :mod:`remote_read`'s: a network
namespace with moto's S3 server behind ``delay_proxy.py`` (``--rtt-ms``), ``tc tbf``
at ``--rate-mbit`` both ways, servers on CPU 1, clients on CPU 0.  Runs alternate
A, B, A, B... (``--rounds``), each: raw reading (``num_workers=1``, no transform) over
``--epochs`` whole epochs after a warm-up one, payload MB/s and the client's CPU
seconds per GB; B also with ``RemoteOptions(verify=False)`` (the cost of NOTE [ records
checked on arrival ]); and the full pipeline (``seqloader bench --mode full``, 1
worker, ``--seconds``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import remote_read as rr  # noqa: E402

_RAW = r"""
import json, resource, sys, time
from seqloader import Loader
url, epochs, dev, verify = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
kw = {}
if verify != "default":
    from seqloader.read.remote import RemoteOptions
    kw["remote"] = RemoteOptions(verify=verify == "on")
def rx():
    return int(open(f"/sys/class/net/{dev}/statistics/rx_bytes").read())
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
loader = Loader(url, "train", batch_size=256, shuffle=True, num_workers=1, **kw)
for epoch in range(1 + epochs):  # epoch 0 warms up; then whole epochs are timed
    loader.set_epoch(epoch)
    if epoch == 1:
        start, c0, r0, n, nbytes = time.perf_counter(), cpu(), rx(), 0, 0
    for images, labels in loader:
        if epoch:
            n += len(images); nbytes += sum(len(x) for x in images)
dt, c = time.perf_counter() - start, cpu() - c0
print(json.dumps({"mb_per_s": round(nbytes / dt / 1e6, 2), "images_per_s": round(n / dt, 1),
                  "wire_mb_per_s": round((rx() - r0) / dt / 1e6, 2),
                  "cpu_s_per_gb": round(c / (nbytes / 1e9), 2)}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--a", type=Path, required=True, help="the old source tree")
    ap.add_argument("--b", type=Path, required=True, help="the new source tree")
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespace, tc)")
    args.work.mkdir(parents=True, exist_ok=True)
    base_env = rr.env()

    def env_of(tree: Path) -> dict:
        return {**base_env, "PYTHONPATH": str(tree.resolve())}

    def run(tree: Path, cmd: list[str]) -> dict:
        # (cwd=tree: `python -c`/`-m` put the working folder first on sys.path)
        out = subprocess.run(rr.client(*cmd), env=env_of(tree), capture_output=True, text=True,
                             timeout=900, cwd=tree)
        if out.returncode:
            raise RuntimeError(f"{cmd[:4]}: {out.stderr[-2000:]}")
        try:
            return json.loads(out.stdout)  # (bench --json: one indented document)
        except json.JSONDecodeError:
            return json.loads(out.stdout.strip().splitlines()[-1])

    shards = sorted(args.db.glob("ILSVRC-train*.lmdb"))
    net = rr.Net(args.rate_mbit, args.work)
    s3 = "s3://bench/imagenet"
    res: dict = {"db_bytes": sum(f.stat().st_size for f in shards), "shards": len(shards),
                 "rate_mbit": args.rate_mbit, "rtt_ms": args.rtt_ms,
                 "loadavg_start": os.getloadavg()[0], "runs": []}
    try:
        rr.start_servers(net, args.db, [], args.rtt_ms)
        net.limit()
        res["link"] = rr.curl_rate(f"http://{rr.IP_NS}:{rr.S3_PROXY}/bench/imagenet/{shards[0].name}")
        for r in range(args.rounds):
            for name, tree in (("A", args.a), ("B", args.b)):
                modes = ["default"] + (["off"] if name == "B" else [])
                for verify in modes:
                    row = run(tree, [sys.executable, "-c", _RAW, s3, str(args.epochs),
                                     rr.VETH_HOST, verify])
                    row.update(tree=name, what=f"raw verify={verify}", round=r)
                    print(row, file=sys.stderr, flush=True)
                    res["runs"].append(row)
                full = run(tree, [sys.executable, "-m", "seqloader.tools.bench", s3, "--split",
                                  "train", "--mode", "full", "--workers", "1", "--seconds",
                                  str(args.seconds), "--json", "--no-progress"])["results"][0]
                row = {"tree": name, "what": "full", "round": r,
                       "images_per_s": full.get("images_per_s")}
                print(row, file=sys.stderr, flush=True)
                res["runs"].append(row)
    finally:
        net.down()
    res["loadavg_end"] = os.getloadavg()[0]
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
