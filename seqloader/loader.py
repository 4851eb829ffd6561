"""``Loader``: the drop-in replacement for ``torch.utils.data.DataLoader``.

A facade over a pipeline of the public stages (NOTE [ planned stages ] in
:mod:`seqloader.dataflow.base`)::

    MultiProcessMapAndBatchData(BatchData(LocallyShuffleData(LMDBData(...))))

(no ``LocallyShuffleData`` without ``shuffle``).  The Loader adds what DataLoader users
expect: ``len``, epochs and ``set_epoch``, ``state_dict`` resume, DDP ranks, pinning,
tensors and device normalisation.
"""
from __future__ import annotations

import multiprocessing as mp
import numbers
import os
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .read.database import Database, open_database
from .read.direct import choose as choose_io
from .read.plan import (DEFAULT_CACHE, DEFAULT_CHUNK, EpochPlan, PlanSpec, check_count, num_batches,
                        plan_epoch)
from .read.remote import RemoteOptions, is_url, with_timeout
from .dataflow.batch import BatchSpec
from .dataflow.gpudecode import DecodeStats, GPUDecoder
from .dataflow.gpugather import GPUOptions, gpu_options
from .dataflow.mapbatch import MultiProcessMapAndBatchData
from .dataflow.passes import Pass
from .dataflow import targetregion as _targets  # HOOK [ any targets ]
from .dataflow.reading import LMDBData, LocallyShuffleData
from .dataflow.stages import BatchData
from .dataflow.shuffle import default_warmup
from .resume import Resumable, is_int as _is_int
from .trainers import TrainerFacing

__all__ = ["Loader", "ImagenetLoader", "DEFAULT_CACHE", "DEFAULT_CHUNK"]

_SUPERSEDED = ("this iteration over the Loader was ended by a newer iter(loader) (or by a "
               "load_state_dict that changed the shuffle warm-up): one iteration at a time "
               "(the workers serve one epoch); keep a single iterator")


