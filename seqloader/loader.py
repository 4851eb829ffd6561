"""``Loader``: the drop-in replacement for ``torch.utils.data.DataLoader``.

A facade over a pipeline of the public stages (NOTE [ planned stages ] in
:mod:`seqloader.dataflow.base`)::

    MultiProcessMapAndBatchData(BatchData(LocallyShuffleData(LMDBData(...))))

(no ``LocallyShuffleData`` without ``shuffle``), built from its
:class:`~seqloader.settings.LoaderSettings`.  The Loader adds what DataLoader users
expect: ``len``, epochs and ``set_epoch`` (its :class:`~seqloader.resume.EpochState`),
``state_dict`` resume, DDP ranks; :class:`~seqloader.dataflow.delivery.Delivery` makes the
tensors (zero-copy, pinned, on a device, normalised there).
"""
from __future__ import annotations

import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from .format.imagesize import DEFAULT_MAX_PIXELS, check_max_pixels
from .read.database import Database, open_database
from .read.plan import DEFAULT_CACHE, DEFAULT_CHUNK, EpochPlan, PlanSpec, check_plan, plan_epoch
from .read.remote import RemoteOptions, is_url, with_timeout
from .dataflow.batch import BatchData, BatchSpec
from .dataflow.delivery import Delivery
from .dataflow.diagnosis import Diagnose
from .dataflow.gpugather import GPUOptions
from .dataflow.modechoice import decode_mode
from .dataflow.mapbatch import MultiProcessMapAndBatchData
from .dataflow.passes import Pass
from .dataflow.remainder import Rest, Segment, rest_plan
from .dataflow.pool import WorkerPool
from .dataflow.lmdbdata import LMDBData
from .dataflow.shuffle import LocallyShuffleData, default_warmup
from .dataflow.stats import LoaderMeter, StageCounters
from .resume import EpochState, Resumed, check_checkpoint, checkpoint
from .settings import LoaderSettings, dist_rank_world
from .measured import Measured
from .trainers import GradientWindow, TrainerFacing

__all__ = ["Loader", "ImagenetLoader", "DEFAULT_CACHE", "DEFAULT_CHUNK"]

_SUPERSEDED = ("this iteration over the Loader was ended by a newer iter(loader) (or by a "
               "load_state_dict that changed the shuffle warm-up): one iteration at a time "
               "(the workers serve one epoch); keep a single iterator")


