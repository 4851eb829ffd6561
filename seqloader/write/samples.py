"""One ``(image, target)`` sample of a user's dataset as a record value.

The per-sample half of :func:`~seqloader.write.dataset.write_dataset`: pure, and run
in its worker processes.  Images may be encoded bytes (any format the writer reads:
checked, repaired or re-encoded like files of an image folder), PIL images or HWC uint8
arrays (encoded as JPEG at ``quality``); targets go into ``"label"`` or ``"target"``
(NOTE [ targets ] in ``seqloader/format/targets.py``); with ``image_format="pixels"``
the record holds pixels (NOTE [ stored pixels ] in ``seqloader/format/pixels.py``).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import cv2
import numpy as np

from ..format.imagecheck import sniff_format
from ..format.imagesize import DEFAULT_MAX_PIXELS, over_pixel_limit
from .prepare import encode_jpeg, prepare_image, shrink
from ..format.pixels import shrink_to, to_rgb
from ..format.records import Record, pack_record
from ..format.checksum import record_digest
from ..format.targets import is_class_label
from ..format.decoders import decode_any

__all__ = ["SampleOptions", "Prepared", "prepare_sample", "class_label", "as_pair"]


@dataclass(frozen=True)
class SampleOptions:
    """How samples become records (all of it shapes the bytes written)."""

    target_kind: str = "class"
    classes: tuple[str, ...] | None = None  # class targets must index these (when given)
    image_format: str = "jpeg"
    short_side: int | None = None
    quality: int = 95
    max_size: int | None = None
    verify: bool = True
    #: NOTE [ pixel limit ]; out of the repr, which fingerprints write_dataset's databases:
    #: the writer adds it where it is not the default
    max_pixels: int | None = field(default=DEFAULT_MAX_PIXELS, repr=False)
    #: the keys of a dict sample (NOTE [ dict samples ]); not in the repr either (the
    #: dataset's identity names them where they are not these)
    image_key: str = field(default="image", repr=False)
    label_key: str = field(default="label", repr=False)


#: ``(record value, digest, decoder warning or None, label or -1)``, or
#: ``(None, reason the sample is bad, None, -1)``.
Prepared = tuple


def class_label(target: Any, where: str, classes: Sequence[str] | None) -> int:
    """``target`` as a class index; ValueError naming ``where`` and the fix otherwise."""
    if not is_class_label(target) or target < 0:
        raise ValueError(f"{where}: the target {target!r} ({type(target).__name__}) is not a "
                         "class index (an integer >= 0); pass target_kind='any' to store "
                         "targets of any kind (floats, lists, dicts, numpy arrays)")
    if classes is not None and target >= len(classes):
        raise ValueError(f"{where}: the target {target} is not an index of the {len(classes)} "
                         "classes given; pass the full class list (or none)")
    return operator.index(target)


def _from_bytes(data: bytes, opt: SampleOptions) -> tuple[bytes | None, Any, str | None, str | None]:
    """(image, shape or None, reencoded, warning) or (None, reason, None, None)."""
    too_big = over_pixel_limit(data, opt.max_pixels)  # (before any decode)
    if too_big is not None:
        return None, too_big, None, None
    if opt.image_format == "pixels" and sniff_format(data) != "jpeg":
        bgr, text, _ = decode_any(data, sniff_format(data))  # (PNG etc.: no lossy JPEG step)
        if bgr is None:
            return None, text, None, None
        rgb = shrink_to(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), opt.short_side)
        return rgb.tobytes(), rgb.shape, None, text or None
    p = prepare_image(data, verify=opt.verify, max_size=opt.max_size, quality=opt.quality,
                      max_pixels=opt.max_pixels)
    if p.data is None:
        return None, p.error or "unknown error", None, None
    if opt.image_format == "pixels":
        from .options import stored_pixels

        image, shape = stored_pixels(p.data, opt.short_side)
        return image, shape, p.reencoded, p.warning
    return p.data, None, p.reencoded, p.warning


def _from_pixels(image: Any, where: str, opt: SampleOptions) -> tuple[bytes, Any]:
    rgb = to_rgb(image, where)
    if opt.image_format == "pixels":
        rgb = shrink_to(rgb, opt.short_side)
        return np.ascontiguousarray(rgb).tobytes(), rgb.shape
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    if opt.max_size is not None and min(bgr.shape[:2]) > opt.max_size:
        bgr = shrink(bgr, opt.max_size)
    return encode_jpeg(bgr, opt.quality), None


# NOTE [ dict samples ]
# A Hugging Face ``datasets.Dataset`` yields dicts, ``{"image": ..., "label": ...}``: the
# image under ``image_key``, the target under ``label_key``.  Its image is a PIL image
# (decoded), or ``{"bytes": ..., "path": ...}`` (``cast_column(..., Image(decode=False))``):
# the bytes, else the file at the path.


def as_pair(sample: Any, where: str, opt: SampleOptions) -> Any:
    """``sample`` as an ``(image, target)`` pair: a dict's two keys (NOTE [ dict samples ]);
    anything else as it is."""
    if not isinstance(sample, Mapping):
        return sample
    missing = [k for k in (opt.image_key, opt.label_key) if k not in sample]
    if missing:
        raise TypeError(f"{where}: a dict sample without {missing} (its keys: "
                        f"{sorted(map(str, sample))[:8]}); name the image and label keys with "
                        "image_key= and label_key=")
    image = sample[opt.image_key]
    if isinstance(image, Mapping) and ("bytes" in image or "path" in image):
        if image.get("bytes") is not None:
            image = image["bytes"]
        elif image.get("path"):
            with open(image["path"], "rb") as f:
                image = f.read()
        else:
            raise ValueError(f"{where}: the image dict has neither bytes nor a path")
    return image, sample[opt.label_key]


def prepare_sample(sample: Any, where: str, opt: SampleOptions) -> Prepared:
    """The record of one dataset sample ``(image, target)`` or dict (NOTE [ dict samples
    ]) (see :data:`Prepared`).  Undecodable image bytes make it a bad sample; a sample
    that is not a pair, an image or target of a type that cannot be stored raise
    TypeError/ValueError naming ``where`` (a mistake in the dataset, not in one image)."""
    sample = as_pair(sample, where, opt)
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise TypeError(f"{where}: a sample must be an (image, target) pair, got "
                        f"{type(sample).__name__}" + (f" of {len(sample)}" if isinstance(
                            sample, (tuple, list)) else ""))
    image, target = sample
    label = -1
    if opt.target_kind == "class":
        label = class_label(target, where, opt.classes)
    elif target is None:
        raise ValueError(f"{where}: the target is None; store a value (e.g. -1, [] or {{}})")
    reencoded = warning = None
    if isinstance(image, (bytes, bytearray, memoryview)):
        data, shape, reencoded, warning = _from_bytes(bytes(image), opt)
        if data is None:
            return None, shape, None, -1
    else:
        data, shape = _from_pixels(image, where, opt)
    rec = Record(data, label, reencoded=reencoded, shape=shape,
                 target=target if opt.target_kind == "any" else None)
    try:
        value = pack_record(rec)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"{where}: {e}") from None
    return value, record_digest(value), warning, label
