"""Parquet files as a stream source: Hugging Face's ``imagenet-1k`` layout, and any
parquet dataset whose image and label columns are named.

NOTE [ parquet sources ]
Hugging Face ships ``data/{train,validation,test}-NNNNN-of-NNNNN.parquet``: an
``image`` column (a struct of the encoded ``bytes`` and the original ``path``) and a
``label`` column (the class index); the schema's ``huggingface`` metadata (JSON) holds
the ``ClassLabel`` names (``info.features.label.names``), which become the database's
class names, in label order.  A file's split is its name's first word (``validation``
is val); the test split's labels are -1 (hidden), so its files are skipped, said so in
one line, and a -1 label met in a split being written is an error, never a class.
Files are read one row group at a time (bounded memory: a row group, not a file);
the cursor is ``[file index, row group, next row in it]``.  Damage is found by
Arrow's reader (the footer's magic and metadata, page headers, decompression, and
the page CRCs where the writer stored them) and by the row counts the footer gives:
one line naming the file and row group.  Other datasets name their columns
(``image_column``, ``label_column``); an image column of plain binary works too, and
labels may be class indices or class names (sorted, as ImageFolder sorts folders).

NOTE [ parquet read-ahead ]
Arrow reads a row group's column chunks with one large ``pread`` each, without the
kernel's sequential read-ahead: on a hard disk each such read waits on its own.  Before
Arrow reads a row group, its byte range is read into the page cache with 8 MiB reads on
a descriptor of ours, opened for sequential reading, so the disk streams as it does
for a tar (Arrow then reads from memory).
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import DamagedArchiveError
from .sources import ClassSeen, Cursor, Item, Source, named_or_starts

__all__ = ["ParquetSource", "is_parquet", "parquet_splits", "hf_class_names"]

_SPLIT_WORDS = {"train": "train", "validation": "val", "valid": "val", "val": "val"}


def _pq():
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("reading parquet files needs pyarrow: pip install "
                         "'seqloader[parquet]'") from None
    return pyarrow, pq


def is_parquet(path: str | Path) -> bool:
    """Whether ``path`` is a parquet file, by name or by its first bytes (``PAR1``)."""
    return named_or_starts(path, ".parquet", (b"PAR1",))


def parquet_splits(path: str | Path, split: str | None, by_name) -> list[str]:
    """``[split]`` if given; else the split in the file's name (Hugging Face's
    ``train-...``/``validation-...``, or ``by_name(path)``); ``[]`` for a ``test-...``
    file (NOTE [ parquet sources ]), with a warning."""
    if split is not None:
        return [split]
    word = Path(path).name.split("-", 1)[0].lower()
    if word == "test":
        warnings.warn(f"{Path(path).name}: skipped: the test split's labels are hidden (-1); "
                      "train and validation are written", stacklevel=3)
        return []
    return [_SPLIT_WORDS[word]] if word in _SPLIT_WORDS else [by_name(path)]


def _damaged(where: str, what: str) -> DamagedArchiveError:
    return DamagedArchiveError(f"{where}: damaged or cut short: {what}; download or copy it "
                               "again (compare its size or checksum)")


def hf_class_names(metadata: dict | None, column: str) -> list[str] | None:
    """The ``ClassLabel`` names of ``column`` in a schema's Hugging Face metadata."""
    raw = (metadata or {}).get(b"huggingface")
    if not raw:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][column]
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None


#: How far ahead of the row group being read the file is asked for (NOTE [ parquet
#: read-ahead ]).
_CHUNK = 8 << 20


def _read_ahead(fd: int, group) -> None:
    """Read a row group's bytes into the page cache in large sequential reads, on a
    descriptor of our own (NOTE [ parquet read-ahead ])."""
    cols = [group.column(j) for j in range(group.num_columns)]
    if not cols:
        return
    start = min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                for c in cols)
    end = max(c.file_offset if c.file_offset else 0 for c in cols)
    end = max(end, start + sum(c.total_compressed_size for c in cols))
    while start < end:
        got = len(os.pread(fd, min(_CHUNK, end - start), start))
        if not got:
            return
        start += got