class Loader(TrainerFacing, Measured):
    """Iterate ``(images, labels)`` batches of a seqloader database, DataLoader-style.

    ``Loader(imagenet_dir, 'train', transform, batch_size=256, shuffle=True, num_workers=4)``
    reads ``imagenet_dir/ILSVRC-train.lmdb`` (or its shards; ``imagenet_dir`` may also be
    the ``.lmdb`` file).  ``transform`` gets an HWC uint8 RGB array (seqloader transforms
    also get a seeded ``rng``; torchvision transforms get a PIL image) and returns a
    fixed-shape array; batches are stacked to tensors (float32 ``[B,3,H,W]`` for
    ToTensor+Normalize).  ``transform=None`` yields ``(list of encoded bytes, labels)``.
    ``decode="gpu"`` (with ``device``) leaves the decoding of a standard recipe to the
    device -- nvJPEG, the same crop boxes (:mod:`seqloader.dataflow.gpudecode`); the
    device gets an explicit index and the decoder is checked here, so a missing or old
    torchvision or a build without nvJPEG raises :class:`~seqloader.errors.DeviceError`
    now (NOTE [ GPU setup ] in :mod:`seqloader.dataflow.gpumode`).
    A database of any targets (``seqloader.write_dataset``) yields ``(images,
    default_collate(targets))``; ``collate_fn`` (as DataLoader's) gets
    ``[(image, target), ...]`` instead, each image one sample of the batch
    (NOTE [ target region ] in :mod:`seqloader.dataflow.targetregion`).  Stored pixels are
    not decoded: the transform gets them as stored (NOTE [ stored pixels ]).
    ``max_pixels`` (default: Pillow's limit, ~179 megapixels; None: none): a record whose
    image header claims more pixels raises :class:`~seqloader.errors.RecordError` naming
    it, before anything decodes it (NOTE [ pixel limit ] in
    :mod:`seqloader.format.imagesize`: a database written without the writer's limit).

    Contracts: ``len(loader)`` is exact and equal on every rank in training
    (``shuffle=True``); each ``for`` is a new epoch (``set_epoch`` sets it; an iterator
    uses its epoch at its first batch, and one cut short ends at the next ``iter()``:
    NOTE [ epochs and iterators ] in :mod:`seqloader.trainers`); evaluation
    (``shuffle=False``) yields every record once, in file order, across ranks;
    ``drop_last`` as in DataLoader; ``state_dict``/``load_state_dict`` resume mid-epoch
    exactly.  Fork-safe to construct (nothing is opened until iteration); not
    thread-safe; one iteration at a time (a new ``iter()`` ends the previous one, whose
    ``next()`` then raises RuntimeError rather than stopping as if the epoch were done).
    Call :meth:`close` (or use ``with``) to stop workers early; they also stop at
    garbage collection and exit.

    :meth:`stats` gives the running epoch's figures (the wait inside ``next()``, each
    stage's share, the time to the first batch) and :meth:`diagnosis` the stage that
    limits it; ``diagnose`` (:class:`~seqloader.dataflow.diagnosis.Diagnose`; default:
    over 10 % of the time over 50 batches) sets when a
    :class:`~seqloader.dataflow.diagnosis.DataWaitWarning` says so, once per epoch
    (None: never).  Docs: "Is my training data-bound?" in docs/performance.md.

    Memory: ``cache`` records of encoded JPEGs held as page cache (not private
    copies), plus ``num_workers * prefetch`` batch buffers in shared memory.  With
    direct I/O (``io="direct"``, or ``"auto"`` -- the default -- for a database larger
    than half the RAM or of a lower cgroup memory limit; NOTE [ direct I/O ] in
    :mod:`seqloader.read.direct`) the records are
    read around the page cache and the ``cache`` records are private memory instead,
    plus a ``prefetch_bytes`` read-ahead ring.

    ``imagenet_dir`` may be a URL (``s3://bucket/imagenet``, ``https://host/imagenet``,
    any fsspec protocol; the ``remote`` extra, docs/remote.md): each rank then reads its
    chunks with large ranged GETs, in the same order as from a local copy; ``remote``
    (:class:`~seqloader.read.remote.RemoteOptions`) sets ``storage_options``, a local block
    cache (``cache_dir``, ``cache_bytes``), retries and GET size; ``timeout`` (when
    set) also bounds each GET.
    """

    def __init__(self, imagenet_dir: str | Path, mode: str = "train",
                 transform: Callable | None = None, batch_size: int = 256, shuffle: bool = False,
                 num_workers: int = 4, cache: int = DEFAULT_CACHE, drop_last: bool = False, *,
                 seed: int = 0, chunk_size: int = DEFAULT_CHUNK, pin_memory: bool = False,
                 prefetch: int = 2, timeout: float = 0, persistent_workers: bool = True,
                 start_method: str | None = None, rank: int | None = None,
                 world_size: int | None = None, target_transform: Callable | None = None,
                 output: str = "float", device: str | torch.device | None = None,
                 even: bool | None = None, warmup: int | None = None,
                 prefetch_bytes: int = 128 << 20, io: str = "auto",
                 remote: "RemoteOptions | None" = None, collate_fn: Callable | None = None,
                 decode: "str | GPUOptions" = "cpu",
                 max_pixels: int | None = DEFAULT_MAX_PIXELS,
                 diagnose: Diagnose | None = Diagnose()):
        LoaderSettings.check(num_workers=num_workers, batch_size=batch_size, cache=cache,
                             seed=seed, prefetch=prefetch, prefetch_bytes=prefetch_bytes,
                             warmup=warmup, timeout=timeout, start_method=start_method, io=io,
                             output=output)
        check_max_pixels(max_pixels)
        # a URL (s3://, https://...) is read remotely (NOTE [ remote reading ])
        p = imagenet_dir if is_url(imagenet_dir) else Path(imagenet_dir)
        self.db: Database = open_database(p, mode, remote=with_timeout(remote, timeout))
        if world_size == 1 and rank is None:
            rank = 0  # (one process reads everything: nothing to ask torch.distributed)
        if rank is None or world_size is None:
            drank, dworld = dist_rank_world()
        rank = drank if rank is None else rank
        world_size = dworld if world_size is None else world_size
        # NOTE [ decode modes ]: chosen once; the GPU mode checks its device here
        mode = decode_mode(decode, transform, output=output, device=device, rank=rank,
                           world_size=world_size)
        if mode.device is not None:
            device = mode.device  # (an explicit index: NOTE [ GPU setup ])
        pin = pin_memory and torch.cuda.is_available()
        if pin_memory and not pin:
            warnings.warn("pin_memory=True but no CUDA device is available; not pinning",
                          stacklevel=2)
        #: the settings, checked (one object: what the pipeline is built from)
        self.settings = LoaderSettings(
            transform=transform, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
            cache=cache, drop_last=drop_last, seed=seed, chunk_size=chunk_size, pin_memory=pin,
            prefetch=prefetch, timeout=timeout, persistent_workers=persistent_workers,
            start_method=start_method, rank=rank, world_size=world_size,
            target_transform=target_transform, output=output,
            device=torch.device(device) if device is not None else None,
            even=shuffle if even is None else even, warmup=warmup,
            prefetch_bytes=prefetch_bytes, io=io, collate_fn=collate_fn, decode=mode,
            max_pixels=max_pixels)
        s = self.settings
        check_plan(batch_size=s.batch_size, chunk_size=s.chunk_size, world_size=s.world_size,
                   num_workers=max(1, s.num_workers), rank=s.rank)  # (before the stages do)
        #: the epoch bookkeeping: the next epoch, a loaded position, the one in progress
        self.epochs = EpochState()
        self._adopted_warmup: int | None = None  # a checkpoint's default warm-up
        if diagnose is not None and not isinstance(diagnose, Diagnose):
            raise TypeError(f"diagnose must be a seqloader Diagnose(share=, window=) or None "
                            f"(no warning), got {diagnose!r}")
        self._diagnose = diagnose
        # NOTE [ pipeline counters ]: one set per Loader, whatever restarts
        self._meter = LoaderMeter(StageCounters(), window=(diagnose or Diagnose()).window)
        self._warned: int | None = None  # the epoch a DataWaitWarning was given for
        self._stages = self._build()
        self._delivery: Delivery | None = None  # (while the stages are reset for iterating)
        # the iteration in progress, weakly: the generator's frame refers to the loader,
        # and a strong reference back would keep a dropped loader (and its workers)
        # alive until the cyclic GC runs
        self._active: weakref.ref | None = None
        self._rest: tuple[Any, Rest] | None = None  # (the last rest plan made, by its key)

    # -------------------------------------------------------------- set-up
    @property
    def warmup(self) -> int:
        """Records the shuffle buffer holds before it yields (default: one batch, or the
        whole split when it fits in the buffer: :func:`~seqloader.dataflow.shuffle.default_warmup`)."""
        s = self.settings
        if s.warmup is not None:
            return s.warmup
        if self._adopted_warmup is not None:  # a checkpoint's (see load_state_dict)
            return self._adopted_warmup
        return default_warmup(s.cache, s.batch_size, self.db.num_records, s.world_size)

    def _build(self) -> MultiProcessMapAndBatchData:
        """The stages, with the plan given where they are built (NOTE [ planned stages ]);
        nothing is opened until :meth:`_ready`."""
        s = self.settings
        # records the workers only copy into buffers need no mapped pages (NOTE [ fault or pread ])
        df: Any = LMDBData(self.db, shuffle=s.shuffle, chunk_size=s.chunk_size, seed=s.seed,
                           rank=s.rank, world_size=s.world_size, even=s.even,
                           prefetch_bytes=s.prefetch_bytes, io=s.io,
                           fault_in=s.in_process and s.decode.reads_in_place)
        if s.shuffle:
            df = LocallyShuffleData(df, s.cache, warmup=self.warmup)
        df = BatchData(df, s.batch_size, remainder=not s.drop_last)
        engine = MultiProcessMapAndBatchData(
            df, s.num_workers, s.transform, target_transform=s.target_transform, output=s.output,
            prefetch=s.prefetch, timeout=s.timeout, start_method=s.start_method,
            read_ahead=s.persistent_workers, decode=s.decode, max_pixels=s.max_pixels)
        engine.counters = self._meter.counters
        return engine

    def _ready(self) -> MultiProcessMapAndBatchData:
        """The stages, reset for iterating in this process (at the first iteration, and
        again after :meth:`close`)."""
        if self._delivery is None:
            self._stages.spec  # (a failing transform or output setting raises here, before any I/O)
            self._stages.reset_state()
            s = self.settings
            self._delivery = Delivery(self._stages, pin_memory=s.pin_memory, device=s.device,
                                      collate_fn=s.collate_fn)
            s.decode.reset()  # (its main-process state is remade after the workers start)
        return self._stages

    @property
    def plan_spec(self) -> PlanSpec:
        """The plan of this Loader's batches (the pipeline's; NOTE [ the epoch plan ])."""
        return self._stages.plan_spec

    @property
    def pipeline(self) -> MultiProcessMapAndBatchData:
        """The stages this Loader iterates (``.source``: the reader stage), for inspection."""
        return self._stages

    @property
    def batch_spec(self) -> BatchSpec:
        """The workers' batch layout (runs a plain transform on record 0 the first time)."""
        return self._stages.spec

    @property
    def decode_stats(self) -> Any:
        """With ``decode="gpu"``: images decoded on the device and those decoded on the
        CPU instead, by reason (:class:`~seqloader.dataflow.gpudecode.DecodeStats`);
        None otherwise."""
        return self.settings.decode.stats

    @property
    def workers(self) -> WorkerPool | None:
        """The worker pool while it exists (``pids``, ``shared_memory_names``, ...), or None."""
        return self._stages.pool

    # DataLoader's and DistributedSampler's names, read-only
    batch_size = property(lambda self: self.settings.batch_size)
    drop_last = property(lambda self: self.settings.drop_last)
    num_workers = property(lambda self: self.settings.num_workers)
    rank = property(lambda self: self.settings.rank)
    world_size = property(lambda self: self.settings.world_size)

    # -------------------------------------------------------------- iteration
    def __len__(self) -> int:
        return len(self._stages)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (DistributedSampler's habit).  A resume
        position loaded for that same epoch is kept; one for another epoch is dropped,
        with a warning."""
        self.epochs.set_epoch(epoch)

    @property
    def classes(self) -> list[str]:
        """Class names in label order (the dataset's folder names)."""
        return self.db.classes

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the next one between iterations."""
        return self.epochs.epoch

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the next) -- pure, no I/O.  For the next epoch
        after a checkpoint loaded on other settings: the plan of its rest (NOTE
        [ elastic resume ] in :mod:`seqloader.dataflow.remainder`)."""
        e = self.epochs
        if epoch is None or (epoch == e.next_epoch and e.pending):
            return self._plan_after(e.next_epoch, e.pending)
        return plan_epoch(self.plan_spec, epoch)

    def _plan_after(self, epoch: int, before: tuple[Segment, ...]) -> EpochPlan:
        """This rank's plan of ``epoch`` after the segments ``before`` (none: its own)."""
        if not before:
            return plan_epoch(self.plan_spec, epoch)
        return self._rest_of(epoch, before).plan

    def _rest_of(self, epoch: int, before: tuple[Segment, ...]) -> Rest:
        key = (self.plan_spec, epoch, before)
        if self._rest is None or self._rest[0] != key:  # (pure: made once per resume)
            self._rest = key, rest_plan(self.plan_spec, epoch, before)
        return self._rest[1]

    def _end_active(self, superseded: bool = False) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.end(superseded)

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor]]:
        # NOTE [ epochs and iterators ]: the iteration in progress ends here, cut short or
        # not; the new one takes its epoch (the next, or what set_epoch/load_state_dict
        # say) at its first batch, so an iterator that yields nothing uses none
        self._end_active(superseded=True)
        self.epochs.between()
        started: list[int] = []  # the first batch, once the iteration has taken its epoch
        it = Pass(self._iterate(started), _SUPERSEDED, self._left(started))  # (resumed: the rest)
        self._active = weakref.ref(it)
        return it

    def _left(self, started: list[int]) -> Callable[[], int]:
        """``len()`` of an iteration: the batches of its plan from its first one."""
        e = self.epochs

        def left() -> int:
            if started:
                return (len(self) if e.batches is None else e.batches) - started[0]
            return (self._rest_of(e.next_epoch, e.pending).plan.num_batches if e.pending
                    else len(self)) - e.resume
        return left

    def _iterate(self, started: list[int]) -> Iterator[tuple[Any, torch.Tensor]]:
        e = self.epochs
        epoch, first, before = e.next_epoch, e.resume, e.pending
        plan = self._plan_after(epoch, before) if before else None
        batches = None if plan is None else plan.num_batches
        self._meter.begin(epoch)
        engine = self._ready()
        window = GradientWindow(self, len(self) if batches is None else batches)
        try:
            for j, out in self._delivered(engine, epoch, first, plan):
                if not started:
                    started.append(first)
                    e.start(epoch, first, before=before, batches=batches)
                e.position = j + 1
                window.batch(j)
                yield out
            if not started:  # (an epoch with no batches left is used by running to its end)
                started.append(first)
                e.start(epoch, first, before=before, batches=batches)
            e.done = True
        finally:
            window.close()
            self._meter.finish()
            self._active = None
            if not self.settings.persistent_workers:
                self._stop_workers()

    def _delivered(self, engine: MultiProcessMapAndBatchData, epoch: int, first: int,
                   plan: EpochPlan | None) -> Iterator[tuple[int, Any]]:
        """``(j, batch)`` for batches ``j >= first`` of ``epoch`` (of ``plan``: a rest),
        as the caller gets them (NOTE [ decode modes ]), each timed (NOTE [ pipeline
        counters ]: ``got`` is when the mode took the batch from the workers)."""
        engine.start()  # (in this thread, which outlives any thread the mode runs)
        sizes = (plan if plan is not None else engine.plan(epoch)).batch_sizes
        clock, got = time.perf_counter, [0.0]

        def arrivals(batches: Iterator[Any]) -> Iterator[Any]:
            for batch in batches:
                got[0] = clock()
                yield batch
                del batch  # (its views of the buffer)

        t = clock()
        for j, out in self.settings.decode.delivered(arrivals(engine.run(epoch, first, plan)),
                                                     self._delivery):
            self._counted(int(sizes[j]), t, min(got[0], clock()) if got[0] > t else t)
            yield j, out
            t = clock()

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the epoch in progress and the batches of it already
        yielded (or the next epoch, position 0, between epochs), with the settings it ran
        on.  Equal on every rank (training): rank 0's is the whole checkpoint."""
        return checkpoint(self.epochs.where(len(self)), self.plan_spec,
                          cache=self.settings.cache, warmup=self.warmup,
                          fingerprint=self.db.metas[0].fingerprint)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any rank's :meth:`state_dict`): the next iteration
        yields exactly the records of that epoch that no rank had yielded.  On the
        checkpoint's settings (``num_workers`` may differ) that is the same batches as
        the uninterrupted run; on others (world size, batch size, cache, ...) the rest is
        split across this loader's ranks by its rule -- in training equal counts, at most
        ``world_size - 1`` records dropped, with a warning (NOTE [ elastic resume ] in
        :mod:`seqloader.dataflow.remainder`).  Another seed or database: ValueError."""
        r: Resumed = check_checkpoint(state, self.state_dict(),
                                      default_warmup=self.settings.warmup is None)
        if r.adopt is not None:
            self._end_active(superseded=True)  # (its next() raises: not a short epoch)
            self._stop_workers()  # (they and the reader were made with the other warm-up)
            self._adopted_warmup = r.adopt
            self._stages = self._build()
        if r.before:
            rest = self._rest_of(r.epoch, r.before)  # (raises on a position past the plan)
            if rest.dropped and r.first == 0:
                s = self.settings
                warnings.warn(f"resuming epoch {r.epoch} on other settings ({s.world_size} "
                              f"rank(s) of batch {s.batch_size}): {rest.remaining} records of it "
                              f"left, {rest.dropped} of them dropped so that every rank has "
                              "the same number of batches (training's even rule, "
                              "drop_last)", stacklevel=2)
            self.epochs.load(r.epoch, r.first, rest.plan.num_batches, r.before)
        else:
            self.epochs.load(r.epoch, r.first, len(self))  # (raises on a bad position)

    # -------------------------------------------------------------- shutdown
    def _stop_workers(self) -> None:
        delivery, self._delivery = self._delivery, None
        if delivery is not None:
            self._stages.close()

    def close(self) -> None:
        """End any iteration and stop the workers.  Idempotent; iterating again restarts them."""
        self._end_active()
        self._stop_workers()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


#: The name the original BayesWatch loader's README uses.
ImagenetLoader = Loader
