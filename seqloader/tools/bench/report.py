"""The human-readable report of a ``seqloader bench`` JSON document."""
from __future__ import annotations

from typing import Any

__all__ = ["format_report"]


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return format(v, spec) if spec else str(v)


def _cache_cell(r: dict[str, Any]) -> str:
    state = "cold" if r["cold"] else ("memory" if r["mode"] == "cpu-limit" else "warm")
    if r.get("resident_before") is not None:
        state += f" {100 * r['resident_before']:.0f}%"
    elif r.get("evicted"):
        state += " (evicted with fadvise; residency unknown)"
    return state


def format_report(doc: dict[str, Any]) -> str:
    """The human-readable report of a :func:`run_bench` JSON document."""
    c = doc["conditions"]
    lines = [f"seqloader bench  {c['date']}  host {c['hostname']}  {c['kernel']}",
             f"  seqloader {c['seqloader_version']}, Python {c['python']}, torch "
             f"{c['torch_version']}, OpenCV {c['opencv_version']}",
             f"  CPU: {c['cpu_affinity']} usable core(s) (os.cpu_count {c['cpu_count']}), "
             f"{c['cpu_model'] or 'unknown model'}; RAM {_fmt(c['mem_total_mb'])} MB "
             f"({_fmt(c['mem_available_mb'])} MB available)"]
    d, f = c["database"], c["files"]
    if d:
        st = d["storage"]
        lines.append(f"  database: {d['path']} ({c['split']}): {d['num_records']} records, "
                     f"{d['num_classes']} classes, {d['size_mb']:.1f} MB on disk"
                     f"{' (fits in RAM)' if d['fits_in_ram'] else ' (larger than RAM)'}; "
                     f"{_storage_str(st)}")
    if f:
        lines.append(f"  files: {f['root']}: {f['num_images']} images, {f['num_classes']} "
                     f"classes, ~{f['size_mb_estimate']:.1f} MB (scan {f['scan_s']:.2f} s); "
                     f"{_storage_str(f['storage'])}")
        if f.get("excluded_bad_files"):
            lines.append(f"    ({f['excluded_bad_files']} file(s) left out: the ones "
                         "preprocessing skipped as bad, listed in the database)")
    for name, info in (("database", d), ("files", f)):
        if info:
            s = info["sample"]
            lines.append(f"  {name} sample of {s['n']}: mean {_fmt(s['mean_bytes'], '.0f')} "
                         f"bytes encoded, mean {_fmt(s['mean_width'], '.0f')}x"
                         f"{_fmt(s['mean_height'], '.0f')} px (w x h)")
    stop = " or ".join(x for x in (f"{c['batches']} batches" if c["batches"] else "",
                                   f"{c['seconds']:g} s" if c["seconds"] else "") if x)
    workers = ",".join(map(str, c["workers"]))
    lines.append(f"  runs: batch size {c['batch_size']}, workers {workers}, "
                 f"warm-up {c['warmup']} batch(es), then {stop or 'one pass'}; page cache "
                 f"{c['cache_state']}; seqloader cache {c['seqloader_cache']} records; start "
                 f"method {c['start_method']}")
    lines.append(f"  {c['units']}; first batch includes loader construction and worker "
                 "start-up; CPU % of one core")
    head = (f"{'loader':<10} {'mode':<9} {'wk':>3} {'images/s':>9} {'MB/s':>8} {'1st s':>6} "
            f"{'RSS MB':>7} {'PSS MB':>7} {'USS MB':>7} {'CPU %':>6} {'batches':>7} "
            f"{'images':>7}  cache")
    lines += ["", head, "-" * len(head)]
    for r in doc["results"]:
        mbs = _fmt(r["mb_per_s"], ".1f") + ("" if r["bytes_exact"] else "*")
        lines.append(
            f"{r['loader']:<10} {r['mode']:<9} {r['workers']:>3} "
            f"{_fmt(r['images_per_s'], '.1f'):>9} "
            f"{mbs:>8} {_fmt(r['first_batch_s'], '.2f'):>6} {_fmt(r['peak_rss_mb'], '.0f'):>7} "
            f"{_fmt(r['peak_pss_mb'], '.0f'):>7} {_fmt(r['peak_uss_mb'], '.0f'):>7} "
            f"{_fmt(r['cpu_percent'], '.0f'):>6} {_fmt(r['batches']):>7} {_fmt(r['images']):>7}  "
            f"{_cache_cell(r)}")
        if r["mode"] == "cpu-limit":
            lines[-1] += (f"  ({r['per_process_images_per_s']:.1f}/s per process x "
                          f"{r['scale']})")
        if "no workers" in (r.get("pipeline") or ""):
            lines[-1] += "  (no worker processes)"
        if r.get("leftover_processes"):
            lines[-1] += f"  (!) processes left: {r['leftover_processes']}"
    lines.append("* estimated: images x mean encoded size.  cache: state and % of the data's "
                 "pages resident before the run (mincore; '-' if unknown)")
    found = [r for r in doc["results"] if r.get("diagnosis")]
    if found:  # (the Loader's diagnosis over each run's last batches: no model waits here)
        lines += ["", "limiting stage (seqloader runs, over their last batches):"]
        lines += [f"  {r['mode']} w={r['workers']}: {r['diagnosis']}" for r in found]
    q = doc.get("quality")
    if q:
        lines.append("")
        lines.append("shuffle quality (1.0 / 0.0 = a uniform per-epoch shuffle): "
                     "distinct-labels ratio, epoch-to-epoch correlation")
        for row in q.get("seqloader") or []:
            if "error" in row:
                lines.append(f"  seqloader workers {row['workers']}: {row['error']}")
            else:
                lines.append(f"  seqloader workers {row['workers']}: {row['distinct_ratio']:.3f}, "
                             f"{row['epoch_correlation']:.3f} (shuffle buffer "
                             f"{row['cache_per_reader']} "
                             f"records, chunk {row['chunk_size']})")
        if q.get("files"):
            fq = q["files"]
            lines.append(f"  files (uniform): {fq['error']}" if "error" in fq else
                         f"  files (uniform): {fq['distinct_ratio']:.3f}, "
                         f"{fq['epoch_correlation']:.3f}")
    return "\n".join(lines)


def _storage_str(st: dict[str, Any]) -> str:
    rot = {True: "rotational", False: "non-rotational",
           None: "rotational unknown"}[st["rotational"]]
    return f"{st['fstype'] or '?'} on {st['device'] or '?'} ({rot})"