def _dist_rank_world() -> tuple[int, int]:
    """``torch.distributed``'s rank and world size; (0, 1) when it is not initialised.
    A launcher's ``WORLD_SIZE`` > 1 without an initialised process group is an error:
    every rank would read the whole split (each record trained on world-size times)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    env = os.environ.get("WORLD_SIZE", "")
    if env.strip().isdigit() and int(env) > 1:
        raise ValueError(f"WORLD_SIZE={env} is set (torchrun or another launcher) but "
                         "torch.distributed is not initialised, so this Loader would read the "
                         "whole split on every rank: call torch.distributed.init_process_group() "
                         "before creating the Loader, or pass rank= and world_size= explicitly "
                         "(world_size=1 to read everything in each process on purpose)")
    return 0, 1


class Loader(TrainerFacing, Resumable):
    """Iterate ``(images, labels)`` batches of a seqloader database, DataLoader-style.

    ``Loader(imagenet_dir, 'train', transform, batch_size=256, shuffle=True, num_workers=4)``
    reads ``imagenet_dir/ILSVRC-train.lmdb`` (or its shards; ``imagenet_dir`` may also be
    the ``.lmdb`` file).  ``transform`` gets an HWC uint8 RGB array (seqloader transforms
    also get a seeded ``rng``; torchvision transforms get a PIL image) and returns a
    fixed-shape array; batches are stacked to tensors (float32 ``[B,3,H,W]`` for
    ToTensor+Normalize).  ``transform=None`` yields ``(list of encoded bytes, labels)``.
    ``decode="gpu"`` (with ``device``) leaves the decoding of a standard recipe to the
    device -- nvJPEG, the same crop boxes (:mod:`seqloader.dataflow.gpudecode`).
    A database of any targets (``seqloader.write_dataset``) yields ``(images,
    default_collate(targets))``; ``collate_fn`` (as DataLoader's) gets
    ``[(image, target), ...]`` instead, each image one sample of the batch
    (NOTE [ target region ] in :mod:`seqloader.dataflow.targetregion`).  Stored pixels are
    not decoded: the transform gets them as stored (NOTE [ stored pixels ]).

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

    Memory: ``cache`` records of encoded JPEGs held as page cache (not private
    copies), plus ``num_workers * prefetch`` batch buffers in shared memory.  With
    direct I/O (``io="direct"``, or ``"auto"`` -- the default -- for a database larger
    than half the RAM or of a lower cgroup memory limit; NOTE [ direct I/O ] in
    :mod:`seqloader.read.direct`) the records are
    read around the page cache and the ``cache`` records are private memory instead,
    plus a ``prefetch_bytes`` read-ahead ring.

    ``imagenet_dir`` may be a URL (``s3://bucket/imagenet``, ``https://host/imagenet``,
    any fsspec protocol; ``pip install seqloader[remote]``): each rank then reads its
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
                 decode: "str | GPUOptions" = "cpu"):
        for name, value, least in (("num_workers", num_workers, 0), ("batch_size", batch_size, 1),
                                   ("cache", cache, 1), ("seed", seed, 0), ("prefetch", prefetch, 1),
                                   ("prefetch_bytes", prefetch_bytes, 1)):
            check_count(name, value, least)
        if warmup is not None:
            check_count("warmup", warmup, 0)
        if not isinstance(timeout, numbers.Real) or not timeout >= 0:  # (NaN fails too)
            raise ValueError(f"timeout must be a number of seconds >= 0 (0: no limit), got {timeout!r}")
        if start_method is not None and start_method not in mp.get_all_start_methods():
            raise ValueError(f"start_method={start_method!r}: use one of "
                             f"{mp.get_all_start_methods()} (or None for the default)")
        choose_io(io, 0)  # (validates io now, not in the first iteration)
        if output not in ("float", "uint8"):
            raise ValueError(f"output must be 'float' or 'uint8', got {output!r}")
        self.gpu = gpu_options(decode, transform, output, device)
        # a URL (s3://, https://...) is read remotely (NOTE [ remote reading ])
        p = imagenet_dir if is_url(imagenet_dir) else Path(imagenet_dir)
        self.db: Database = open_database(p, mode, remote=with_timeout(remote, timeout))
        if world_size == 1 and rank is None:
            rank = 0  # (one process reads everything: nothing to ask torch.distributed)
        if rank is None or world_size is None:
            drank, dworld = _dist_rank_world()
        self.rank = drank if rank is None else rank
        self.world_size = dworld if world_size is None else world_size
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.num_workers, self.cache, self.seed = num_workers, cache, seed
        self.plan_spec = PlanSpec(self.db.shard_sizes, batch_size, chunk_size, shuffle, drop_last,
                                  seed, self.rank, self.world_size, max(1, num_workers),
                                  shuffle if even is None else even)
        self.transform, self.target_transform = transform, target_transform
        self.collate_fn = collate_fn  # HOOK [ any targets ] (NOTE [ target region ])
        self.output, self.device = output, (torch.device(device) if device is not None else None)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warnings.warn("pin_memory=True but no CUDA device is available; not pinning",
                          stacklevel=2)
        self.prefetch, self.timeout = prefetch, timeout
        self.persistent_workers, self.start_method = persistent_workers, start_method
        self.warmup, self.prefetch_bytes = warmup, prefetch_bytes
        self.io, self.chunk_size, self.even = io, chunk_size, self.plan_spec.even
        self._adopted_warmup: int | None = None  # a checkpoint's default warm-up
        self._engine: MultiProcessMapAndBatchData | None = None
        self._next_epoch = 0     # epoch of the next iteration to yield a batch
        self._resume = 0         # its first batch (> 0 after load_state_dict)
        self._cur_epoch: int | None = None  # epoch of the iteration in progress (None: between)
        self._position = 0       # batches of it already yielded
        self._cur_done = False
        # the iteration in progress, weakly: the generator's frame refers to the loader,
        # and a strong reference back would keep a dropped loader (and its workers)
        # alive until the cyclic GC runs
        self._active: weakref.ref | None = None
        self._gpu_decoder: GPUDecoder | None = None

    # -------------------------------------------------------------- set-up
    @property
    def _warmup(self) -> int:
        """Records the shuffle buffer holds before it yields (default: one batch, or the
        whole split when it fits in the buffer: :func:`~seqloader.dataflow.shuffle.default_warmup`)."""
        if self.warmup is not None:
            return self.warmup
        if self._adopted_warmup is not None:  # a checkpoint's (see load_state_dict)
            return self._adopted_warmup
        return default_warmup(self.cache, self.batch_size, self.db.num_records, self.world_size)

    def _pipeline(self) -> MultiProcessMapAndBatchData:
        """The stages (built at the first iteration, and again after :meth:`close`)."""
        if self._engine is None:
            df: Any = LMDBData(self.db, shuffle=self.shuffle, chunk_size=self.chunk_size,
                               seed=self.seed, rank=self.rank, world_size=self.world_size,
                               even=self.even, prefetch_bytes=self.prefetch_bytes, io=self.io)
            if self.shuffle:
                df = LocallyShuffleData(df, self.cache, warmup=self._warmup)
            df = BatchData(df, self.batch_size, remainder=not self.drop_last)
            df = MultiProcessMapAndBatchData(
                df, self.num_workers, self.transform, target_transform=self.target_transform,
                output=self.output, prefetch=self.prefetch, timeout=self.timeout,
                start_method=self.start_method, read_ahead=self.persistent_workers,
                gpu=self.gpu)
            assert df.source.plan_spec == self.plan_spec, (df.source.plan_spec, self.plan_spec)
            df.spec  # (a failing transform or output setting raises here, before any I/O)
            df.reset_state()
            self._engine = df
            if self.gpu is not None:  # (one per pipeline: its recipe and stream)
                stats = self._gpu_decoder.stats if self._gpu_decoder is not None else None
                self._gpu_decoder = GPUDecoder(df.spec, self.device, db=self.db)
                self._gpu_decoder.stats = stats or self._gpu_decoder.stats
        return self._engine

    @property
    def _spec(self) -> BatchSpec:
        return self._pipeline().spec

    @property
    def _pool(self) -> Any:
        """The worker pool of the running pipeline, or None."""
        return None if self._engine is None else self._engine.pool

    def _producer_spec(self) -> BatchSpec:
        """The workers' spec (for the bench tools; builds the pipeline)."""
        return self._spec

    @property
    def _feeder(self) -> LMDBData | None:
        """The pipeline's reader stage (``.reader``: its RangeReader), or None."""
        return None if self._engine is None else self._engine.source

    @property
    def decode_stats(self) -> DecodeStats | None:
        """With ``decode="gpu"``: images decoded on the device and those the workers
        rendered instead, by reason (:class:`~seqloader.dataflow.gpudecode.DecodeStats`);
        None otherwise."""
        if self.gpu is None:
            return None
        return self._gpu_decoder.stats if self._gpu_decoder is not None else DecodeStats()

    @property
    def _device_normalize(self) -> Any:
        return None if self._engine is None else self._engine.device_normalize

    # -------------------------------------------------------------- iteration
    def __len__(self) -> int:
        return num_batches(self.plan_spec)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (DistributedSampler's habit).  A resume
        position loaded for that same epoch is kept; one for another epoch is dropped,
        with a warning."""
        self._set_epoch(epoch, trainer=False)

    def _set_epoch(self, epoch: int, trainer: bool) -> None:
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        # a trainer starting the epoch after a loaded one ends that epoch, cut short by
        # it (NOTE [ epochs and iterators ]): no warning
        cut_short = trainer and epoch == self._next_epoch + 1
        if epoch != self._next_epoch and self._resume:
            if not cut_short:
                warnings.warn(f"set_epoch({epoch}) discards the position loaded for epoch "
                              f"{self._next_epoch} (batch {self._resume}): epoch {epoch} "
                              "starts from its first batch; call set_epoch with the "
                              "checkpoint's epoch to resume it", stacklevel=3)
            self._resume = 0
        self._next_epoch, self._cur_epoch = int(epoch), None

    @property
    def classes(self) -> list[str]:
        """Class names in label order (the dataset's folder names)."""
        return self.db.classes

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the next one between iterations."""
        return self._next_epoch if self._cur_epoch is None else self._cur_epoch

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` (default: the next) -- pure, no I/O."""
        return plan_epoch(self.plan_spec, self._next_epoch if epoch is None else epoch)

    def _end_active(self, superseded: bool = False) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.end(superseded)

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor]]:
        # NOTE [ epochs and iterators ]: the iteration in progress ends here, cut short or
        # not; the new one takes its epoch (the next, or what set_epoch/load_state_dict
        # say) at its first batch, so an iterator that yields nothing uses none
        self._end_active(superseded=True)
        self._cur_epoch = None
        started: list[int] = []  # the first batch, once the iteration has taken its epoch
        it = Pass(self._iterate(started), _SUPERSEDED,  # (resumed: len() is the rest)
                  lambda: len(self) - (started[0] if started else self._resume))
        self._active = weakref.ref(it)
        return it

    def _start(self, epoch: int, first: int, started: list[int]) -> None:
        """The iteration takes epoch ``epoch`` from batch ``first``: the next one is ``epoch + 1``."""
        started.append(first)
        self._cur_epoch, self._position, self._cur_done = epoch, first, False
        self._next_epoch, self._resume = epoch + 1, 0

    def _iterate(self, started: list[int]) -> Iterator[tuple[Any, torch.Tensor]]:
        epoch, first = self._next_epoch, self._resume
        engine = self._pipeline()
        spec = engine.spec
        try:
            for j, batch in self._batches(engine, spec, epoch, first):
                if not started:
                    self._start(epoch, first, started)
                self._position = j + 1
                yield batch
            if not started:  # (an epoch with no batches left is used by running to its end)
                self._start(epoch, first, started)
            self._cur_done = True
        finally:
            self._active = None
            if not self.persistent_workers:
                self._stop_workers()

    def _batches(self, engine: MultiProcessMapAndBatchData, spec: BatchSpec, epoch: int,
                 first: int) -> Iterator[tuple[int, Any]]:
        """``(j, batch)`` for batches ``j >= first`` of ``epoch``, as the caller gets them."""
        if self._gpu_decoder is not None:  # NOTE [ GPU stream ]
            engine.start()  # (in this thread, which outlives the decode thread)
            for j, batch in self._gpu_decoder.batches(engine.run(epoch, first)):
                yield j, _targets.collate_batch(batch, None, self.collate_fn, self.device,
                                                self.pin_memory)
            return
        for j, n, (labels, samples), raw, slot in engine.run(epoch, first):
            # HOOK [ any targets ]: unpacked from the buffer, collated after the images
            targets = _targets.load_targets(labels) if spec.target_kind == "any" else None
            batch = self._materialize(spec, labels if targets is None else labels[:0].view(
                np.int64), samples, raw, slot)
            batch = _targets.collate_batch(batch, targets, self.collate_fn, self.device,
                                           self.pin_memory)
            del labels, samples
            yield j, batch

    def _materialize(self, spec: BatchSpec, labels_v: np.ndarray, images_v: np.ndarray,
                     raw: list[bytes] | None, slot: int | None):
        """Batch tensors from a buffer.  NOTE [ zero-copy batches ]: on the CPU the images
        tensor is a view of the shared-memory buffer, leased until the tensor (and every
        view of it) is garbage-collected -- no copy, no extra memory.  When the caller
        holds too many batches, or pins / moves them, the batch is copied instead.  A
        held batch stays readable after the pool stops (end of a non-persistent epoch,
        close(), the loader collected, a worker's death): its views hold an export of the
        buffer (``slot_views``), so closing the pool leaves that mapping to them
        (``parallel._unmap_later``) and it is unmapped when the batch goes."""
        labels = torch.from_numpy(labels_v.copy())
        if raw is not None:
            return raw, labels
        pool = self._pool
        on_cpu = self.device is None or self.device.type == "cpu"
        token = None
        if slot is not None and not self.pin_memory and on_cpu:
            token = pool.lease(slot)
        if token is not None:
            images = torch.from_numpy(images_v)
            weakref.finalize(images_v, pool.release, slot, token)
            if self.device is not None and self._device_normalize is not None:
                images = self._device_normalize(images)
            return images, labels
        images = torch.empty(images_v.shape, dtype=getattr(torch, spec.sample_dtype),
                             pin_memory=self.pin_memory)
        np.copyto(images.numpy(), images_v)
        if self.pin_memory:
            labels = labels.pin_memory()
        if self.device is not None:
            images = images.to(self.device, non_blocking=self.pin_memory)
            labels = labels.to(self.device, non_blocking=self.pin_memory)
            if self._device_normalize is not None:
                images = self._device_normalize(images)
        return images, labels

    # -------------------------------------------------------------- shutdown
    def _stop_workers(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

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
