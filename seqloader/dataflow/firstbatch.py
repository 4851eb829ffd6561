"""The first batch decoded by every worker together (NOTE [ first batch split ]).

NOTE [ first batch split ]
When a feed thread starts (the first epoch, after a cancel, every epoch with
``persistent_workers=False``) all workers are idle, and batch ``j`` would be decoded by
worker ``j % W`` alone while the others wait: at ~1.6 ms an image, 256 images keep the
caller waiting ~0.4 s.  So the feed thread cuts that one batch into ``W`` parts of
consecutive records, each decoded by its own worker into the same batch buffer; the
parent takes the parts' answers (in the order the workers got them) before the batch is
ready.  Neither the order nor the pixels change:
* **the draws**: a batch's samples draw from one generator, in record order, a varying
  number of values each (a crop may take several tries).  The feed thread replays the
  draws of the records before each part -- :meth:`FusedPipeline.prepare` reads the
  JPEG header and draws, without decoding: ~25 us a record -- and gives each part the
  generator in the state its first record finds it in.  So only the fused recipe is
  split (``BatchSpec.fused``; a plain transform draws from the global generators,
  seeded once per batch, which only running it would advance), with class labels;
* **the buffer**: each part's records are packed to end where the part's samples
  region ends (the last part's: at the buffer's end), so a worker overwrites only its
  own records, each after it read it (the rule of NOTE [ batch buffer layout ], per
  part); a batch that does not fit so is not split;
* **the errors**: a record whose draw fails in the replay fails the same way in its
  worker, which raises the usual :class:`~seqloader.errors.RecordError`; the parts after
  it are sent empty (nothing to decode, nothing known to draw from).
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import msgpack
import numpy as np

from ..format.pixels import image_source
from .batch import BatchSpec
from .decode import batch_rng

__all__ = ["splittable", "part_layout", "part_rngs", "MIN_PART"]

#: The fewest records a part has (smaller batches are not split).
MIN_PART = 2


def splittable(spec: BatchSpec, workers: int) -> bool:
    """Whether batches of ``spec`` may be split across ``workers`` (NOTE [ first batch
    split ]): the fused recipe, class labels, more than one worker."""
    mode = spec.mode  # (a mode that decodes in the workers, into the batch: the CPU's)
    return (workers > 1 and not mode.in_process and not mode.keeps_inputs
            and spec.fused is not None and spec.transform is None
            and spec.target_kind == "class")


def part_layout(spec: BatchSpec, sizes: Sequence[int], parts: int
                ) -> list[tuple[int, int, int]] | None:
    """``(first record, end record, byte offset of the first)`` per part for a batch of
    records of ``sizes`` split in ``parts``, or None when some part's records do not fit
    in its own region (NOTE [ first batch split ])."""
    n = len(sizes)
    if parts < 2 or n < parts * MIN_PART:
        return None
    L, S = spec.labels_nbytes, spec.sample_nbytes
    sizes_a = np.asarray(sizes, np.int64)
    out = []
    for k in range(parts):
        a, b = n * k // parts, n * (k + 1) // parts
        end = spec.slot_nbytes if k == parts - 1 else L + b * S
        start = end - int(sizes_a[a:b].sum())
        if start < L + a * S:
            return None
        # record i+1 of the part begins at or after the end of sample i
        begins = start + np.cumsum(sizes_a[a:b - 1])
        if np.any(begins < L + S * np.arange(a + 1, b)):
            return None
        out.append((a, b, start))
    return out


def part_rngs(spec: BatchSpec, values: Sequence[Any], layout: list[tuple[int, int, int]],
              epoch: int, j: int) -> list[np.random.Generator | None]:
    """The generator of each part in the state its first record finds it in: batch ``j``
    of ``epoch``'s (``batch_rng``) advanced by the draws of the records before
    (``values``: the batch's records, in order).  A part after a record whose draw fails
    gets None (NOTE [ first batch split ]: that record's worker reports it)."""
    rng = batch_rng(spec.seed, epoch, spec.rank, j)
    out: list[np.random.Generator | None] = [copy.deepcopy(rng)]
    i = 0
    for a, _, _ in layout[1:]:
        try:
            for i in range(i, a):
                data = image_source(msgpack.unpackb(values[i], raw=False))
                spec.fused.prepare(data, rng)
            i = a
        except Exception:
            return out + [None] * (len(layout) - len(out))
        out.append(copy.deepcopy(rng))
    return out
