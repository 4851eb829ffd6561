"""How a record stores a target that is not a class index.

NOTE [ targets ]
A database's :attr:`~seqloader.format.meta.Meta.target_kind` says what its records' targets are:

* ``"class"``: ``"label"``, an int in ``[0, len(Meta.classes))`` -- the version-2 record
  every seqloader reads; the Loader batches labels as an int64 tensor.
* ``"any"``: ``"target"`` instead, any value msgpack encodes -- None, bool, int, float,
  str, bytes, lists and maps with string keys, nested -- where a numpy array (also a
  numpy scalar or a torch tensor, stored as its array) is the tagged map
  ``{"__ndarray__": raw bytes in C order, "dtype": numpy's dtype string, little-endian
  ("<f4", "|u1", "|b1"), "shape": [d0, d1, ...]}``.  A plain map rather than a msgpack
  extension type, so any msgpack reader (any language) reads it without a hook.  A
  target map with the key ``"__ndarray__"`` of its own is refused at write.  Such a
  file is format version 3: older seqloaders refuse it ("upgrade") instead of misreading.

Tuples come back as lists (msgpack has one array type): ``default_collate`` batches
both alike.  A numpy scalar comes back as a 0-d array; batched, both give the same
tensor.  Only numeric and boolean dtypes (kinds ``b i u f c``): an object array would
need pickle, which seqloader never reads.
"""
from __future__ import annotations

import numbers
import sys
from typing import Any

import numpy as np

from ..errors import FormatError

__all__ = ["NDARRAY_TAG", "TARGET_KINDS", "encode_target", "decode_target", "is_class_label"]

#: The key that marks a map as an encoded numpy array.
NDARRAY_TAG = "__ndarray__"
#: Values of ``Meta.target_kind`` (NOTE [ targets ]).
TARGET_KINDS = ("class", "any")
_KINDS = frozenset("biufc")
_MAX_DEPTH = 64


def is_class_label(value: Any) -> bool:
    """Whether ``value`` can be a class index: an integer (Python or numpy), not a bool."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _array(a: np.ndarray, where: str) -> dict[str, Any]:
    if a.dtype.kind not in _KINDS:
        raise TypeError(f"{where}: a numpy array of dtype {a.dtype} cannot be stored; targets "
                        "hold numeric or boolean arrays (convert it, e.g. .astype(np.float32))")
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    data = np.ascontiguousarray(a, dt)
    return {NDARRAY_TAG: data.tobytes(), "dtype": dt.str, "shape": list(a.shape)}


def encode_target(value: Any, where: str = "target", _depth: int = 0) -> Any:
    """``value`` as msgpack packs it into a record's ``"target"`` (NOTE [ targets ]):
    numpy arrays, numpy scalars and torch tensors become tagged maps, tuples lists.
    Raises TypeError naming ``where`` and the offending type for anything else
    (sets, objects, non-string map keys, object arrays)."""
    if _depth > _MAX_DEPTH:
        raise TypeError(f"{where}: nested more than {_MAX_DEPTH} levels (a cycle?)")
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, np.generic):
        if not -2**63 <= value < 2**64:
            raise TypeError(f"{where}: the integer {value} does not fit in 64 bits; store it "
                            "as a string or a float")
        return int(value)
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic):
        return _array(np.asarray(value), where)
    if isinstance(value, np.ndarray):
        return _array(value, where)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _array(value.detach().cpu().numpy(), where)
    if isinstance(value, (list, tuple)):
        return [encode_target(v, f"{where}[{i}]", _depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: map key {k!r} is a {type(k).__name__}; target maps "
                                "need string keys (msgpack maps read back as dicts of str)")
            if k == NDARRAY_TAG:
                raise TypeError(f"{where}: the key {NDARRAY_TAG!r} is reserved for numpy arrays "
                                "in stored targets; rename it")
            out[k] = encode_target(v, f"{where}[{k!r}]", _depth + 1)
        return out
    raise TypeError(f"{where}: a {type(value).__name__} cannot be stored as a target; use "
                    "numbers, strings, lists, dicts with string keys or numeric numpy arrays")


def decode_target(obj: Any, where: str = "target") -> Any:
    """Inverse of :func:`encode_target` on what msgpack unpacked: tagged maps become
    writable numpy arrays.  Raises :class:`FormatError` naming ``where`` for a tagged map
    whose bytes do not match its dtype and shape."""
    if isinstance(obj, list):
        return [decode_target(v, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if NDARRAY_TAG not in obj:
        return {k: decode_target(v, where) for k, v in obj.items()}
    try:
        dt = np.dtype(obj["dtype"])
        shape = tuple(int(d) for d in obj["shape"])
        data = obj[NDARRAY_TAG]
        if dt.kind not in _KINDS or not isinstance(data, bytes):
            raise ValueError(f"dtype {dt}, data of type {type(data).__name__}")
        n = int(np.prod(shape, dtype=np.int64))
        if len(data) != n * dt.itemsize:
            raise ValueError(f"{len(data)} bytes for shape {shape} of {dt}")
        # (a copy: writable, so torch.as_tensor takes it without a warning)
        return np.frombuffer(data, dt, count=n).reshape(shape).copy()
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(f"{where}: a stored numpy array is malformed ({e}); the file is "
                          "damaged or not written by seqloader: re-create it") from None
