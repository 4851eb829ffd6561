"""``seqloader bench``: measure loading throughput in modes that separate the costs.

    seqloader bench PATH [--split train] [--loader seqloader|files|both] [--files DIR]
                         [--mode raw|decode|full|cpu-limit|all] [--workers 1,2,4]
                         [--batch-size 256] [--batches N] [--seconds S] [--warmup 2]
                         [--cache 5000] [--cold] [--quality] [--json] [--no-progress]

(also ``python -m seqloader.tools.bench ...``).  ``PATH`` is a database (a ``.lmdb`` file,
one shard of a set, or the folder holding ``ILSVRC-<split>.lmdb``) or, for
``--loader files``, a class-folder tree (``<dir>/<class>/<image>``, or an ImageNet
root holding ``<split>/``).  With a database ``PATH``, ``--files DIR`` names the
tree the files loader reads (the same images as individual files).

Loaders
    ``seqloader``  :class:`seqloader.Loader` (shuffle=True, its fused pipeline for
                   the ImageNet recipe, used automatically).
    ``files``      a ``torch.utils.data.DataLoader`` (shuffle=True, persistent
                   workers, same ``num_workers``/batch size) over one file per image,
                   decoded with the same OpenCV code (``decode_rgb``) and the same
                   (unfused) seqloader transforms; see :mod:`seqloader.tools.bench.filesloader`.
Modes
    ``raw``        read and batch the encoded bytes, no decode (seqloader
                   ``transform=None``; files: read each file, list collate).
    ``decode``     full-resolution decode plus a 64 px centre crop (``CenterCrop(64)``,
                   negligible next to the decode; needed for fixed-size batches).
    ``full``       the ImageNet training transform: RandomResizedCrop(224) +
                   RandomHorizontalFlip + ToTensor + Normalize(ImageNet mean/std).
    ``cpu-limit``  no loader: :func:`cpu_limit`, the ``full`` decode+transform code
                   run by one process over 3,000 records held in memory;
                   ``images_per_s`` = per-process rate x min(workers, usable cores).
    ``all``        raw, decode and full.

Measured per (loader, mode, workers), after ``--warmup`` batches (excluded):
images/s and MB/s of encoded bytes (exact for raw and for files; for seqloader
decode/full, images x the database's mean encoded size: ``bytes_exact`` false);
time to first batch (from constructing the loader and calling ``iter()`` to the
first batch: includes worker start-up and shuffle-buffer fill); peak memory of the
process tree (the main process and every process it starts during the run,
sampled from ``/proc/<pid>/smaps_rollup`` every 1 s: sums of Rss, Pss,
USS = Private_Clean + Private_Dirty, and Anonymous); CPU utilisation (utime+stime
of the tree over the measured wall time, in % of one core).  Rss/Pss/USS include
file pages a process has mapped (seqloader's workers map the database, so pages of
it they touched count, as reclaimable page cache); Anonymous is the part the
kernel cannot drop.  MB = 10^6 bytes everywhere.  Measuring stops after
``--batches`` measured batches or ``--seconds`` measured seconds, whichever comes
first (default: 20 s); both loaders loop over epochs if the data runs out.

``--cold`` evicts the data's pages from the page cache before each run, without
root: ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every database file or image
file.  Residency is checked with ``mincore`` (every page of a database, a sample of
up to 2000 image files); it is only knowable for files you own or may write
(Linux >= 5.2), else reported as null.  Pages mapped by another process, and
directory/inode caches, cannot be dropped this way.  Before evicting, each cold run
is rehearsed for one batch (same loader and settings; results discarded) so the
*code* it runs -- OpenCV's decoder, torch's tensor conversion, worker start-up -- is
in the page cache, as it is on a machine whose libraries live on another disk than
the data: the cold run then measures the data's disk, not first-use faults in
shared libraries (under ``hddsim`` those share the throttled disk and each costs a
``read_ahead_kb`` read).  ``--no-rehearsal`` skips it.

JSON (``--json``; the only thing printed to stdout)::

    {"conditions": {
        "date", "hostname", "kernel", "platform", "python", "seqloader_version",
        "torch_version", "opencv_version", "cpu_model", "cpu_count", "cpu_affinity",
        "mem_total_mb", "mem_available_mb", "loaders": [str], "modes": [str],
        "workers": [int], "batch_size", "warmup", "batches", "seconds",
        "cache_state": "warm"|"cold", "cold_method", "seqloader_cache", "seed",
        "start_method", "split", "images", "mean_encoded_bytes",
        "mean_resolution": [height, width], "units", "notes": [str],
        "database": null | {"path", "files", "num_records", "num_classes",
                            "size_mb", "image_mb", "fits_in_ram", "storage", "sample"},
        "files":    null | {"root", "num_images", "num_classes", "scan_s",
                            "excluded_bad_files", "size_mb_estimate", "storage", "sample"}},
     "results": [{"loader", "mode", "workers", "batch_size", "images", "batches",
                  "seconds", "images_per_s", "mb_per_s", "bytes", "bytes_exact",
                  "first_batch_s", "peak_rss_mb", "peak_pss_mb", "peak_uss_mb",
                  "peak_anon_mb", "base_rss_mb", "base_pss_mb", "peak_processes",
                  "cpu_percent" (null under 1 s), "cpu_seconds", "cores", "cold": bool, "evicted",
                  "resident_before", "pipeline", "stopped", "warmup_batches", "epochs",
                  "per_process_images_per_s", "scale", "rehearsal_first_batch_s"
                  (first batch of the --cold rehearsal, else null), "disk_mb_per_s" (what
                  the data's block device delivered over the measured window, from
                  sysfs: the disk's view, which a read-ahead window or a shuffle buffer
                  cannot inflate), "major_faults" (page faults served from disk in the
                  window, machine-wide), "sample_records", "sample_mean_bytes",
                  "data_mean_bytes" (cpu-limit: the records it decoded in memory, their
                  mean size and the data's, NOTE [ a representative sample ]), "io"
                  (seqloader rows: "buffered" or "direct", how the reader read)
                  [, "leftover_processes"]}, ...],
     "quality": null | {"seqloader": [{"workers", "distinct_ratio",
                                       "epoch_correlation", "batch_size",
                                       "cache_per_reader", "chunk_size"} | {"workers", "error"}],
                        "files": null | {"distinct_ratio", "epoch_correlation"} | {"error"}}}

``sample`` = ``{"n", "mean_bytes", "mean_height", "mean_width", "mean_megapixels"}``
from ~100 records spread over the data; ``storage`` = ``{"mount", "device",
"fstype", "rotational"}`` (best effort, null where unknown).  Rows are ordered
loader, mode, workers; fields that do not apply (e.g. ``first_batch_s`` of
``cpu-limit``) are null.

Library use: :func:`measure` (any iterable of batches) and :func:`cpu_limit`.

Modules: ``command`` (the arguments, the runs in order, the document's conditions and
quality), ``runs`` (the modes, one run into a result row, ``cpu-limit``), ``measure``
(the timing loop), ``machine`` (the host and the process tree's CPU and memory), ``cache``
(page-cache residency, eviction), ``data`` (what the runs read, described), ``report``
(the human-readable table), ``filesloader`` (the files loader).
"""
from .command import add_bench_arguments, bench, main, run_bench
from .cache import evict, residency
from .runs import cpu_limit
from .measure import measure
from .runs import LOADERS, MODES, decode_transform, imagenet_train_transform
from .machine import process_tree
from .report import format_report
from .runs import RESULT_KEYS

__all__ = ["add_bench_arguments", "run_bench", "main", "bench", "format_report", "measure",
           "cpu_limit", "evict", "residency", "process_tree", "imagenet_train_transform",
           "decode_transform", "MODES", "LOADERS", "RESULT_KEYS"]
