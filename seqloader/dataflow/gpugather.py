"""The worker side of GPU decoding (``Loader(decode="gpu")``): gather a batch for the
device instead of decoding it.

NOTE [ GPU batches ]
With GPU decoding a worker does not decode.  For each record of its batch it finds the
image's bytes inside the record (:func:`~seqloader.format.records.image_span`: no
unpacking, no copy -- the feed thread's ``pread`` into the batch buffer was the one
copy of the image), reads the JPEG header and draws the sample's crop and flip with
:meth:`FusedPipeline.plan <seqloader.transforms.fused.FusedPipeline.plan>`, the very
call the fused CPU path makes, from the same batch generator in the same record order:
the boxes and flips are those of ``decode="cpu"``, a pure function of (seed, epoch,
rank, batch).  It writes one row of :data:`PARAMS` per sample; the main process then
decodes the images straight from the buffer, batched (nvJPEG), and renders them with
the same boxes (:mod:`seqloader.transforms.gpu`).

What nvJPEG does not decode on the GPU's hardware path -- non-JPEG data, grayscale and
CMYK JPEGs, progressive / arithmetic / lossless / 12-bit JPEGs, stored pixels -- is
rendered here by the fused CPU path as it would be with ``decode="cpu"`` (uint8, before
normalisation) into the sample's pixel area, and counted by reason (:data:`REASONS`).
Progressive JPEGs would decode on the GPU too, but torchvision Huffman-decodes them on
the calling thread one by one: the main process's CPU, serially, so they are left to
the workers unless :class:`GPUOptions` asks otherwise.

A sample is ``[params: PARAMS float64][pixels: H x W x 3 uint8]`` (padded to 8 bytes),
and the records lie *after* the samples region (``BatchSpec.keeps_inputs``): the main
process reads them once the worker is done, so no sample may overwrite them (NOTE
[ batch buffer layout ] for the decode mode, where they may).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import operator

import msgpack
import numpy as np

from ..format.jpeg import jpeg_frame
from ..format.pixels import image_source
from ..format.records import IMAGE_HEAD, LABEL_TAIL, image_span, label_at
from ..transforms.geometry import ResizeCropGeometry, resized_size
from .batch import BatchSpec
from .decode import check_pixels, record_error
from .decodemode import DecodeMode

__all__ = ["GPUOptions", "GatherMode", "PARAMS", "COLUMNS", "REASONS", "ON_GPU", "sample_nbytes",
           "params_view", "pixels_view", "classify", "gather_batch"]

#: The columns of a sample's parameter row (float64; integers are exact).
COLUMNS = ("kind", "index", "offset", "length", "height", "width", "y0", "x0", "y1", "x1",
           "oy0", "ox0", "oy1", "ox1", "flip", "rh", "rw", "pad")
PARAMS = len(COLUMNS)
C = {name: i for i, name in enumerate(COLUMNS)}

#: ``kind`` of a sample the main process decodes; any other value is a :data:`REASONS` key.
ON_GPU = 0
#: Why a sample was rendered on the CPU instead (the ``kind`` column).
REASONS = {1: "not a JPEG", 2: "grayscale JPEG", 3: "CMYK or other component count",
           4: "progressive, arithmetic-coded or lossless JPEG", 5: "not 8-bit",
           6: "stored pixels", 7: "not in the batch buffer"}


@dataclass(frozen=True)
class GPUOptions:
    """How ``Loader(decode="gpu")`` decodes and delivers (``decode=GPUOptions(...)``).

    ``dtype``: of the normalised batch (``torch.float32``, ``torch.bfloat16`` or
    ``torch.float16``; a recipe without ``ToTensor`` yields uint8 NHWC whatever this
    says).  ``channels_last``: the batch in ``torch.channels_last`` memory format.
    ``gray``: decode grayscale JPEGs on the GPU too (else the workers do).
    ``progressive``: decode progressive JPEGs on the GPU too (torchvision then
    Huffman-decodes each on the main process's CPU, one at a time: NOTE [ GPU batches ]).
    ``decoded_bytes``: device memory for decoded, not yet rendered images (bytes, at
    full resolution, 3 per pixel); a batch that needs more is decoded in parts, and one
    image larger than this alone (NOTE [ GPU stream ])."""

    dtype: Any = None  # None: torch.float32 (torch is not imported here)
    channels_last: bool = False
    gray: bool = False
    progressive: bool = False
    decoded_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if (isinstance(self.decoded_bytes, bool) or not isinstance(self.decoded_bytes, int)
                or self.decoded_bytes < 1):
            raise ValueError(f"GPUOptions(decoded_bytes={self.decoded_bytes!r}): give the device "
                             "memory for decoded images in bytes, e.g. 1 << 30 (1 GiB)")


def sample_nbytes(out_hw: tuple[int, int]) -> int:
    """Bytes of one gathered sample: its parameter row and a uint8 HWC image."""
    n = PARAMS * 8 + out_hw[0] * out_hw[1] * 3
    return -(-n // 8) * 8


def params_view(samples: np.ndarray) -> np.ndarray:
    """The ``(n, PARAMS)`` float64 rows of a ``(n, sample_nbytes)`` uint8 samples view."""
    return samples[:, :PARAMS * 8].view(np.float64)


def pixels_view(samples: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """The ``(n, H, W, 3)`` uint8 pixel areas of a samples view (CPU-rendered samples)."""
    h, w = out_hw
    return samples[:, PARAMS * 8:PARAMS * 8 + h * w * 3].reshape(-1, h, w, 3)


def classify(image: Any, options: GPUOptions) -> tuple[int, Any]:
    """``(kind, frame)`` of encoded ``image``: :data:`ON_GPU` when nvJPEG's batched
    decode takes it (8-bit baseline / extended Huffman JPEG, 3 components -- or 1 with
    ``options.gray``), else the :data:`REASONS` key."""
    if isinstance(image, np.ndarray):
        return 6, None
    if len(image) < 4 or image[0] != 0xFF or image[1] != 0xD8:
        return 1, None
    frame = jpeg_frame(image)
    if frame is None or frame.height == 0 or frame.width == 0:
        return 1, None
    if image[frame.offset + 4] != 8:
        return 5, frame
    if frame.marker not in (0xC0, 0xC1) and not (frame.marker == 0xC2 and options.progressive):
        return 4, frame
    if frame.components == 1 and not options.gray:
        return 2, frame
    if frame.components not in (1, 3):
        return 3, frame
    return ON_GPU, frame


def _locate(value: Any, base: int, size: int, pixels: bool) -> tuple[Any, int, int | None]:
    """``(image, label, offset)`` of one record value: the image as a view of the value
    and its offset in the buffer starting at address ``base`` (None when the value lies
    elsewhere), or, for stored ``pixels`` or a record of another layout, its unpacked
    image."""
    span = None if pixels else image_span(value[:IMAGE_HEAD], len(value))
    label = None if span is None else label_at(value[span[1]:span[1] + LABEL_TAIL])
    if span is None or label is None:
        rec = msgpack.unpackb(value, raw=False)
        return image_source(rec), rec["label"], None
    image = value[span[0]:span[1]]
    addr = np.frombuffer(image, np.uint8).ctypes.data if len(image) else -1
    inside = base <= addr and addr + len(image) <= base + size
    return image, label, (addr - base if inside else None)


def _path(value: Any) -> Any:
    """The source path a record names, for an error message (None if it has none)."""
    try:
        rec = msgpack.unpackb(value, raw=False)
        return rec.get("path") if isinstance(rec, dict) else None
    except Exception:
        return None


def gather_batch(spec: BatchSpec, whole: np.ndarray, values: Sequence[Any],
                 indices: Sequence[int], labels: np.ndarray, samples: np.ndarray,
                 rng: np.random.Generator) -> None:
    """Fill the ``labels`` and parameter rows of a batch whose records ``values`` (views
    of ``whole``, the batch buffer, where they can be) the main process will decode
    (NOTE [ GPU batches ]).  Records it cannot decode are rendered here, into their
    pixel areas, by ``spec.fused`` (a uint8-output FusedPipeline).  Raises
    :class:`~seqloader.errors.RecordError` naming the record, as ``decode_batch`` does."""
    fused, options = spec.fused, spec.mode.options
    base, size = whole.ctypes.data, whole.nbytes
    geo = fused.geometry if isinstance(fused.geometry, ResizeCropGeometry) else None
    rows, pixels = params_view(samples), pixels_view(samples, fused.out_hw)
    rows[:] = 0
    for i, (value, idx) in enumerate(zip(values, indices)):
        try:
            image, label, offset = _locate(value, base, size, spec.stored_pixels)
            labels[i] = (operator.index(spec.target_transform(label)) if spec.target_transform
                         else label)
            check_pixels(image, spec.max_pixels)
            kind, frame = classify(image, options)
            if kind == ON_GPU and offset is None:
                kind = 7
            row = rows[i]
            if kind == ON_GPU:
                plan = fused.plan(frame.height, frame.width, rng, jpeg=False)
                row[C["offset"]], row[C["length"]] = offset, len(image)
            else:
                prep = fused.prepare(image, rng)
                fused.finish(prep, pixels[i])
                plan = prep.plan
            w = plan.window
            row[C["kind"]], row[C["index"]] = kind, idx
            row[C["height"]], row[C["width"]] = plan.height, plan.width
            row[C["y0"]:C["ox1"] + 1] = (w.y0, w.x0, w.y1, w.x1, w.oy0, w.ox0, w.oy1, w.ox1)
            row[C["flip"]] = plan.flip
            if geo is not None:  # (the image is resized whole, then cropped)
                row[C["rh"]], row[C["rw"]] = resized_size(plan.height, plan.width, geo.size,
                                                          geo.max_size)
        except Exception as e:
            raise record_error(e, idx, _path(value)) from e


class GatherMode(DecodeMode):
    """The workers' side of the GPU mode (:class:`~seqloader.dataflow.gpumode.GPUMode`
    pickles as this): gather each batch for the device -- no torch, no device state."""

    keeps_inputs = True
    reads_in_place = False  # (batches made in the caller's process are copied first)

    def __init__(self, options: GPUOptions):
        self.options = options

    def fill(self, spec: BatchSpec, whole: np.ndarray | None, values: Sequence[Any],
             indices: Sequence[int], labels: np.ndarray, samples: np.ndarray,
             rng: np.random.Generator | None) -> None:
        gather_batch(spec, whole, values, indices, labels, samples, rng)

    def batch_spec(self, df: Any, transform: Any, common: dict[str, Any],
                   output: str) -> tuple[BatchSpec, Any]:
        raise RuntimeError("GatherMode is the GPU mode's worker side: build a GPUMode")

    def local_batches(self, engine: Any, plan: Any, first: int) -> Any:
        raise RuntimeError("GatherMode is the GPU mode's worker side: build a GPUMode")

    def delivered(self, batches: Any, delivery: Any) -> Any:
        raise RuntimeError("GatherMode is the GPU mode's worker side: build a GPUMode")
