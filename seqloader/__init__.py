"""seqloader: fast sequential ImageNet-scale loading from LMDB, for PyTorch.

Explicit re-exports only; see the submodules for the code.
"""
__version__ = "0.1.0"

from .dataflow import (BatchData, DataFlow, LMDBData, LocallyShuffleData, MapData,
                       MapDataComponent, MultiProcessMapData)
from .database import Database, open_database
from .format import FORMAT_VERSION, FormatError, IncompleteError, Meta, Record
from .loader import DEFAULT_CACHE, DEFAULT_CHUNK, ImagenetLoader, Loader
from .parallel import WorkerDiedError, WorkerError
from .preprocess import preprocess
from .scan import Scan, scan_class_tree, scan_labelled_folder
from .writer import BadImageError, WriteOptions, WriteReport, write_split

__all__ = [
    "__version__", "Database", "open_database", "FORMAT_VERSION", "FormatError",
    "IncompleteError", "Meta", "Record", "preprocess", "Scan", "scan_class_tree",
    "scan_labelled_folder", "BadImageError", "WriteOptions", "WriteReport", "write_split",
    "Loader", "ImagenetLoader", "DEFAULT_CACHE", "DEFAULT_CHUNK", "WorkerError",
    "WorkerDiedError", "DataFlow", "LMDBData", "LocallyShuffleData", "MapData",
    "MapDataComponent", "BatchData", "MultiProcessMapData",
]
