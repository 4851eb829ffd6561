"""The decode side of a batch: encoded records in, a filled batch buffer out.

Runs in worker processes (or in the caller's process with ``num_workers=0``).
A batch buffer ("slot") is laid out as ``[labels: int64 x B][samples: B x
sample_shape][tail]`` (:class:`~seqloader.dataflow.batch.BatchSpec`); the reader copies a
batch's record values into its end (see NOTE [ batch buffer layout ]) and the decoder
writes labels and samples in place.
"""
from __future__ import annotations

import contextlib
import operator
import sys
from typing import Any, Callable, Iterator, Sequence

import msgpack
import numpy as np

from ..errors import RecordError
from ..format.imagesize import over_pixel_limit
from ..format.pixels import image_source
from . import targetregion as _targets
from .batch import BatchSpec

__all__ = ["RecordError", "batch_rng", "decode_records", "decode_batch", "callers_rngs_kept",
           "record_error", "seed_global_rngs", "check_pixels"]


def batch_rng(seed: int, epoch: int, rank: int, batch: int) -> np.random.Generator:
    """The augmentation generator of one batch: independent of the worker count and
    exact on resume."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, rank, batch, 2]))


def _seed_global_rngs(rng: np.random.Generator) -> None:
    """Seed the global generators third-party transforms use from ``rng``."""
    seed_global_rngs(int(rng.integers(2**31)))


def seed_global_rngs(seed: int) -> None:
    """Seed ``random``, numpy's global generator and torch's CPU one (when torch is
    loaded) with ``seed`` -- the generators third-party transforms draw from."""
    import random
    random.seed(seed)
    np.random.seed(seed)
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.manual_seed(seed)


@contextlib.contextmanager
def callers_rngs_kept() -> Iterator[None]:
    """Run transforms in the caller's process (``num_workers=0``, the shape probe) and
    give its global generators (random, numpy, torch's CPU one) back as they were:
    :func:`decode_batch` seeds them for third-party transforms, which must not make the
    training loop's own draws (dropout, mixup) ignore the user's seed."""
    import random
    state = random.getstate()
    np_state = np.random.get_state()
    torch = sys.modules.get("torch")
    torch_state = torch.get_rng_state() if torch is not None else None
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)
        if torch is not None and torch_state is not None:
            torch.set_rng_state(torch_state)


def _label(value: Any) -> int:
    """A label as the int64 batches hold it; TypeError for anything that is not an
    integer (floats were truncated silently)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"target_transform returned {value!r} ({type(value).__name__}); batch "
                        "labels are int64, so it must return an integer -- apply other label "
                        "transforms (one-hot, smoothing) to the label batch after loading") from None


# NOTE [ draw, then decode ]
# With the fused pipeline a worker first *prepares* a run of ``_RUN`` records -- msgpack
# unpack, JPEG header, the crop/flip draw and the decode window: Python work, ~25 us
# each when run back to back -- and then decodes and renders them.  Interleaving the two
# per record (``FusedPipeline.__call__``) ran that Python code with caches and branch
# predictors cold from the previous decode: ~70 us (measured by timing each stage inside
# real calls), and whole batches 2-4 % slower (256 ImageNet-sized records: 0.686 vs
# 0.666 ms per image, best of 4 alternated runs; 1200x900 photos 1.62 vs 1.57 ms).  The
# draws consume the batch generator in record order either way, so samples do not
# change; the run's records are unpacked (copied) before its first sample is written,
# which keeps NOTE [ batch buffer layout ]'s promise; errors still name their record.
_RUN = 16


