"""The full pipeline's images/s as a share of the CPU limit, measured in alternation.

This VM's CPU speed drifts by 10-20 % over minutes (other tenants), so a CPU limit
measured at one moment and a pipeline run measured at another can disagree by more than
the effect being measured.  This script alternates, for ``--rounds`` rounds:

1. the CPU limit as the issue defines it: ``seqloader bench --mode cpu-limit`` (the
   fused decode + transform code in one process over records in memory) x 2 cores;
2. the same code in 2 processes at once (``hdd_compare.py --cpu-limit-child 2``), each
   writing into a 256-sample batch buffer like a worker -- what the 2 cores deliver
   together;
3. the full pipeline, warm: ``seqloader bench --mode full --workers 2 --batch-size 256``.

and reports each round's ratios, so every ratio compares figures taken a minute apart.

    python benchmarks/cpu_ratio.py --data DIR [--db lmdb-hdd] [--rounds 3] [--seconds 30]
        [--out DIR] [--tag TAG]

``--data`` is the folder ``hdd_compare.py --phase build`` filled (``--db`` names database
folders in it).  Writes ``cpu_ratio.md`` and ``.json`` into ``--out`` (default: the
current directory; ``--out benchmarks/results`` to update the committed ones);
``cpu_ratio-<db>-<db>.*`` for other ``--db`` lists, e.g. ``--db lmdb-hdd,lmdb-rst``: the
same images also written with ``--restart-markers``, measured in turn in every round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchpaths import REPO, add_data_argument, add_out_argument, out_dir  # noqa: E402


def _json_out(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:  # show why: the child's stderr, not only its exit status
        raise RuntimeError(f"{' '.join(cmd)} exited with {r.returncode}:\n{r.stderr[-4000:]}")
    out = r.stdout
    return json.loads(out[out.index("{"):])


def bench_command(data: str, db: str) -> list[str]:
    """``seqloader.tools.bench`` on ``data/db``: the issue's 2 workers, batch 256, JSON out."""
    return [sys.executable, "-m", "seqloader.tools.bench", str(Path(data) / db), "--loader",
            "seqloader", "--workers", "2", "--batch-size", "256", "--json", "--no-progress"]


def cpu_limit(bench: list[str]) -> dict:
    """The CPU-limit row (one process over records in memory, x 2 cores) of ``bench``."""
    return _json_out(bench + ["--mode", "cpu-limit", "--seconds", "5"])["results"][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--db", default="lmdb-hdd",
                    help="database folder(s) under --data, comma-separated: each round "
                         "measures each in turn (%(default)s)")
    ap.add_argument("--tag", default="",
                    help="suffix of the results' file names (keeps earlier runs' files)")
    add_out_argument(ap)
    args = ap.parse_args()
    dbs = [d for d in args.db.split(",") if d]
    for d in dbs:  # warm
        subprocess.run(["cat"] + [str(p) for p in (Path(args.data) / d).glob("*.lmdb")],
                       check=True, stdout=subprocess.DEVNULL)
    rounds = []
    for r in range(args.rounds):
        for d in dbs:
            bench = bench_command(args.data, d)
            single = cpu_limit(bench)
            conc = _json_out([sys.executable, str(HERE / "hdd_compare.py"), "--cpu-limit-child",
                              "2", "--data", args.data, "--db", d])
            full = _json_out(bench + ["--mode", "full", "--seconds", str(args.seconds)])["results"][0]
            row = {"round": r + 1, "db": d, "time": time.strftime("%H:%M:%S"),
                   "limit_single_x2": single["images_per_s"], "limit_concurrent": conc["images_per_s"],
                   "pipeline": full["images_per_s"], "pipeline_cpu_percent": full["cpu_percent"],
                   "pipeline_peak_pss_mb": full["peak_pss_mb"], "load": os.getloadavg(),
                   "limit_sample_records": single.get("sample_records"),
                   "limit_sample_mean_kb": _kb(single.get("sample_mean_bytes")),
                   "data_mean_kb": _kb(single.get("data_mean_bytes"))}
            row["pct_of_single_x2"] = round(100 * row["pipeline"] / row["limit_single_x2"], 1)
            row["pct_of_concurrent"] = round(100 * row["pipeline"] / row["limit_concurrent"], 1)
            print(json.dumps(row), flush=True)
            rounds.append(row)
    med = {d: {k: round(statistics.median(x[k] for x in rounds if x["db"] == d), 1)
               for k in ("pct_of_single_x2", "pct_of_concurrent", "pipeline", "limit_single_x2")}
           for d in dbs}
    doc = {"rounds": rounds, "median": med, "command": " ".join(sys.argv)}
    name = ("cpu_ratio" if dbs == ["lmdb-hdd"] else "cpu_ratio-" + "-".join(dbs)) + (
        f"-{args.tag}" if args.tag else "")
    intro = (": per round and database, the CPU limit (one process x 2 cores; and 2 processes "
             "at once), then the warm 2-worker full pipeline (`seqloader bench --mode full`, "
             "batch 256).  The limits run over records held in memory; the sample's mean size "
             "should match the data's (NOTE [ a representative sample ] in "
             "`seqloader/tools/bench/runs.py`).")
    lines = ["| round | database | time | limit: 1 process x 2 | limit: 2 processes at once "
             "| pipeline images/s | % of 1 x 2 | % of 2 at once | pipeline CPU % | peak PSS MB "
             "| limit sample: records, mean KB (data's mean KB) |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for x in rounds:
        lines.append(f"| {x['round']} | {x['db']} | {x['time']} | {x['limit_single_x2']:.0f} | "
                     f"{x['limit_concurrent']:.0f} | {x['pipeline']:.0f} | {x['pct_of_single_x2']} | "
                     f"{x['pct_of_concurrent']} | {x['pipeline_cpu_percent']} | "
                     f"{x['pipeline_peak_pss_mb']} | {x['limit_sample_records']}, "
                     f"{x['limit_sample_mean_kb']} ({x['data_mean_kb']}) |")
    lines.append("")
    for d, m in med.items():
        lines.append(f"Median, {d}: pipeline {m['pipeline']:.0f} images/s = "
                     f"{m['pct_of_single_x2']} % of one process x 2 cores "
                     f"({m['limit_single_x2']:.0f}/s), {m['pct_of_concurrent']} % of 2 processes "
                     "at once.")
    save(out_dir(args), name, doc, "Full pipeline vs the CPU limit, measured in alternation",
         intro, lines)
    return 0


def save(out: Path, name: str, doc: dict, title: str, intro: str, lines: list[str]) -> None:
    """Write ``out/<name>.json`` (``doc``) and ``out/<name>.md``: ``title``, the command
    that ran, ``intro``, then ``lines``."""
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    script = Path(sys.argv[0]).name
    head = [f"# {title}", "", "`" + " ".join(["python", f"benchmarks/{script}", *sys.argv[1:]])
            + "` (see its docstring)" + intro, ""]
    (out / f"{name}.md").write_text("\n".join(head + lines + [""]))


def _kb(nbytes: float | None) -> float | None:
    return None if nbytes is None else round(nbytes / 1e3, 1)


if __name__ == "__main__":
    sys.exit(main())
