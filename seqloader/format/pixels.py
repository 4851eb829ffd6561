"""Stored pixels: records that hold decoded uint8 RGB pixels instead of JPEG bytes.

NOTE [ stored pixels ]
With ``Meta.image_format == "pixels"`` (format version 3) a record's ``"image"`` is an
HWC uint8 **RGB** array's bytes in C order and its ``"shape"`` is ``[h, w, 3]``.  The
writer decodes each source with the decoder the Loader uses for JPEGs
(:func:`~seqloader.transforms.decode_rgb`) and, with a short side (``Meta.writer
["short_side"]``), shrinks images whose short side is longer to it (OpenCV's
``INTER_AREA``, the aspect ratio kept; smaller ones are stored as they are: upscaling
adds bytes, not information).  Without one, the pixels are exactly those the Loader
decodes from the JPEG, so every transform gives the same samples from either database.

The Loader reads them without decoding: the transform gets a view of the record's
bytes; the fused RandomResizedCrop / Resize+CenterCrop path draws its crop on the
stored size and renders from the array (:meth:`FusedPipeline.prepare`), as it does for any
image it decodes in full.  The price is storage: 3 bytes a pixel (196 KB for 256 x
256, several times its JPEG), so it pays only where decoding, not reading, limits
the Loader (`seqloader bench --compare-formats` measures both on the
host).  Raw mode (``transform=None``) yields the arrays instead of encoded bytes.
"""
from __future__ import annotations

from typing import Any

import cv2
import numpy as np

__all__ = ["shrink_to", "to_rgb", "pixels_of", "image_source"]


def shrink_to(rgb: np.ndarray, short_side: int | None) -> np.ndarray:
    """``rgb`` with its short side shrunk to ``short_side`` (INTER_AREA, aspect kept, each
    side rounded, at least 1 px); unchanged if it is no longer than that or None."""
    h, w = rgb.shape[:2]
    if short_side is None or min(h, w) <= short_side:
        return rgb
    scale = short_side / min(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    if min(h, w) == h:  # (exact on the short side, whatever the rounding of the scale)
        size = (size[0], short_side)
    else:
        size = (short_side, size[1])
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


def to_rgb(image: Any, where: str) -> np.ndarray:
    """An image a dataset gave -- a PIL image or an HWC / HW uint8 numpy array (RGB,
    RGBA or grey) -- as a C-contiguous HWC uint8 RGB array.  TypeError/ValueError naming
    ``where`` for anything else (float arrays, CHW tensors)."""
    if hasattr(image, "convert") and hasattr(image, "mode"):  # a PIL image
        return np.ascontiguousarray(np.asarray(image.convert("RGB")))
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{where}: the image is a {type(image).__name__}; give encoded bytes, a "
                        "PIL image or an HWC uint8 numpy array")
    if image.dtype != np.uint8:
        raise ValueError(f"{where}: the image array has dtype {image.dtype}; give uint8 pixels "
                         "(0..255), e.g. (x * 255).round().astype(np.uint8)")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or 0 in image.shape:
        raise ValueError(f"{where}: the image array has shape {image.shape}; give HWC with 1, 3 "
                         "or 4 channels (a CHW array? use .transpose(1, 2, 0))")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    elif image.shape[2] == 4:
        image = image[:, :, :3]
    return np.ascontiguousarray(image)


def pixels_of(image: bytes, shape: Any) -> np.ndarray:
    """The HWC uint8 array a stored-pixels record holds: a read-only view of ``image``."""
    return np.frombuffer(image, np.uint8).reshape(shape)


def image_source(rec: dict) -> Any:
    """What a record (as msgpack unpacked it) holds as its image: a uint8 HWC array for
    stored pixels (a view of its bytes), else the encoded bytes."""
    shape = rec.get("shape")
    data = rec["image"]
    if shape is None:
        return data
    if len(shape) != 3 or shape[2] != 3 or len(data) != shape[0] * shape[1] * 3:
        raise ValueError(f"stored pixels of shape {shape} in {len(data)} bytes; the file is "
                         "damaged: check it with `seqloader verify`, or re-create it")
    return pixels_of(data, shape)
