"""Is the training data-bound, and which stage limits it?  The diagnosis of a window of
the pipeline's counters (NOTE [ pipeline counters ] in :mod:`seqloader.dataflow.stats`),
for the Loader's once-per-epoch warning and ``seqloader bench``.

NOTE [ the limiting stage ]
The caller waits inside ``next()`` only when no decoded batch is ready.  Then one of
three stages is behind, and its counters show it:
* **decoding**: the workers are busy (>= ``BUSY`` of their wall time): each batch is
  decoded as soon as its records arrive, and the feed thread waits for free buffers;
* **reading**: the feed thread is busy getting records (the disk, the network, the
  shuffle buffer) while the workers idle -- ``blocked`` (its wall time minus its CPU
  time) says how much of that is waiting for I/O;
* **delivery**: the main process itself copies, pins or moves each batch.
When none is saturated the machine is shared (other processes take the cores), or the
prefetch is too shallow for uneven batches.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .stats import Snapshot

__all__ = ["Diagnose", "Diagnosis", "DataWaitWarning", "diagnose", "BUSY"]

#: A stage at or above this share of its time busy is saturated.
BUSY = 0.75


class DataWaitWarning(UserWarning):
    """The training loop waited for data (once per epoch; silence it with
    ``Loader(diagnose=None)`` or ``warnings.simplefilter("ignore", DataWaitWarning)``)."""


@dataclass(frozen=True)
class Diagnose:
    """When the Loader warns: the caller waited more than ``share`` (0-1) of the wall time
    over the last ``window`` batches (the first batch of an epoch, the start-up, is not
    counted: ``stats()["first_batch_s"]`` reports it)."""

    share: float = 0.10
    window: int = 50

    def __post_init__(self) -> None:
        if not 0 <= self.share < 1:
            raise ValueError(f"Diagnose share must be a fraction in [0, 1), got {self.share!r}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"Diagnose window must be a number of batches >= 1, got "
                             f"{self.window!r}")


@dataclass(frozen=True)
class Diagnosis:
    """``stage``: ``"decoding"``, ``"reading"``, ``"delivery"`` or ``"none"`` (nothing
    saturated); ``wait_share``: the caller's wait over the window (0-1); ``message``:
    one line with the figures and the change that helps."""

    stage: str
    wait_share: float
    message: str

    def __str__(self) -> str:
        return self.message


def cores() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def diagnose(d: Snapshot, *, workers: int, gpu: bool = False, remote: bool = False,
             ncores: int | None = None) -> Diagnosis:
    """The limiting stage over the counts ``d`` (a window's difference of snapshots):
    NOTE [ the limiting stage ]."""
    ncores = cores() if ncores is None else ncores
    wall = max(d.t, 1e-9)
    wait = d.waited_s / wall
    rate = d.images / wall
    demand = d.images / max(wall - d.waited_s, 1e-9)  # what the caller would take
    busy = d.work_s / (max(1, workers) * wall)
    read_busy = (d.read_s + d.copy_s) / wall
    blocked = max(0.0, d.read_s + d.copy_s - d.feed_cpu_s) / wall
    per_cpu = d.work_images / d.work_cpu_s if d.work_cpu_s > 0 else 0.0
    asks = ("the training loop waits for every batch" if wait > 0.9 else
            f"the model asks for {demand:.0f}" if wait > 0.02 else "the model takes them all")
    gpu_hint = "" if gpu else " or decode='gpu'"
    if workers == 0:
        return Diagnosis("decoding", wait, f"decoding: the main process decodes "
                         f"(num_workers=0) at {rate:.0f} img/s; {asks}; set num_workers "
                         f"({ncores} cores here)")
    if busy >= BUSY and busy >= read_busy:
        more = (f"raise num_workers ({ncores} cores here){gpu_hint}" if workers < ncores
                else f"every core already decodes ({ncores} here): a larger machine{gpu_hint}"
                     ", or data stored at a lower resolution")
        return Diagnosis("decoding", wait, f"decoding: {workers} workers at {busy:.0%} busy "
                         f"deliver {rate:.0f} img/s ({per_cpu:.0f} img per CPU-second); "
                         f"{asks}; {more}")
    if read_busy >= BUSY:
        where = "the network" if remote else "the disk"
        fix = ("a bigger remote cache (RemoteOptions cache_dir, cache_bytes), larger GETs or a "
               "faster link" if remote else
               "a faster disk, io='direct' on a cold disk, or data stored at a lower resolution")
        if blocked < 0.5 * read_busy:
            fix = ("the reader thread is short of CPU (a smaller shuffle warm-up, fewer "
                   "workers than cores)")
        return Diagnosis("reading", wait, f"reading: the reader gives {d.read_bytes / wall / 1e6:.0f}"
                         f" MB/s ({rate:.0f} img/s), busy {read_busy:.0%} of the time, "
                         f"{blocked:.0%} blocked on {where}; the workers idle ({busy:.0%} busy); "
                         f"{asks}; {fix}")
    share = d.deliver_s / wall
    if share >= 0.5 * wait and share > 0.02:
        return Diagnosis("delivery", wait, f"delivery: the main process spends {share:.0%} of "
                         "the time copying, pinning or moving batches; keep CPU batches as views "
                         "(pin_memory=False) or send uint8 (output='uint8')")
    on_cpu = d.work_cpu_s / d.work_s if d.work_s > 0 else 0.0
    why = (f"other processes take the cores (the workers ran on a core {on_cpu:.0%} of the "
           "time they were decoding)" if on_cpu < 0.7 else
           "batches are uneven for a shallow queue: raise prefetch")
    return Diagnosis("none", wait, f"no stage saturated (workers {busy:.0%} busy, reader "
                     f"{read_busy:.0%}): {why}")
