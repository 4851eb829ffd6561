"""Write a scanned split into seqloader LMDB file(s): seeded order, streaming, resumable.

NOTE [ crash-safe, resumable writes ]
Each shard is written to ``<file>.partial`` and renamed to ``<file>`` only after
its final metadata (``complete=True``) is committed and synced.  Every commit
(about ``commit_bytes`` of records) also rewrites the metadata with the writer's
progress: the next source position, the record count, the checksum chain state
and the bad files so far.  LMDB commits are atomic, so after Ctrl-C or
``kill -9`` the partial file holds exactly the records of its last commit and
the progress that matches them.  Re-running the same command checks the plan's
fingerprint (sources, order, options) and continues from there; the write order
and the per-image processing are deterministic, so the result is byte-for-byte
the records of an uninterrupted run.  A complete file is never replaced without
``overwrite``; a complete shard with the same fingerprint is skipped (so a
multi-shard run resumes at its first unfinished shard) -- unless ``strict`` is asked
for and it (or the partial file being resumed) skipped bad files: that is an error.
``overwrite`` removes the old files only once it holds the writer's lock on
``<file>.partial``, so never under another run still writing it.  The bad-files
report ``<file>.bad-files.tsv`` is written (atomically) before the rename, so a
complete file never lacks it.

NOTE [ drop-behind ]
Once a commit is on disk (LMDB syncs every commit), the writer tells the kernel it
will not read those records' pages again (``posix_fadvise(DONTNEED)`` over the
whole pages inside the span of the commit's records; the meta pages at the start
of the file are never in it, and a B-tree page in it that LMDB needs again is read
back).  Writing a 140 GB split would otherwise fill the page cache with output
nobody reads soon, evicting what other jobs on the host -- a training run, say --
have cached.  It is also
cheaper: the next commit's pages are allocated from the ones just freed instead of
fresh memory.  On this benchmark VM, whose never-touched memory costs a hypervisor
fault on first use, the commit thread's CPU for a 1 GB split fell from ~2.9 to
~1.7 s of system time (warm 10,000-image runs: 6.4-6.8 s instead of 6.8-8.0 s).
The cost: a database written just now is read from disk, not from the cache, by
the first pass over it.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..format.files import shard_files, shard_path
from .scan import Scan
from ..errors import BadImageError, NoRecordsError, OutputExistsError
from .outfiles import (bad_files_said, lock_file, partials, remove_db, remove_partial,
                       report_path)
# (the options and reports are re-exported: the writer's public names)
from .options import ShardResult, WriteOptions, WriteReport, scan_fingerprint, write_order
from .shardwriter import Feed, ShardWriter, existing_result

__all__ = ["WriteOptions", "ShardResult", "WriteReport", "BadImageError", "NoRecordsError",
           "write_split", "write_order", "no_records_message"]


def write_split(scan: Scan, out: str | Path, split: str,
                options: WriteOptions | None = None, *, order: np.ndarray | None = None,
                feed: Feed | None = None) -> WriteReport:
    """Write ``scan`` to ``out`` (a ``.lmdb`` file path; with ``options.shards > 1``,
    to ``<stem>-SSSSS-of-NNNNN.lmdb`` beside it).

    Streams: memory is bounded by ``commit_bytes`` plus the in-flight images,
    whatever the dataset size.  Resumable and crash-safe (see NOTE [ crash-safe,
    resumable writes ]).  Raises :class:`FileExistsError` rather than replacing a
    complete database written differently (pass ``overwrite``), and
    :class:`BadImageError` in ``strict`` mode, after removing what this call wrote, and
    :class:`NoRecordsError` when no image could be stored (NOTE [ no records, no database ]).
    ``order`` replaces the seeded permutation of ``scan`` (it must be one fixed by the
    command, e.g. :mod:`~seqloader.write.extshuffle`'s); ``feed`` gives the prepared
    records of positions of ``order`` instead of reading ``scan``'s files.
    """
    opt = options or WriteOptions()
    out = Path(out)
    if len(scan) == 0:
        raise ValueError(f"split {split!r} at {scan.root} has no images; nothing to write")
    if opt.shards > len(scan):
        raise ValueError(f"--shards {opt.shards} is more than the {len(scan)} images of "
                         f"split {split!r}; use at most {len(scan)}")
    if order is None:
        order = write_order(len(scan), seed=opt.seed, shuffle=opt.shuffle)
    fingerprint = scan_fingerprint(scan, split, order, opt)
    bounds = [round(k * len(scan) / opt.shards) for k in range(opt.shards + 1)]
    # the split in another layout (one file vs shards, another shard count) would be
    # what readers open, or make them fail: replace it only when told to
    ours = {shard_path(out, k, opt.shards) for k in range(opt.shards)}
    others = sorted(p for p in {out, *shard_files(out)} - ours if p.exists())
    if others and not opt.overwrite:
        raise OutputExistsError(f"{others[0]} holds split {split!r} in another layout "
                                f"({len(others)} file(s); this command writes {opt.shards}); pass "
                                "--overwrite to replace them, or choose another output folder")
    for p in others:
        remove_db(p)
        report_path(p).unlink(missing_ok=True)
    # an unfinished write in another layout: up to the whole split's size of disk
    mine = {p.with_name(p.name + ".partial") for p in ours}
    stale = sorted(p for p in partials(out) if p not in mine)
    if stale and not opt.overwrite:
        raise OutputExistsError(f"{stale[0]} is an unfinished write of split {split!r} in "
                                f"another layout (this command writes {opt.shards} file(s)); "
                                "re-run the command that started it to finish it, or pass "
                                "--overwrite to remove it")
    for p in stale:
        remove_partial(p)
    report = WriteReport(split)
    written: list[Path] = []
    for k in (opt.shard_ids if opt.shard_ids is not None else range(opt.shards)):
        final = shard_path(out, k, opt.shards)
        partial = final.with_name(final.name + ".partial")
        if final.exists() and not opt.overwrite:  # (with overwrite, removed under the lock)
            report.shards.append(existing_result(final, fingerprint, scan, opt))
            lock_file(partial).unlink(missing_ok=True)  # (a kill between rename and unlink)
            continue
        writer = ShardWriter(scan, split, order, final, k, fingerprint, opt, feed)
        try:
            report.shards.append(writer.run(bounds[k], bounds[k + 1]))
        except BadImageError:
            remove_db(partial)
            for p in written:
                remove_db(p)
            raise
        written.append(final)
    if report.shards and report.num_records == 0:  # NOTE [ no records, no database ]
        for r in report.shards:
            remove_db(r.path)
        raise NoRecordsError(no_records_message(report, split))
    if report.bad_files or report.warned_files:
        reports = [str(report_path(r.path)) for r in report.shards
                   if r.bad_files or r.warned_files]
        said = bad_files_said(len(report.bad_files), len(report.warned_files))
        warnings.warn(f"{split}: {said}; see {', '.join(reports[:3])}"
                      f"{f' (+{len(reports) - 3} more)' if len(reports) > 3 else ''}", stacklevel=2)
    return report


# NOTE [ no records, no database ]
# A split whose every source failed (all undecodable: e.g. Git LFS pointers, HEIC files
# named .jpg, a wrong folder) would otherwise be a complete database of 0 records: the
# command succeeds and `verify` passes, and the failure only shows when training starts
# -- far from its cause.  So it is an error here, naming the reports and the first
# reasons, and the empty files (this run's, or an earlier version's that this run
# would have skipped as complete) are removed: no file that looks complete is left.
# The reports stay: they are the diagnosis.  (With --shard-ids, the rule applies to
# the shards this run writes.)


def no_records_message(report: WriteReport, split: str) -> str:
    bad = report.bad_files
    reports = [str(report_path(r.path)) for r in report.shards if r.bad_files]
    first = "; ".join(f"{path}: {why}" for path, why in bad[:3])
    return (f"split {split!r}: none of its {len(bad)} image(s) could be read and decoded, so "
            f"no database was written (it would have 0 records). The reasons are listed in "
            f"{', '.join(reports[:3])}{' ...' if len(reports) > 3 else ''}; the first: {first}"
            f"{f' (and {len(bad) - 3} more)' if len(bad) > 3 else ''}. Check that the folder holds the real images "
            "(not placeholders, e.g. Git LFS pointers), fix or replace them, and re-run")
