"""Shuffle quality of seqloader's epoch order over a grid of ``cache`` x ``chunk_size``.

For a training split written **class-sorted** (``--no-shuffle`` at preprocessing) and
one written **shuffled once at write** (the default), and every combination of the
Loader's shuffle buffer (``cache``, in records) and ``chunk_size`` (records per chunk
of the epoch plan), this computes -- from the plan alone, no data is read
(:func:`seqloader.tools.quality.epoch_order` is exact: it is what the Loader yields) --

* ``distinct``: mean distinct labels per batch / its expectation under an ideal
  uniform shuffle (:func:`seqloader.tools.quality.distinct_ratio`; 1.0 = ideal).  Low values
  mean batches dominated by a few classes (biased gradients and BatchNorm statistics).
* ``epoch corr``: Spearman correlation of the records' positions in two consecutive
  epochs (:func:`seqloader.tools.quality.epoch_correlation`; 0.0 = ideal).  It depends on
  the order only, not on the labels, so it is the same for both layouts.
* ``pair repeat``: of the record pairs that share a batch in epoch ``e``, the
  fraction that share a batch again in epoch ``e + 1`` (ideal: ``(B-1)/(N-1)``,
  printed in the header).  Chunking keeps chunk-mates close every epoch; this is the
  only figure that sees that on a database shuffled at write (where ``distinct`` is
  ~1 whatever the settings).  Also label-independent.
* ``buffer``: the shuffle buffer's memory, ``cache x mean record bytes`` (110 KB for
  ImageNet JPEGs unless ``--record-kb`` or ``--db`` says otherwise).  It is page cache
  (the reader holds memoryviews into the LMDB map), reclaimable, but it must fit in
  RAM or the buffer's records are read twice.
* ``HDD eff.``: a *model* (not a measurement) of the fraction of a hard disk's
  sequential bandwidth the reader gets: every chunk costs one seek
  (``1 / --hdd-iops`` s) plus ``chunk_size x record bytes / --hdd-mbps``; efficiency =
  transfer time / (transfer + seek).  Measure the real thing with
  ``benchmarks/shuffle_accuracy.py --hdd-throughput`` under ``hddsim``.

Reference rows: an ideal per-epoch permutation, and sequential reading with no
shuffling at all (Loader ``shuffle=False``).  The grid extends the usual
{500, 1000, 5000, 20000} x {64, 256, 1024, 4096} with cache 50000 and chunk 16, to
show what a class-sorted database needs.  The computed recommendation is, per
layout, the cheapest setting (smallest buffer, then longest chunks) with
``distinct >= 0.95``, pair repeat <= 20 x ideal and modelled HDD efficiency >= 95 %
(``--good-distinct``, ``--max-pair-repeat``, ``--min-hdd-eff``).

Default dataset: labels only, ImageNet-like -- 1000 classes x 1300 records (1.3 M),
class-sorted (``np.repeat``) vs a seeded permutation of them (what the writer does).
``--db PATH`` uses a real database's labels instead (in its written order; its mean
record size sets ``buffer``).  Orders are computed once per (cache, chunk) and scored
for both layouts.  Cost: ~0.5 us/record/epoch for the shuffle buffer (a Python loop;
the position -> record mapping is vectorised, in
:func:`seqloader.tools.quality.epoch_order`) plus the
scoring -- the default 1.3 M-record, 5 x 5 grid (caches 500..50000, chunks 16..4096)
took 2.5 min on one (shared) core.  Settings with ``cache`` or ``chunk_size`` above
the record count are skipped.

    python benchmarks/shuffle_quality.py                       # ImageNet-like labels
    python benchmarks/shuffle_quality.py --classes 200 --per-class 1300
    python benchmarks/shuffle_quality.py --db /data/lmdb        # a real database
    python benchmarks/shuffle_quality.py --json > q.json       # JSON on stdout

Writes the Markdown table to ``shuffle_quality.md`` in the current folder (with
``--db``: ``shuffle_quality-<database folder>.md``) and the JSON document next to it
(``.json``; ``--out FILE.md`` to choose, ``--out ''`` to skip) and prints the table (or
the JSON document with ``--json``).  The committed results are replaced only when
asked: ``--out benchmarks/results/shuffle_quality.md``.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from seqloader.read.plan import PlanSpec
from seqloader.tools.quality import distinct_ratio, epoch_correlation, epoch_order

IMAGENET_RECORDS = 1_281_167
IMAGENET_RECORD_BYTES = 110_000
DEFAULT_CACHES = (500, 1000, 5000, 20000, 50000)
DEFAULT_CHUNKS = (16, 64, 256, 1024, 4096)

__all__ = ["pair_repeat", "ideal_pair_repeat", "hdd_efficiency",
           "score", "run_grid", "format_markdown", "main"]


# ----------------------------------------------------------------------------- metrics

def ideal_pair_repeat(n: int, batch_size: int) -> float:
    """Pair repeat of independent uniform permutations: ``(B - 1) / (N - 1)``."""
    return (batch_size - 1) / max(n - 1, 1)


def pair_repeat(a: np.ndarray, b: np.ndarray, batch_size: int) -> float:
    """Of the pairs of records in one full batch of order ``a``, the fraction that are
    in one full batch of order ``b`` again (records missing from either are ignored)."""
    nb_a, nb_b = len(a) // batch_size, len(b) // batch_size
    if nb_a == 0 or nb_b == 0:
        return float("nan")
    size = int(max(a.max(), b.max())) + 1
    batch_a = np.full(size, -1, np.int64)
    batch_a[a[:nb_a * batch_size]] = np.repeat(np.arange(nb_a), batch_size)
    ids = batch_a[b[:nb_b * batch_size]].reshape(nb_b, batch_size)
    ok = ids >= 0
    keys = (np.repeat(np.arange(nb_b), batch_size).reshape(nb_b, batch_size) * nb_a + ids)[ok]
    _, counts = np.unique(keys, return_counts=True)
    repeated = float(np.sum(counts * (counts - 1) // 2))
    total = float(nb_a) * batch_size * (batch_size - 1) / 2
    return repeated / total


def hdd_efficiency(chunk_size: int, record_bytes: float, *, iops: float = 100.0,
                   mbps: float = 150.0) -> float:
    """Modelled fraction of sequential bandwidth: one seek per chunk, then a transfer."""
    transfer = chunk_size * record_bytes / (mbps * 2**20)
    return transfer / (transfer + 1.0 / iops)


def score(label_sets: dict[str, np.ndarray], orders: Sequence[np.ndarray],
          batch_size: int) -> dict[str, Any]:
    """Metrics of consecutive-epoch ``orders`` for every label layout."""
    corr = float(np.mean([epoch_correlation(x, y) for x, y in zip(orders, orders[1:])]))
    rep = float(np.mean([pair_repeat(x, y, batch_size) for x, y in zip(orders, orders[1:])]))
    return {"epoch_correlation": corr, "pair_repeat": rep,
            "distinct_ratio": {name: float(np.mean([distinct_ratio(lab, o, batch_size)
                                                    for o in orders]))
                               for name, lab in label_sets.items()}}


# ----------------------------------------------------------------------------- the grid

def _label_sets(args: argparse.Namespace) -> tuple[dict[str, np.ndarray], float, dict[str, Any]]:
    """(layout name -> labels in record order, mean record bytes, dataset description)."""
    if args.db:
        from seqloader import open_database

        db = open_database(args.db, args.split)
        labels = db.labels()
        shuffled = bool(db.metas[0].shuffled)
        name = "as written (shuffled)" if shuffled else "as written (class-sorted)"
        rec = db.image_bytes / max(len(db), 1)
        return ({name: labels}, rec if args.record_kb is None else args.record_kb * 1000,
                {"source": "database", "path": str(args.db), "split": args.split,
                 "records": len(labels), "classes": int(labels.max()) + 1 if len(labels) else 0,
                 "shuffled_at_write": shuffled})
    sorted_labels = np.repeat(np.arange(args.classes, dtype=np.int64), args.per_class)
    perm = np.random.default_rng(np.random.SeedSequence([args.seed, 0x5EED])).permutation(
        len(sorted_labels))
    rec = IMAGENET_RECORD_BYTES if args.record_kb is None else args.record_kb * 1000
    return ({"class-sorted": sorted_labels, "shuffled at write": sorted_labels[perm]}, rec,
            {"source": "simulated labels", "records": len(sorted_labels),
             "classes": args.classes, "per_class": args.per_class})


def run_grid(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    label_sets, rec_bytes, dataset = _label_sets(args)
    n = len(next(iter(label_sets.values())))
    B = args.batch_size
    if n < 2 * B:
        raise SystemExit(f"{n} records make fewer than 2 batches of {B}; lower --batch-size")
    epochs = list(range(args.epochs))
    grid = [(c, k) for c in args.caches for k in args.chunks if c <= n and k <= n]
    skipped = [(c, k) for c in args.caches for k in args.chunks if (c, k) not in grid]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def add(kind: str, cache: int | None, chunk: int | None, orders: list[np.ndarray],
            seconds: float) -> None:
        s = score(label_sets, orders, B)
        rows.append({"kind": kind, "cache": cache, "chunk_size": chunk, **s,
                     "buffer_mb": None if cache is None else cache * rec_bytes / 1e6,
                     "chunk_mb": None if chunk is None else chunk * rec_bytes / 1e6,
                     "hdd_efficiency_model": None if chunk is None else hdd_efficiency(
                         chunk, rec_bytes, iops=args.hdd_iops, mbps=args.hdd_mbps),
                     "order_seconds": seconds})

    bar = tqdm(total=len(grid) + 2, desc="shuffle quality", unit="setting",
               disable=args.no_progress, file=sys.stderr, dynamic_ncols=True)
    try:
        t = time.perf_counter()
        ideal = [np.random.default_rng(np.random.SeedSequence([args.seed, e, 0x1DEA]))
                 .permutation(n) for e in epochs]
        add("ideal permutation", None, None, ideal, time.perf_counter() - t)
        bar.update(1)
        t = time.perf_counter()
        spec = PlanSpec(shard_sizes=(n,), batch_size=B, chunk_size=max(args.chunks),
                        shuffle=False, seed=args.seed, num_workers=2, even=False)
        add("no shuffle", None, None, [epoch_order(spec, e, cache=1) for e in epochs],
            time.perf_counter() - t)
        bar.update(1)
        for cache, chunk in grid:
            bar.set_postfix(cache=cache, chunk=chunk)
            t = time.perf_counter()
            spec = PlanSpec(shard_sizes=(n,), batch_size=B, chunk_size=chunk, shuffle=True,
                            seed=args.seed, num_workers=2)
            orders = [epoch_order(spec, e, cache=cache) for e in epochs]
            add("seqloader", cache, chunk, orders, time.perf_counter() - t)
            bar.update(1)
    finally:
        bar.close()
    doc = {"conditions": {"date": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "python": platform.python_version(), "platform": platform.platform(),
                          "dataset": dataset, "layouts": list(label_sets),
                          "batch_size": B, "epochs_compared": args.epochs, "seed": args.seed,
                          "record_bytes": rec_bytes, "hdd_iops": args.hdd_iops,
                          "hdd_mbps": args.hdd_mbps,
                          "ideal_pair_repeat": ideal_pair_repeat(n, B),
                          "caches": list(args.caches), "chunks": list(args.chunks),
                          "skipped": [list(s) for s in skipped],
                          "seconds": time.perf_counter() - t0},
           "rows": rows}
    doc["recommendation"] = recommend(doc, good=args.good_distinct,
                                      max_repeat_x=args.max_pair_repeat, min_hdd=args.min_hdd_eff)
    return doc


# ----------------------------------------------------------------------------- report

def recommend(doc: dict[str, Any], *, good: float = 0.95, max_repeat_x: float = 20.0,
              min_hdd: float = 0.95) -> dict[str, Any]:
    """Per layout, the cheapest setting (smallest buffer, then the longest chunks) that
    is good enough: ``distinct >= good``, pair repeat <= ``max_repeat_x`` x ideal and
    modelled HDD efficiency >= ``min_hdd``; when none is, the most diverse setting that
    meets the HDD criterion and the most diverse overall; and how the Loader's
    defaults do."""
    from seqloader.loader import DEFAULT_CACHE, DEFAULT_CHUNK

    c = doc["conditions"]
    max_repeat = max_repeat_x * c["ideal_pair_repeat"]
    rows = [r for r in doc["rows"] if r["kind"] == "seqloader"]
    out: dict[str, Any] = {"criteria": {"distinct_ratio_min": good,
                                        "pair_repeat_max": max_repeat,
                                        "pair_repeat_max_x_ideal": max_repeat_x,
                                        "hdd_efficiency_min": min_hdd},
                           "loader_defaults": {"cache": DEFAULT_CACHE,
                                               "chunk_size": DEFAULT_CHUNK}}
    default = next((r for r in rows if r["cache"] == DEFAULT_CACHE
                    and r["chunk_size"] == DEFAULT_CHUNK), None)

    def brief(r: dict[str, Any] | None, layout: str) -> dict[str, Any] | None:
        if r is None:
            return None
        return {"cache": r["cache"], "chunk_size": r["chunk_size"],
                "distinct_ratio": r["distinct_ratio"][layout], "pair_repeat": r["pair_repeat"],
                "hdd_efficiency_model": r["hdd_efficiency_model"], "buffer_mb": r["buffer_mb"],
                "ok": (r["distinct_ratio"][layout] >= good and r["pair_repeat"] <= max_repeat
                       and r["hdd_efficiency_model"] >= min_hdd)}

    for layout in c["layouts"]:
        ok = [r for r in rows if brief(r, layout)["ok"]]
        best = min(ok, key=lambda r: (r["cache"], -r["chunk_size"])) if ok else None
        top = max(rows, key=lambda r: r["distinct_ratio"][layout]) if rows else None
        fast = [r for r in rows if r["hdd_efficiency_model"] >= min_hdd]
        top_fast = max(fast, key=lambda r: r["distinct_ratio"][layout]) if fast else None
        out[layout] = {"cheapest_ok": brief(best, layout), "best_distinct": brief(top, layout),
                       "best_distinct_hdd_ok": brief(top_fast, layout),
                       "defaults": brief(default, layout)}
    return out


def _f(v: Any, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def format_markdown(doc: dict[str, Any]) -> str:
    c = doc["conditions"]
    d = c["dataset"]
    layouts = c["layouts"]
    desc = (f"`{d['path']}` ({d['records']:,} records, {d['classes']} classes)"
            if d["source"] == "database" else
            f"simulated labels, {d['classes']} classes x {d['per_class']} "
            f"= {d['records']:,} records")
    lines = [
        "# Shuffle quality vs shuffle buffer (`cache`) and `chunk_size`",
        "",
        f"Dataset: {desc}; batch {c['batch_size']}; one rank; epochs 0..{c['epochs_compared'] - 1} "
        f"compared; seed {c['seed']}; record size {c['record_bytes'] / 1e3:.0f} KB "
        f"(buffer memory = cache x record size); HDD model {c['hdd_iops']:g} seeks/s, "
        f"{c['hdd_mbps']:g} MiB/s. Computed from the epoch plan in {c['seconds']:.0f} s "
        f"({c['date']}).",
        "",
        f"`distinct` = distinct labels per batch / ideal (1 = ideal); `epoch corr` = Spearman "
        f"correlation of positions in consecutive epochs (0 = ideal); `pair repeat` = share of "
        f"same-batch pairs that share a batch again next epoch (ideal "
        f"{100 * c['ideal_pair_repeat']:.3f} %); `HDD eff.` = modelled share of sequential "
        "bandwidth (one seek per chunk). The last three do not depend on the layout.",
        "",
        "| order | cache | chunk | buffer MB | chunk MB | "
        + " | ".join(f"distinct ({x})" for x in layouts)
        + " | epoch corr | pair repeat % | HDD eff. |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(layouts) + "---:|---:|---:|",
    ]
    for r in doc["rows"]:
        cells = [r["kind"], _f(r["cache"], ","), _f(r["chunk_size"], ","),
                 _f(r["buffer_mb"], ",.0f"), _f(r["chunk_mb"], ",.1f")]
        cells += [f"{r['distinct_ratio'][x]:.3f}" for x in layouts]
        cells += [f"{r['epoch_correlation']:+.3f}", f"{100 * r['pair_repeat']:.3f}",
                  "–" if r["hdd_efficiency_model"] is None
                  else f"{100 * r['hdd_efficiency_model']:.0f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    if c["skipped"]:
        lines += ["", f"Skipped (cache or chunk above the record count): {c['skipped']}"]
    rec = doc["recommendation"]
    crit = rec["criteria"]
    dflt = rec["loader_defaults"]
    lines += ["", "## Recommendation (computed)", "",
              f"Good enough = distinct >= {crit['distinct_ratio_min']}, pair repeat <= "
              f"{crit['pair_repeat_max_x_ideal']:g} x ideal ({100 * crit['pair_repeat_max']:.3f} %) "
              f"and modelled HDD efficiency >= {100 * crit['hdd_efficiency_min']:.0f} %; "
              "cheapest = smallest buffer, then longest chunks.", ""]

    def desc(b: dict[str, Any]) -> str:
        return (f"cache {b['cache']:,}, chunk {b['chunk_size']:,} (distinct "
                f"{b['distinct_ratio']:.3f}, pair repeat {100 * b['pair_repeat']:.3f} %, "
                f"HDD eff. {100 * b['hdd_efficiency_model']:.0f} %, buffer {b['buffer_mb']:,.0f} MB)")

    for layout in layouts:
        r = rec[layout]
        if r["cheapest_ok"]:
            txt = "cheapest good setting: " + desc(r["cheapest_ok"])
        elif r["best_distinct"]:
            txt = "no setting of the grid is good enough; most diverse: " + desc(r["best_distinct"])
            if r["best_distinct_hdd_ok"]:
                txt += (f"; most diverse with HDD eff. >= {100 * crit['hdd_efficiency_min']:.0f} %: "
                        + desc(r["best_distinct_hdd_ok"]))
        else:
            txt = "no setting computed"
        if r["defaults"] is not None:
            txt += (f"; the Loader defaults (cache {dflt['cache']:,}, chunk "
                    f"{dflt['chunk_size']:,}): {'good enough' if r['defaults']['ok'] else 'NOT good enough'}"
                    f" (distinct {r['defaults']['distinct_ratio']:.3f})")
        lines.append(f"* **{layout}**: {txt}.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- CLI

def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return vals


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the option help; the module docstring, as written, as the description."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    p.add_argument("--classes", type=int, default=1000, help="simulated classes")
    p.add_argument("--per-class", type=int, default=1300, help="simulated records per class")
    p.add_argument("--db", type=Path, default=None,
                   help="use this database's labels (folder or .lmdb) instead of simulated ones")
    p.add_argument("--split", default="train", help="split of --db")
    p.add_argument("--caches", type=_ints, default=list(DEFAULT_CACHES),
                   help="shuffle-buffer sizes (records), comma-separated")
    p.add_argument("--chunks", type=_ints, default=list(DEFAULT_CHUNKS),
                   help="chunk sizes (records), comma-separated")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2,
                   help="consecutive epochs to compute (>= 2; metrics are averaged)")
    p.add_argument("--seed", type=int, default=0, help="Loader seed and layout permutation seed")
    p.add_argument("--record-kb", type=float, default=None,
                   help="mean record size in KB (1000 bytes) for the memory/HDD columns "
                        "[default: 110 for simulated labels, the database's mean with --db]")
    p.add_argument("--hdd-iops", type=float, default=100.0, help="HDD model: seeks per second")
    p.add_argument("--hdd-mbps", type=float, default=150.0, help="HDD model: MiB/s sequential")
    p.add_argument("--good-distinct", type=float, default=0.95,
                   help="recommendation: minimum distinct ratio")
    p.add_argument("--max-pair-repeat", type=float, default=20.0,
                   help="recommendation: maximum pair repeat, in multiples of the ideal")
    p.add_argument("--min-hdd-eff", type=float, default=0.95,
                   help="recommendation: minimum modelled HDD efficiency (0..1)")
    p.add_argument("--out", default=None,
                   help="Markdown output file, plus the JSON with suffix .json ('' = do not "
                        "write; default ./shuffle_quality.md, or with --db "
                        "./shuffle_quality-<database folder>.md)")
    p.add_argument("--json", action="store_true",
                   help="print the JSON document (conditions, rows, recommendation) on stdout "
                        "instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.epochs < 2:
        raise SystemExit("--epochs must be >= 2 (epoch correlation compares consecutive epochs)")
    if args.batch_size < 2:
        raise SystemExit("--batch-size must be >= 2")
    doc = run_grid(args)
    md = format_markdown(doc)
    if args.out is None:
        args.out = ("shuffle_quality.md" if args.db is None
                    else f"shuffle_quality-{args.db.resolve().name}.md")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(md)
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(md)
    return doc


if __name__ == "__main__":
    main()
