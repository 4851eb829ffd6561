"""Reader-side CPU per image in raw mode, A/B between checkouts, in alternation.

Each run is a fresh process with ``PYTHONPATH`` set to one checkout: a ``Loader(db,
split, transform=None, shuffle=True, num_workers=0)`` reads one epoch to warm the page
cache, then ``--epochs`` epochs are timed. It reports images per CPU-second
(``time.process_time``: every thread of the process, user + system) and per wall-second
(``--consume copy``: with ``bytes(image)`` of every image in the timed loop), and a
digest of one epoch's labels and bytes (equal digests: the same records in the same
order). The host's other load moves the wall rate more than the CPU rate; runs of the
checkouts alternate so that both see the same conditions.

    python benchmarks/raw_cpu.py DB_DIR --checkout before=OLD --checkout after=. \
        [--split train] [--rounds 5] [--epochs 5] [--consume none|copy] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_RUN = r"""
import hashlib, json, sys, time
import seqloader
from seqloader import Loader
db, split = sys.argv[1], sys.argv[2]
epochs, batch, cache = map(int, sys.argv[3:6])
copy = sys.argv[6] == "copy"
L = Loader(db, split, None, batch_size=batch, shuffle=True, cache=cache, num_workers=0,
           world_size=1, rank=0)
h = hashlib.sha256()
for images, labels in L:  # epoch 0: warms the page cache; its order is the digest
    for im in images:
        h.update(bytes(im))
    h.update(labels.numpy().tobytes())
c0, w0, n = time.process_time(), time.perf_counter(), 0
for _ in range(epochs):
    for images, labels in L:
        n += len(images)
        if copy:
            for im in images:
                bytes(im)
cpu, wall = time.process_time() - c0, time.perf_counter() - w0
L.close()
print(json.dumps({"images": n, "cpu_s": cpu, "wall_s": wall, "digest": h.hexdigest()[:16],
                  "type": type(images[0]).__name__, "module": seqloader.__file__}))
"""


def _once(checkout: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    out = subprocess.run([sys.executable, "-c", _RUN, args.db, args.split, str(args.epochs),
                          str(args.batch_size), str(args.cache), args.consume],
                         env=env, cwd=os.path.abspath(checkout), capture_output=True, text=True,
                         timeout=1800, check=False)
    if out.returncode:
        raise RuntimeError(f"run in {checkout} failed:\n{out.stderr[-3000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["load1"] = os.getloadavg()[0]
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="database folder or .lmdb file")
    ap.add_argument("--checkout", action="append", required=True,
                    help="NAME=PATH of a source checkout (repeat)")
    ap.add_argument("--split", default="train")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--cache", type=int, default=5000)
    ap.add_argument("--consume", choices=("none", "copy"), default="none",
                    help="what the timed loop does with each image: nothing, or bytes(image) "
                         "(what a consumer that needs bytes pays; free for bytes)")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args(argv)
    checkouts = [c.split("=", 1) for c in args.checkout]
    rows: list[dict] = []
    for r in range(args.rounds):
        for name, path in checkouts:
            row = _once(path, args)
            row.update(name=name, round=r, time=time.strftime("%H:%M:%S"))
            rows.append(row)
            assert row["module"].startswith(os.path.abspath(path)), row["module"]
            print(f"round {r} {name:>8}: {row['images'] / row['cpu_s']:8.0f} img/CPU-s "
                  f"{row['images'] / row['wall_s']:8.0f} img/s  cpu {row['cpu_s']:.2f} s  "
                  f"wall {row['wall_s']:.2f} s  load {row['load1']:.1f}  {row['digest']} "
                  f"{row['type']}", flush=True)
    print()
    for name, _ in checkouts:
        mine = [x for x in rows if x["name"] == name]
        per_cpu = sorted(x["images"] / x["cpu_s"] for x in mine)
        per_wall = sorted(x["images"] / x["wall_s"] for x in mine)
        print(f"{name:>8}: img/CPU-s {per_cpu[0]:.0f}-{per_cpu[-1]:.0f} "
              f"(median {per_cpu[len(per_cpu) // 2]:.0f}); img/s {per_wall[0]:.0f}-"
              f"{per_wall[-1]:.0f}; digests {sorted({x['digest'] for x in mine})}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
