"""seqloader: fast sequential ImageNet-scale loading from LMDB, for PyTorch.

Explicit re-exports only; see the submodules for the code.  The names that need
torch (``Loader``, ``ImagenetLoader``) are
imported on first use, so the preprocessing CLI starts without loading torch (13 s
of start-up under hddsim).
"""
__version__ = "0.2.0"

from .dataflow.stages import (BatchData, DataFlow, LMDBData, LocallyShuffleData, MapData,
                              MapDataComponent, MultiProcessMapAndBatchData, MultiProcessMapData)
from .read.database import Database, open_database
from .format.meta import FORMAT_VERSION, Meta
from .format.records import Record
from .errors import (BadImageError, EmptyDatabaseError, FormatError, IncompleteError,
                     NoRecordsError, RecordError, RemoteError, SeqloaderError, WorkerDiedError,
                     WorkerError, WorkerTimeoutError)
from .read.plan import DEFAULT_CACHE, DEFAULT_CHUNK
from .write.preprocess import preprocess
from .write.dataset import write_dataset
from .write.scan import Scan, scan_class_tree, scan_labelled_folder
from .write.writer import WriteOptions, WriteReport, write_split

_LAZY = {"Loader": "loader", "ImagenetLoader": "loader"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'seqloader' has no attribute {name!r}")

__all__ = [
    "__version__", "Database", "open_database", "FORMAT_VERSION", "FormatError",
    "IncompleteError", "Meta", "Record", "preprocess", "Scan", "scan_class_tree",
    "scan_labelled_folder", "BadImageError", "WriteOptions", "WriteReport", "write_split",
    "Loader", "ImagenetLoader", "DEFAULT_CACHE", "DEFAULT_CHUNK", "WorkerError",
    "WorkerDiedError", "DataFlow", "LMDBData", "LocallyShuffleData", "MapData",
    "MapDataComponent", "BatchData", "MultiProcessMapData", "MultiProcessMapAndBatchData",
    "EmptyDatabaseError", "NoRecordsError", "SeqloaderError", "RecordError", "RemoteError",
    "WorkerTimeoutError", "write_dataset",
]
