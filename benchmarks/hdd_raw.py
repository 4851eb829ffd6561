"""The reader alone on a simulated hard disk: ``LMDBData`` and the raw Loader, A/B.

Each run is ``hddsim -- python -c ...`` (page cache dropped, reads throttled, by
default 100 IO/s and 150 MiB/s) in a fresh process with ``PYTHONPATH`` set to one
checkout, reading the first epoch of a shuffled database cold, one of:

* ``lmdbdata``: ``LMDBData(db, shuffle=True)`` (the DataFlow reader stage, buffered I/O);
* ``raw``: ``Loader(db, transform=None, shuffle=True, num_workers=0)``, buffered and
  ``--io direct``.

It reports the records' bytes per second of wall time (from opening the database, and
from the first record or batch on) as a share of the throttle, and the CPU seconds.
Checkouts alternate within each round.

    python benchmarks/hdd_raw.py DB_DIR --hddsim PATH --checkout before=OLD \
        --checkout after=. [--rounds 2] [--mbps 150] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_RUN = r"""
import json, sys, time
import seqloader.loader, seqloader.dataflow.stages  # (imports are not the reader's time)
what, db, io = sys.argv[1], sys.argv[2], sys.argv[3]
t0, c0, n, nbytes, first = time.perf_counter(), time.process_time(), 0, 0, None
if what == "lmdbdata":
    df = seqloader.dataflow.stages.LMDBData(db, "train", shuffle=True, io=io)
    df.reset_state()
    for image, label in df:
        n, nbytes = n + 1, nbytes + len(image)
        first = first or (time.perf_counter(), nbytes)
    df.close()
else:
    L = seqloader.loader.Loader(db, "train", None, batch_size=256, shuffle=True, num_workers=0,
                                world_size=1, rank=0, io=io)
    for images, labels in L:
        n, nbytes = n + len(images), nbytes + sum(len(x) for x in images)
        first = first or (time.perf_counter(), nbytes)
    L.close()
end = time.perf_counter()
print(json.dumps({"images": n, "bytes": nbytes, "wall_s": end - t0,
                  "cpu_s": time.process_time() - c0, "first_s": first[0] - t0,
                  "after_first_mibs": (nbytes - first[1]) / (end - first[0]) / 2**20}))
"""


def _once(hddsim: str, checkout: str, what: str, io: str, args: argparse.Namespace) -> dict:
    path = os.path.abspath(checkout)
    cmd = [hddsim, "--dir", args.db, "--mbps", str(args.mbps), "--", sys.executable, "-c", _RUN,
           what, args.db, io]
    out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=path), cwd=path,
                         capture_output=True, text=True, timeout=900, check=False)
    if out.returncode:
        raise RuntimeError(f"{what} in {checkout} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="database folder holding ILSVRC-train.lmdb")
    ap.add_argument("--hddsim", required=True, help="path of the hddsim tool")
    ap.add_argument("--checkout", action="append", required=True, help="NAME=PATH (repeat)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mbps", type=int, default=150, help="hddsim's bandwidth, MiB/s")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args(argv)
    rows = []
    for r in range(args.rounds):
        for what, io in (("lmdbdata", "buffered"), ("raw", "buffered"), ("raw", "direct")):
            for name, path in (c.split("=", 1) for c in args.checkout):
                row = _once(args.hddsim, path, what, io, args)
                mibs = row["bytes"] / row["wall_s"] / 2**20
                row.update(name=name, round=r, what=what, io=io, pct=100 * mibs / args.mbps)
                rows.append(row)
                print(f"round {r} {what:>8} {io:>8} {name:>8}: {mibs:6.1f} MiB/s "
                      f"({row['pct']:5.1f} %; after the first item "
                      f"{100 * row['after_first_mibs'] / args.mbps:5.1f} %)  "
                      f"{row['images'] / row['wall_s']:6.0f} img/s  first {row['first_s']:.2f} s  "
                      f"cpu {row['cpu_s']:.2f} s of {row['wall_s']:.2f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