class ParquetSource(Source):
    """The rows of parquet files (NOTE [ parquet sources ]): one image and one label each,
    from ``image_column`` and ``label_column``.  Records are named ``<class>/<file name>``
    from the image's ``path`` where it has one, else ``<parquet file>/<row>``."""

    kind = "parquet"

    def __init__(self, files: Sequence[str | Path], *, split: str = "",
                 classes: Sequence[str] | None = None, image_column: str | None = None,
                 label_column: str | None = None):
        super().__init__(files, classes=classes)
        self.split = split
        self.image_column, self.label_column = image_column or "image", label_column or "label"
        pa, pq = _pq()
        names = None
        self._rows = []
        for f in self.files:
            meta = self._open(f).metadata
            cols = meta.schema.to_arrow_schema().names
            for c, opt in ((self.image_column, "--image-column"),
                           (self.label_column, "--label-column")):
                if c not in cols:
                    raise ValueError(f"{f}: no column {c!r} (its columns: {cols[:8]}); name the "
                                     f"image and label columns with {opt} (and the other)")
            names = names or hf_class_names(meta.metadata, self.label_column)
            self._rows.append([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        if self.classes is None and names is not None:
            self.classes = names

    def _open(self, path: Path):
        pa, pq = _pq()
        try:
            return pq.ParquetFile(path, page_checksum_verification=True)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _damaged(str(path), f"no readable parquet footer ({e})") from None

    def identity(self) -> str:
        return super().identity() + repr((self.split, self.image_column, self.label_column))

    def events(self, cursor: Cursor) -> Iterator[tuple[Item | ClassSeen, Cursor]]:
        pa, _ = _pq()
        start_file = cursor[0] if cursor else 0
        total = [sum(r) or 1 for r in self._rows]
        for k in range(start_file, len(self.files)):
            path, base = self.files[k], sum(self._file_sizes[:k])
            pf = self._open(path)
            resume = cursor[1:] if cursor and k == start_file else [0, 0]
            done = sum(self._rows[k][:resume[0]])
            fd = os.open(path, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            for g in range(resume[0], len(self._rows[k])):
                where = f"{path} row group {g}"
                _read_ahead(fd, pf.metadata.row_group(g))  # NOTE [ parquet read-ahead ]
                try:
                    table = pf.read_row_group(g, columns=[self.image_column, self.label_column])
                    images, labels = self._columns(table, where)
                except (pa.ArrowException, OSError) as e:
                    raise _damaged(where, f"{type(e).__name__}: {e}") from None
                if len(labels) != self._rows[k][g]:
                    raise _damaged(where, f"{len(labels)} rows where its footer says "
                                          f"{self._rows[k][g]}")
                first = resume[1] if g == resume[0] else 0
                for row in range(first, len(labels)):
                    data, name = images[row]
                    label = self._label(labels[row], f"{path} row {done + row}")
                    if data is None:
                        raise ValueError(f"{path} row {done + row}: the image has no bytes "
                                         f"(path {name!r} only); store the images' bytes in "
                                         "the file (datasets' embed_external_files)")
                    yield Item(self._name(path, done + row, name, label), label, data), \
                        [k, g, row + 1]
                done += len(labels)
                self._pos = base + int(self._file_sizes[k] * done / total[k])
            os.close(fd)
            del pf
            self._pos = base + self._file_sizes[k]

    def _columns(self, table, where: str) -> tuple[list, list]:
        """(``(bytes, path)`` per row, labels) of one row group."""
        pa, _ = _pq()

        col = table.column(self.image_column).combine_chunks()
        if pa.types.is_struct(col.type):
            fields = [col.type.field(i).name for i in range(col.type.num_fields)]
            if "bytes" not in fields:
                raise ValueError(f"{where}: column {self.image_column!r} is a struct of "
                                 f"{fields}, without 'bytes'; name the image column with "
                                 "--image-column")
            data = col.field("bytes").to_pylist()
            paths = col.field("path").to_pylist() if "path" in fields else [None] * len(data)
        elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            data, paths = col.to_pylist(), [None] * len(col)
        else:
            raise ValueError(f"{where}: column {self.image_column!r} holds {col.type}, not "
                             "encoded images (binary, or a struct of bytes and path); name the "
                             "image column with --image-column")
        return list(zip(data, paths)), table.column(self.label_column).to_pylist()

    def _label(self, value: Any, where: str) -> int | str:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if value == -1:
            raise ValueError(f"{where}: label -1 (no label: Hugging Face's test split hides its "
                             "labels); preprocess the train and validation files only")
        raise ValueError(f"{where}: label {value!r} is not a class index (>= 0) or a class "
                         f"name; name the label column with --label-column")

    def _name(self, path: Path, row: int, image_path: str | None, label: int | str) -> str:
        if not image_path:
            return f"{path.name}/{row:08d}"
        cls = self.classes[label] if isinstance(label, int) and self.classes and \
            label < len(self.classes) else label
        return f"{cls}/{image_path.replace(chr(92), '/').rsplit('/', 1)[-1]}"
