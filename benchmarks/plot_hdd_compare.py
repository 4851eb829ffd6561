"""Draw the README's headline picture from ``hdd_compare.py``'s JSON: images/s of the
file-per-image DataLoader and of seqloader, warm and under the simulated HDD.

    python benchmarks/plot_hdd_compare.py [benchmarks/results/hdd_compare.json] [--out PNG]

Needs matplotlib (``pip install -c constraints.txt -e '.[plot]'``); the PNG goes beside
the JSON unless ``--out`` says otherwise.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

#: (label, loader, mode, workers, cache state) of each pair of bars, top to bottom.
BARS = [
    ("raw reading, simulated HDD", "raw", 2, "hddsim"),
    ("full pipeline, simulated HDD\n(steady state)", "full", 2, "hddsim-steady"),
    ("full pipeline, simulated HDD\n(whole first epoch)", "full", 2, "hddsim"),
    ("full pipeline, warm page cache", "full", 2, "warm"),
]


def rate(rows: list[dict], loader: str, mode: str, workers: int, state: str) -> float:
    """images/s of the row; the files loader has no steady-state row (its rate is flat)."""
    if loader == "files" and state == "hddsim-steady":
        state = "hddsim"
    for r in rows:
        if (r["loader"], r["mode"], r["workers"], r["cache_state"]) == (loader, mode, workers, state):
            return float(r["images_per_s"])
    raise KeyError(f"no {loader} {mode} row with {workers} workers, {state}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="?", default=str(Path(__file__).parent / "results" / "hdd_compare.json"))
    ap.add_argument("--out", help="PNG to write (default: beside the JSON)")
    args = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(Path(args.json).read_text())
    rows = doc["rows"]
    cpu_limit = rate(rows, "seqloader", "cpu-limit", 2, "memory")
    fig, ax = plt.subplots(figsize=(8, 3.9))
    h = 0.38
    for i, (label, mode, workers, state) in enumerate(BARS):
        y = len(BARS) - 1 - i
        files = rate(rows, "files", mode, workers, state)
        seq = rate(rows, "seqloader", mode, workers, state)
        ax.barh(y + h / 2, files, h, color="#9aa5b1", label="torch DataLoader over the files" if i == 0 else None)
        ax.barh(y - h / 2, seq, h, color="#1f77b4", label="seqloader" if i == 0 else None)
        ax.text(files + 20, y + h / 2, f"{files:,.0f}", va="center", fontsize=8)
        ax.text(seq + 20, y - h / 2, f"{seq:,.0f}  ({seq / files:.1f}x)", va="center", fontsize=8)
    ax.axvline(cpu_limit, color="#d62728", ls="--", lw=1)
    ax.text(cpu_limit + 15, -0.55, f"CPU limit\n{cpu_limit:,.0f}", color="#d62728", fontsize=8)
    ax.set_yticks(range(len(BARS)), [b[0] for b in reversed(BARS)], fontsize=8)
    ax.set_xlabel("images/s (2 cores, 2 workers, batch 256; 21,000 ImageNet-sized JPEGs)")
    ax.set_xlim(0, cpu_limit * 1.3)
    ax.set_ylim(-0.7, len(BARS) - 0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("Loading ImageNet-like data from a 7200 rpm HDD (simulated) and warm", fontsize=10)
    fig.tight_layout()
    out = Path(args.out) if args.out else Path(args.json).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
