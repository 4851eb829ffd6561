"""A Loader's settings, checked, in one object: :class:`LoaderSettings`."""
from __future__ import annotations

import multiprocessing as mp
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable

from .format.imagesize import DEFAULT_MAX_PIXELS
from .read.iomode import choose as choose_io
from .read.plan import DEFAULT_CACHE, DEFAULT_CHUNK, check_count

__all__ = ["LoaderSettings", "dist_rank_world"]


@dataclass(frozen=True)
class LoaderSettings:
    """What a :class:`~seqloader.loader.Loader` was asked for (its parameters, as
    documented there), with ``rank``/``world_size`` resolved, ``even`` defaulted and
    ``pin_memory`` only where CUDA is.  :meth:`check` raises ValueError naming a bad one."""

    transform: Callable | None = None
    batch_size: int = 256
    shuffle: bool = False
    num_workers: int = 4
    cache: int = DEFAULT_CACHE
    drop_last: bool = False
    seed: int = 0
    chunk_size: int = DEFAULT_CHUNK
    pin_memory: bool = False
    prefetch: int = 2
    timeout: float = 0
    persistent_workers: bool = True
    start_method: str | None = None
    rank: int = 0
    world_size: int = 1
    target_transform: Callable | None = None
    output: str = "float"
    device: Any = None
    even: bool = False
    warmup: int | None = None
    prefetch_bytes: int = 128 << 20
    io: str = "auto"
    collate_fn: Callable | None = None
    #: how batches are decoded: a :class:`~seqloader.dataflow.decodemode.DecodeMode`
    #: (NOTE [ decode modes ]), chosen once from ``decode``, ``transform`` and ``device``
    decode: Any = None
    #: NOTE [ pixel limit ]: a record whose image claims more pixels is a RecordError
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    @staticmethod
    def check(*, num_workers: int, batch_size: int, cache: int, seed: int, prefetch: int,
              prefetch_bytes: int, warmup: int | None, timeout: float, start_method: str | None,
              io: str, output: str) -> None:
        """Validate what can be checked before the database is opened."""
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

    @property
    def in_process(self) -> bool:
        """Batches are made in the iterating process: the decode mode says so (raw
        batches: no transform) or no workers."""
        return (self.decode.in_process if self.decode is not None else self.transform is None
                ) or self.num_workers == 0


def dist_rank_world() -> tuple[int, int]:
    """``torch.distributed``'s rank and world size; (0, 1) when it is not initialised.
    A launcher's ``WORLD_SIZE`` > 1 without an initialised process group is an error:
    every rank would read the whole split (each record trained on world-size times)."""
    import torch

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
