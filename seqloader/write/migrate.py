"""Read the original sequential loader's / tensorpack's LMDB files as a stream source.

tensorpack's ``LMDBSerializer.save`` stores each datapoint under the key
``'{:08}'.format(i)``, serialised with pickle (the default) or msgpack (with
msgpack-numpy's array encoding), and the list of keys under ``__keys__``.  The
original loader's datapoints are ``[jpeg bytes as a uint8 array, label]``.

NOTE [ restricted unpickling ]
Unpickling runs whatever callable the pickle names: a downloaded database could
run ``os.system``.  :func:`safe_loads` resolves only the names numpy's array and
scalar pickles use (and ``_codecs.encode``, which Python 2's protocol-2 pickles of
byte strings use), refuses arrays of Python objects, and checks that the result
holds only arrays, numbers, strings, bytes, lists, tuples and dicts.  Anything
else is an :class:`UnsafePickleError` naming the refused global, before it runs.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Iterator

import msgpack
import numpy as np

from .sources import ClassSeen, Item, Source
from ..errors import FormatError
from ..read.lmdbwalk import walk_lmdb

__all__ = ["TensorpackLMDB", "UnsafePickleError", "safe_loads", "decode_datapoint",
           "read_class_names"]

KEYS_KEY = b"__keys__"


class UnsafePickleError(FormatError, pickle.UnpicklingError):
    """A pickle names something other than numpy arrays and plain values, or asks for
    more memory than its own size could fill (refused before anything runs or is
    allocated)."""


def _dtype(*args: Any) -> np.dtype:
    dt = np.dtype(*args)
    if dt.hasobject:
        raise UnsafePickleError(f"refused an array of Python objects (dtype {dt}): only plain "
                                "numeric/bytes arrays are read")
    return dt


_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(0))[0]


def _nbytes(shape: Any, dtype: Any) -> int:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        raise UnsafePickleError(f"refused an array of shape {shape!r}")
    return int(np.prod(dims, dtype=object)) * _dtype(dtype).itemsize


class _Arrays:
    """numpy's array constructors for one pickle of ``limit`` bytes: an array it asks for
    must fit in its own bytes (a real array pickle carries its data), so a few bytes
    asking for a 1 TiB array are refused before anything is allocated."""

    def __init__(self, limit: int):
        self.limit = limit

    def check(self, shape: Any, dtype: Any) -> None:
        n = _nbytes(shape, dtype)
        if n > self.limit:
            raise UnsafePickleError(f"refused an array of {n:,} bytes (shape {shape!r}) from a "
                                    f"pickle of {self.limit:,} bytes")

    def ndarray(self, shape: Any = (0,), dtype: Any = float, *a: Any, **k: Any) -> np.ndarray:
        self.check(shape, dtype)
        return np.ndarray(shape, _dtype(dtype), *a, **k)

    def reconstruct(self, subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        if subtype != self.ndarray and subtype is not np.ndarray:
            raise UnsafePickleError(f"refused to build a {subtype!r}")
        self.check(shape, dtype)
        return _RECONSTRUCT(np.ndarray, shape, dtype)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "dtype"): _dtype,
    ("numpy", "ndarray"): "ndarray",  # per pickle: _Arrays
    ("_codecs", "encode"): None,  # resolved below (py2 protocol-2 byte strings)
}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_mod, "_reconstruct")] = "reconstruct"
    _ALLOWED[(_mod, "scalar")] = np.int64(0).__reduce__()[0]
for _mod in ("numpy.core.numeric", "numpy._core.numeric"):
    _ALLOWED[(_mod, "_frombuffer")] = np.zeros(1).__reduce_ex__(5)[0]


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    import codecs

    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1", "utf-8", "ascii"):
        raise UnsafePickleError(f"refused _codecs.encode({type(obj).__name__}, {encoding!r})")
    return codecs.encode(obj, encoding, errors)


_ALLOWED[("_codecs", "encode")] = _codecs_encode


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data), encoding="latin1")
        self.arrays = _Arrays(len(data))

    def find_class(self, module: str, name: str) -> Any:
        fn = _ALLOWED.get((module, name))
        if isinstance(fn, str):
            return getattr(self.arrays, fn)
        if fn is None:
            raise UnsafePickleError(
                f"refused to load global {module}.{name}: this reader builds only numpy arrays "
                "and plain values (NOTE [ restricted unpickling ]); the record is not a "
                "tensorpack image datapoint, or the file was tampered with")
        return fn

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused a persistent id in a pickle")


_PLAIN = (int, float, bool, str, bytes, bytearray, type(None), np.generic)


def _check(obj: Any, depth: int = 0) -> None:
    if depth > 32:
        raise UnsafePickleError("refused a pickle nested more than 32 levels deep")
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise UnsafePickleError(f"refused an array of dtype {obj.dtype}")
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _check(x, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _check(k, depth + 1)
            _check(v, depth + 1)
    elif not isinstance(obj, _PLAIN):
        raise UnsafePickleError(f"refused a {type(obj).__name__} in a pickle")


def safe_loads(data: bytes) -> Any:
    """``pickle.loads`` restricted to numpy arrays and plain values (NOTE [ restricted
    unpickling ]); :class:`UnsafePickleError` for anything else."""
    obj = _RestrictedUnpickler(data).load()
    _check(obj)
    return obj


def _msgpack_hook(d: dict) -> Any:
    """msgpack-numpy's array / scalar encoding (keys as bytes or str)."""
    def get(k: str) -> Any:
        return d.get(k.encode(), d.get(k))

    if get("nd") is True:
        return np.frombuffer(get("data"), _dtype(get("type"))).reshape(get("shape"))
    if get("nd") is False:
        return np.frombuffer(get("data"), _dtype(get("type")))[0]
    return d