def decode_records(spec: BatchSpec, values: Sequence[Any], indices: Sequence[int],
                   labels: np.ndarray, take: Callable[[int, int, dict, Any], None],
                   after: Callable[[bool], None] | None = None) -> None:
    """Parse each record value; write its label (after ``target_transform``; for "any"
    targets, the packed targets into the region ``labels``: NOTE [ target region ] in
    ``targets.py``) and hand ``take(i, index, record, image)`` its image (stored pixels:
    an array, NOTE [ stored pixels ]).  ``after(last)`` runs after each record, outside
    its error handling (``last`` for the final call).  Raises :class:`RecordError` naming
    the record (index and source path)."""
    targets: list[Any] = []  # of "any" targets (NOTE [ target region ])
    for i, (value, idx) in enumerate(zip(values, indices)):
        rec: Any = {}
        try:
            rec = msgpack.unpackb(value, raw=False)
            data = image_source(rec)  # (stored pixels: an array, NOTE [ stored pixels ])
            if spec.target_kind == "any":
                targets.append(_targets.transformed(rec, spec.target_transform, f"record {idx}"))
            else:
                label = rec["label"]
                labels[i] = _label(spec.target_transform(label)) if spec.target_transform else label
            take(i, idx, rec, data)
        except Exception as e:
            raise record_error(e, idx, rec.get("path") if isinstance(rec, dict) else None) from e
        if after is not None:
            after(False)
    if after is not None:
        after(True)
    if spec.target_kind == "any":  # every record is read: the region may overlap them
        try:
            _targets.store_targets(labels, targets)
        except Exception as e:
            raise record_error(e, indices[0] if len(indices) else -1, None) from e


def decode_batch(spec: BatchSpec, values: Sequence[Any], indices: Sequence[int],
                 labels: np.ndarray, samples: np.ndarray, rng: np.random.Generator) -> None:
    """Decode and transform each record into ``samples`` (labels as :func:`decode_records`
    writes them; stored pixels are not decoded: NOTE [ stored pixels ]).  Every record
    is unpacked (copied) before its sample is written: the records may lie in the
    samples region of the same buffer (NOTE [ batch buffer layout ]); fused samples are
    drawn a run at a time, then decoded (NOTE [ draw, then decode ]).  Raises
    :class:`RecordError` naming the record."""
    if spec.transform is not None:
        _seed_global_rngs(rng)
    fused = spec.fused
    run: list[tuple[int, Any, Any]] = []  # (record, where, prepared) drawn, not decoded

    def take(i: int, idx: int, rec: dict, data: Any) -> None:
        check_pixels(data, spec.max_pixels)  # (before any decode)
        if fused is not None:
            run.append((i, (idx, rec.get("path")), fused.prepare(data, rng)))
        else:
            _generic(spec, data, samples[i], rng)

    def after(last: bool) -> None:
        if len(run) == _RUN or (last and run):
            _finish(fused, run, samples)

    decode_records(spec, values, indices, labels, take, after)


def _finish(fused: Any, run: list[tuple[int, Any, Any]], samples: np.ndarray) -> None:
    """Decode and write a run of prepared samples (NOTE [ draw, then decode ])."""
    for j, (idx, path), prep in run:
        try:
            fused.finish(prep, samples[j])
        except Exception as e:
            raise record_error(e, idx, path) from e
    run.clear()


def check_pixels(data: Any, max_pixels: int | None) -> None:
    """ValueError, before any decode, if the encoded image ``data`` claims more than
    ``max_pixels`` pixels (NOTE [ pixel limit ]; stored pixels, an array, pass)."""
    if max_pixels is None or isinstance(data, np.ndarray):
        return
    why = over_pixel_limit(data, max_pixels, fix=(
        "the database was written without this limit (or with a higher one): to read it, "
        "raise the Loader's limit (Loader(max_pixels=N), None: no limit), or write the "
        "database again (seqloader preprocess leaves such images out: --max-pixels)"))
    if why is not None:
        raise ValueError(why)


def record_error(e: Exception, idx: int, path: Any) -> RecordError:
    """A :class:`RecordError` for ``e``, raised while processing record ``idx`` (call it
    in the ``except`` block: NOTE [ one error contract ] in :mod:`seqloader.errors`)."""
    return RecordError.of(e, idx, path)


def _generic(spec: BatchSpec, data: bytes, out: np.ndarray, rng: np.random.Generator) -> None:
    from ..transforms import decode_rgb

    # stored pixels: a writable copy, as a decoded image would be (a transform may write it)
    img = np.array(data) if isinstance(data, np.ndarray) else decode_rgb(data)
    result = np.asarray(spec.transform(img, rng))
    if result.shape != out.shape:
        raise ValueError(f"the transform returned shape {result.shape}, but the first record "
                         f"gave {out.shape}; batches need equal shapes (end the transform "
                         "with a fixed-size crop such as CenterCrop/RandomResizedCrop)")
    np.copyto(out, result, casting="same_kind")
