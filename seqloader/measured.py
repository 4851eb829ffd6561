"""The Loader's figures while it runs: :meth:`Measured.stats`, :meth:`Measured.diagnosis`
and the once-per-epoch :class:`~seqloader.dataflow.diagnosis.DataWaitWarning` (NOTE
[ pipeline counters ] in :mod:`seqloader.dataflow.stats`, NOTE [ the limiting stage ] in
:mod:`seqloader.dataflow.diagnosis`), as a mixin of :class:`~seqloader.loader.Loader`."""
from __future__ import annotations

import time
import warnings
from typing import Any

from .dataflow.diagnosis import DataWaitWarning, Diagnose, Diagnosis, diagnose
from .dataflow.stats import LoaderMeter

__all__ = ["Measured"]


class Measured:
    """What the Loader's figures need from it: ``_meter`` (a
    :class:`~seqloader.dataflow.stats.LoaderMeter`), ``_diagnose`` (a
    :class:`~seqloader.dataflow.diagnosis.Diagnose` or None), ``_warned`` (the epoch
    warned about), ``settings``, ``_stages`` and ``db``."""

    _meter: LoaderMeter
    _diagnose: Diagnose | None
    _warned: int | None
    settings: Any
    _stages: Any
    db: Any

    def _counted(self, images: int, asked: float, got: float) -> None:
        """Count a batch the caller asked for at ``asked`` and the pipeline had ready at
        ``got`` (delivered since); warn once per epoch when the window says the caller
        waits (NOTE [ the limiting stage ])."""
        meter = self._meter
        now = time.perf_counter()
        meter.batch(images, now - asked, now - got)
        d = self._diagnose
        if d is not None and self._warned != meter.current.epoch and meter.waited_over(d.share):
            self._warned = meter.current.epoch
            found = self.diagnosis()
            warnings.warn(f"seqloader: the training loop waited for data {found.wait_share:.0%} "
                          f"of the time over the last {d.window} batches -- {found.message} "
                          "(Loader(diagnose=None) silences this)", DataWaitWarning, stacklevel=5)

    def stats(self, last: bool = False) -> dict[str, float]:
        """Figures of the epoch in progress (between epochs: of the last one), or with
        ``last`` of the last epoch that ended, as a flat dict of numbers --
        loggable as it is (TensorBoard ``add_scalars``, Lightning ``log_dict``, a tqdm
        postfix; :func:`~seqloader.dataflow.stats.format_stats` prints it as one line).
        Keys (:data:`~seqloader.dataflow.stats.STAT_KEYS`, docs/loader.md): the batches,
        images and rate; the wait inside ``next()`` (``wait_share``, per-batch p50/p95);
        ``first_batch_s``; each stage's share of the time (fractions, 0-1, of the wall
        time since the epoch's first ``next()``); the shuffle buffer's fill, the free
        batch buffers, a remote cache's hit rate.  Empty before the first iteration.
        :func:`seqloader.format_stats` prints it as one line; docs/loader.md has the
        logging recipes."""
        s = self.settings
        return self._meter.figures(last, 0 if s.in_process else s.num_workers, self._stages)

    def diagnosis(self) -> Diagnosis | None:
        """Which stage limits the pipeline, with the figures and the change that helps
        (NOTE [ the limiting stage ]): during an epoch over its last ``diagnose.window``
        batches (or all after its first, before there are as many); between epochs
        over the last one after its first batch (the end, when the stages run dry,
        would hide which one was behind).  None before a second batch."""
        d = self._meter.steady()
        if d is None:
            return None
        s = self.settings
        return diagnose(d, workers=0 if s.in_process else s.num_workers,
                        gpu=getattr(s.decode, "device", None) is not None, remote=self.db.remote is not None)