def decode_datapoint(value: bytes, where: str = "a record") -> Any:
    """A tensorpack LMDB value: pickle (protocol 2+ starts with 0x80; protocols 0 and 1
    are tried when msgpack fails) or msgpack.  :class:`~seqloader.errors.FormatError`
    naming ``where`` for anything else (:class:`UnsafePickleError` for a refused pickle)."""
    try:
        if value[:1] == b"\x80":
            return safe_loads(value)
        try:
            return msgpack.unpackb(value, object_hook=_msgpack_hook, raw=False,
                                   strict_map_key=False)
        except Exception as e:
            packed = e
        try:
            return safe_loads(value)
        except UnsafePickleError:
            raise
        except Exception as e:
            raise FormatError(f"{where}: neither msgpack ({packed}) nor pickle ({e}); is this a "
                              "tensorpack LMDB of [image, label] datapoints?") from None
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{where}: {e}") from None
    except FormatError:
        raise
    except Exception as e:  # (a damaged pickle: any of a dozen exception types)
        raise FormatError(f"{where}: cannot be decoded ({type(e).__name__}: {e}); the file is "
                          "damaged, or not a tensorpack LMDB of [image, label] datapoints") from None


def _image_and_label(dp: Any, where: str) -> tuple[bytes, int]:
    if not isinstance(dp, (list, tuple)) or len(dp) < 2:
        raise ValueError(f"{where}: a datapoint of {type(dp).__name__}, not [image, label, ...]"
                         "; this file was not written by the sequential loader's preprocessing")
    img, label = dp[0], dp[1]
    if isinstance(img, np.ndarray):
        if img.dtype != np.uint8 or img.ndim != 1:
            raise ValueError(f"{where}: the image is a {img.dtype} array of shape {img.shape}, "
                             "not encoded bytes (uint8, 1-D); decoded pixels are not supported")
        img = img.tobytes()
    elif isinstance(img, bytearray):
        img = bytes(img)
    if not isinstance(img, bytes):
        raise ValueError(f"{where}: the image is a {type(img).__name__}, not encoded bytes")
    if isinstance(label, np.ndarray) and label.size == 1:
        label = label.item()
    if isinstance(label, np.generic):
        label = label.item()
    if not isinstance(label, int) or isinstance(label, bool) or label < 0:
        raise ValueError(f"{where}: label {label!r} is not a non-negative integer")
    return img, label


class TensorpackLMDB(Source):
    """The datapoints of tensorpack LMDB files (a ``.lmdb`` file or an LMDB folder), in
    key order; records are named ``<file>/<key>``.  Classes are ``"0"``, ``"1"``, ...
    unless ``classes`` names them (labels are indices into it)."""

    kind = "tensorpack-lmdb"

    def index_classes(self, max_label: int) -> list[str]:
        return [str(i) for i in range(max_label + 1)]

    def events(self, cursor: list) -> Iterator[tuple[Item | ClassSeen, list]]:
        from ..format.keys import META_KEY

        start_file = cursor[0] if cursor else 0
        self._pos = sum(self._file_sizes[:start_file])
        for k in range(start_file, len(self.files)):
            path = self.files[k]
            base = sum(self._file_sizes[:k])
            after = bytes.fromhex(cursor[1]) if cursor and k == start_file else None
            # read with pread, every page checked, never mapped (NOTE [ foreign LMDB files ])
            for n, (key, value, end) in enumerate(walk_lmdb(str(path), after)):
                if n == 0 and after is None and key == META_KEY:
                    raise ValueError(f"{path} is already a seqloader database; read it with "
                                     "seqloader.Loader (or `seqloader info`)")
                if key == KEYS_KEY:
                    continue
                where = f"{path} record {key.decode('latin1')!r}"
                img, label = _image_and_label(decode_datapoint(value, where), where)
                self._pos = base + min(self._file_sizes[k], end)
                yield (Item(f"{path.name}/{key.decode('latin1')}", label, img),
                       [k, key.hex()])
            self._pos = sum(self._file_sizes[:k + 1])


def read_class_names(path: str | Path) -> list[str]:
    """One class name per line (label i is line i), e.g. the sorted ImageNet WordNet ids."""
    names = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: class names repeat; give each class once, in label order")
    return names

