"""seqloader: fast sequential ImageNet-scale loading from LMDB, for PyTorch.

The top level is the small public API: the :class:`Loader`, the writers
(:func:`preprocess`, :func:`write_dataset` and their :class:`WriteOptions`),
:func:`open_database`, the DataFlow stages the Loader is built from, and the one
exception hierarchy (:mod:`seqloader.errors`).  Everything else is imported from its
own module (docs/how-it-works.md has the map).  ``Loader`` needs torch and is
imported on first use, so the preprocessing CLI starts without loading torch.
"""
from .version import __version__

from .dataflow.diagnosis import DataWaitWarning, Diagnose
from .dataflow.gpugather import GPUOptions
from .dataflow.mapbatch import MultiProcessMapAndBatchData
from .dataflow.lmdbdata import LMDBData
from .dataflow.shuffle import LocallyShuffleData
from .dataflow.stats import format_stats
from .dataflow.stages import (BatchData, DataFlow, MapData, MapDataComponent,
                              MultiProcessMapData)
from .errors import (BadImageError, DeviceError, EmptyDatabaseError, FormatError, IncompleteError,
                     NoRecordsError, RecordError, RemoteAccessError, RemoteChangedError,
                     RemoteDataError, RemoteError, RemoteNotFoundError, RemoteTimeoutError,
                     RemoteUnreachableError, SeqloaderError, WorkerDiedError, WorkerError,
                     WorkerTimeoutError)
from .read.database import open_database
from .write.dataset import write_dataset
from .write.preprocess import preprocess
from .write.writer import WriteOptions

_LAZY = {"Loader": "loader", "ImagenetLoader": "loader"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'seqloader' has no attribute {name!r}: import it from its "
                         "module (see docs/how-it-works.md), e.g. seqloader.write.scan")


__all__ = [
    "__version__", "Loader", "ImagenetLoader", "GPUOptions", "Diagnose", "DataWaitWarning",
    "format_stats", "preprocess", "write_dataset", "WriteOptions",
    "open_database", "DataFlow", "LMDBData", "LocallyShuffleData", "BatchData", "MapData",
    "MapDataComponent", "MultiProcessMapData", "MultiProcessMapAndBatchData",
    "SeqloaderError", "FormatError", "IncompleteError", "EmptyDatabaseError", "NoRecordsError",
    "BadImageError", "RemoteError", "RemoteTimeoutError", "RemoteUnreachableError",
    "RemoteAccessError", "RemoteNotFoundError", "RemoteChangedError", "RemoteDataError",
    "DeviceError", "RecordError", "WorkerError", "WorkerDiedError",
    "WorkerTimeoutError",
]
