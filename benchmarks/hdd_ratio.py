"""The full pipeline on a simulated hard disk as a share of the CPU limit, alternated.

Like ``cpu_ratio.py`` (whose helpers it uses), but the pipeline runs under
``hddsim`` (``--hddsim``; page cache dropped, reads throttled to 100 IO/s and
150 MiB/s), once with each of the Loader's two read paths.  Per round and database:

1. the CPU limit as the issue defines it: ``seqloader bench --mode cpu-limit`` (the fused
   decode + transform code in one process over records in memory) x 2 cores;
2. for ``--io direct`` and ``--io buffered`` (NOTE [ direct I/O ] in
   ``seqloader/read/direct.py``), the 2-worker, batch-256 full pipeline under hddsim, cold:
   ``epoch`` -- the first epoch from its first batch (``--warmup 2 --batches 78``: all but
   the last 2 of its 82 batches, shuffle-buffer fill included) -- and ``steady`` --
   batches 21-62 (``--warmup 20 --batches 42``: between the buffer's fill and its drain,
   what most of an ImageNet epoch looks like).

    python benchmarks/hdd_ratio.py --data DIR [--db lmdb-rst] [--rounds 3] [--tag TAG]
        [--hddsim PATH] [--out DIR]

Writes ``hdd_ratio-<dbs>[-TAG].md`` and ``.json`` into ``--out`` (default: the current
directory; ``--out benchmarks/results`` to update the committed ones).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchpaths import (add_data_argument, add_hddsim_argument, add_out_argument,  # noqa: E402
                        need_hddsim, out_dir)
from cpu_ratio import _json_out, _kb, bench_command, cpu_limit, save  # noqa: E402

WINDOWS = {"epoch": ["--warmup", "2", "--batches", "78"],
           "steady": ["--warmup", "20", "--batches", "42"]}
IOS = ("direct", "buffered")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--db", default="lmdb-rst",
                    help="database folder(s) under --data, comma-separated (%(default)s)")
    ap.add_argument("--tag", default="", help="suffix of the results' file names")
    add_hddsim_argument(ap)
    add_out_argument(ap)
    args = ap.parse_args()
    hddsim = need_hddsim(args)
    dbs = [d for d in args.db.split(",") if d]
    rounds = []
    for r in range(args.rounds):
        for d in dbs:
            bench = bench_command(args.data, d)
            single = cpu_limit(bench)
            row = {"round": r + 1, "db": d, "time": time.strftime("%H:%M:%S"),
                   "limit": single["images_per_s"],
                   "limit_sample_mean_kb": _kb(single.get("sample_mean_bytes")),
                   "data_mean_kb": _kb(single.get("data_mean_bytes")), "load": os.getloadavg()}
            for io in IOS:
                for w, flags in WINDOWS.items():
                    res = _json_out([hddsim, "--dir", args.data, "--"] + bench + [
                        "--mode", "full", "--cold", "--io", io] + flags)["results"][0]
                    assert res["io"] == io, res["io"]
                    key = f"{io}_{w}"
                    row[key] = res["images_per_s"]
                    row[key + "_pct"] = round(100 * res["images_per_s"] / row["limit"], 1)
                    row[key + "_cpu"] = res["cpu_percent"]
                    row[key + "_disk_mb_s"] = res["disk_mb_per_s"]
                    row[key + "_pss_mb"] = res["peak_pss_mb"]
            print(json.dumps(row), flush=True)
            rounds.append(row)
    keys = [f"{io}_{w}" for io in IOS for w in WINDOWS]
    med = {d: {k: round(statistics.median(x[k] for x in rounds if x["db"] == d), 1)
               for k in ["limit"] + keys + [k + "_pct" for k in keys]} for d in dbs}
    doc = {"rounds": rounds, "median": med, "command": " ".join(sys.argv)}
    name = "hdd_ratio-" + "-".join(dbs) + (f"-{args.tag}" if args.tag else "")
    intro = (".  Limit: one process x 2 cores over records in memory.  Pipeline: 2 workers, "
             "batch 256, RandomResizedCrop(224)+flip+ToTensor+Normalize, under hddsim (100 IO/s, "
             "150 MiB/s), cold; `epoch` = the first epoch (shuffle-buffer fill included), "
             "`steady` = batches 21-62.  Cells: images/s (% of the limit; CPU % of one core; "
             "disk MB/s).")
    lines = ["| round | database | time | limit | " + " | ".join(
                 f"{io} {w}" for io in IOS for w in WINDOWS) + " | limit sample mean KB (data's) |",
             "| ---: | --- | --- | ---: | " + " | ".join("---:" for _ in keys) + " | --- |"]
    for x in rounds:
        cells = [f"{x[k]:.0f} ({x[k + '_pct']} %; {x[k + '_cpu']}; {x[k + '_disk_mb_s']})"
                 for k in keys]
        lines.append(f"| {x['round']} | {x['db']} | {x['time']} | {x['limit']:.0f} | "
                     + " | ".join(cells) + f" | {x['limit_sample_mean_kb']} ({x['data_mean_kb']}) |")
    lines.append("")
    for d, m in med.items():
        lines.append(f"Median, {d}: limit {m['limit']:.0f} images/s; " + "; ".join(
            f"{k.replace('_', ' ')} {m[k]:.0f} = {m[k + '_pct']} %" for k in keys) + ".")
    save(out_dir(args), name, doc,
         "Full pipeline under hddsim vs the CPU limit, measured in alternation", intro, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
