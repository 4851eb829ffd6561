"""The baseline of ``seqloader bench --loader files``: a plain ``torch.utils.data``
pipeline over the images as individual files (ImageFolder-style), decoded with the
same OpenCV code and transformed with the same seqloader transforms, so that the
only differences from seqloader are *how the bytes are read* (one ``open``/``read``
per file, in random order) and, for the ImageNet recipe, the fused pipeline.

Everything here is top-level and picklable (spawn/forkserver workers work).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ...workers.threads import forking_single_threaded
from ...errors import NotFoundError

__all__ = ["FilesDataset", "FilesLoader", "collate_raw", "collate_decoded", "resolve_tree",
           "worker_init"]


def resolve_tree(path: str | Path, split: str | None) -> Path:
    """The class-folder tree to read: ``path/<split>`` when that folder exists (an
    ImageNet root holding ``train/`` and ``val/``), else ``path`` itself."""
    p = Path(path)
    if not p.exists():
        raise NotFoundError(f"image folder {p} does not exist")
    if not p.is_dir():
        raise ValueError(f"{p} is not a folder; the files loader needs a class-folder tree "
                         "(<dir>/<class>/<image>) -- pass it as PATH or with --files DIR")
    if split and (p / split).is_dir():
        return p / split
    from ...write.preprocess import DEFAULT_SPLITS
    splits = [s for s in DEFAULT_SPLITS if (p / s).is_dir()]
    if split and splits:  # an ImageNet root without that split: not a class tree
        raise NotFoundError(f"{p} has no {split}/ folder (it has {', '.join(splits)}); "
                            "pass --split with one of those")
    return p


class FilesDataset(torch.utils.data.Dataset):
    """Item ``i``: read ``root/paths[i]`` and return ``(sample, label, nbytes)``.

    ``transform=None``: the sample is the encoded bytes (raw mode, nothing decoded).
    Otherwise ``transform(decode_rgb(bytes))`` (an HWC RGB uint8 array in; seqloader
    transforms draw from the worker's default generator, reseeded per worker by
    :func:`worker_init`) as a contiguous numpy array.  ``nbytes`` is the file size
    read, so the benchmark counts bytes exactly.
    """

    def __init__(self, root: str | Path, paths: Sequence[str], labels: Sequence[int] | np.ndarray,
                 transform: Callable | None = None) -> None:
        if len(paths) != len(labels):
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        self.root = str(root)
        self.paths = list(paths)
        self.labels = np.asarray(labels, np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int, int]:
        path = os.path.join(self.root, self.paths[i])
        with open(path, "rb") as f:
            data = f.read()
        label = int(self.labels[i])
        if self.transform is None:
            return data, label, len(data)
        from ...transforms import decode_rgb

        try:
            img = decode_rgb(data)
        except ValueError as e:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")  # (any file name)
            raise ValueError(f"{shown}: {e}; remove or replace the file (preprocessing skips "
                             "such files: benchmark with the database as PATH and this tree "
                             "as --files, and the files it skipped are left out)") from None
        return np.ascontiguousarray(self.transform(img)), label, len(data)


def collate_raw(batch: list[tuple[bytes, int, int]]) -> tuple[list[bytes], torch.Tensor, int]:
    """``(list of encoded bytes, int64 labels, bytes read)``: a list instead of the
    default collate (which cannot stack variable-length bytes)."""
    return ([b[0] for b in batch], torch.tensor([b[1] for b in batch], dtype=torch.int64),
            sum(b[2] for b in batch))


def collate_decoded(batch: list[tuple[np.ndarray, int, int]]
                    ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The default collate of the samples (in a worker it stacks straight into shared
    memory, as a plain DataLoader does), plus labels and bytes read."""
    images = torch.utils.data.default_collate([b[0] for b in batch])
    return (images, torch.tensor([b[1] for b in batch], dtype=torch.int64),
            sum(b[2] for b in batch))


def worker_init(worker_id: int) -> None:
    """Per-worker set-up matching seqloader's workers: single-threaded OpenCV, and a
    distinct default generator for the transforms (forked workers would otherwise
    share the parent's generator state and draw identical crops)."""
    from ...workers.threads import limit_worker_threads
    from ...transforms import seed_default

    limit_worker_threads()
    info = torch.utils.data.get_worker_info()
    seed_default(None if info is None else info.seed % 2**63)


class FilesLoader:
    """A ``DataLoader(FilesDataset, shuffle=True)`` that loops over epochs until
    closed (iterating it never ends), with explicit worker shutdown in :meth:`close`.

    Workers are persistent across epochs (``persistent_workers=True``), as seqloader's
    are, so an epoch boundary costs the same kind of thing in both.
    """

    def __init__(self, dataset: FilesDataset, *, batch_size: int, num_workers: int,
                 seed: int = 0, drop_last: bool = False, prefetch_factor: int = 2,
                 start_method: str | None = None) -> None:
        self.dataset = dataset
        g = torch.Generator()
        g.manual_seed(seed)
        kw: dict[str, Any] = {}
        if num_workers > 0:
            kw.update(prefetch_factor=prefetch_factor, persistent_workers=True)
            if start_method:
                import multiprocessing as mp

                kw["multiprocessing_context"] = mp.get_context(start_method)
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
            collate_fn=collate_raw if dataset.transform is None else collate_decoded,
            drop_last=drop_last, generator=g, worker_init_fn=worker_init, **kw)
        self.epochs = 0
        self._it: Any = None
        self._start_method = start_method

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor, int]]:
        if len(self.loader) == 0:
            raise ValueError(f"{len(self.dataset)} images make no batch (drop_last)")
        while True:
            self.epochs += 1
            with forking_single_threaded(self._start_method):
                self._it = iter(self.loader)
            yield from self._it

    def pids(self) -> list[int]:
        workers = getattr(self._it, "_workers", None) or []
        return [w.pid for w in workers if w.pid is not None]

    def close(self) -> None:
        """Stop the worker processes now (not at garbage collection)."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        # the DataLoader keeps its persistent iterator too
        it2 = getattr(self.loader, "_iterator", None)
        shutdown = getattr(it2, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.loader._iterator = None
