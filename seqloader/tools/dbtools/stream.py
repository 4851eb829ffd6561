"""Reading the records a tool copies: chosen records of one or more databases, in
their order, with large sequential reads (NOTE [ reading a selection ])."""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ...errors import FormatError
from ...format.checksum import EMPTY_CHECKSUM, chain_checksum, record_digest
from ...format.keys import encode_key
from ...format.meta import DIGEST_BYTES, digest_entry, meta_digests
from ...read.database import Database
from ...read.reader import RangeReader
from .copier import relabel

__all__ = ["Selection", "RecordStream", "SourceCheck", "runs", "plan_fingerprint", "BRIDGE_BYTES"]

#: Skipped records between two chosen ones are read through (and dropped) rather than
#: seeked over when they are fewer bytes than this: a seek costs a disk ~10 ms, the
#: time it reads ~1.5 MB (NOTE [ reading a selection ]).
BRIDGE_BYTES = 2 << 20


# NOTE [ reading a selection ]
# A tool reads the records it keeps in the database's order, as the Loader's reader
# does (RangeReader: 16 MiB reads ahead of the cursor through the page cache).  Kept
# records are grouped into ranges; where the records skipped between two ranges
# hold less than BRIDGE_BYTES, the ranges are bridged and the skipped records read
# and dropped: a subset of 10 % of the records, spread evenly through a shuffled
# file, then reads the file as one sequential stream at the disk's bandwidth instead
# of seeking to every record (~100 seeks/s on a disk: 11 MB/s of 110 KB records).


# NOTE [ checked sources ]
# A copy must not turn a damaged source into an output that passes verify (its chain
# is computed over the bytes read).  So every record read is checked against its
# source: against the file's digest table (NOTE [ record digests ]) where it has one;
# in a file of an older writer (no table), by recomputing the file's checksum chain
# when the whole file is read from its first record on, in order (reshard, merge,
# export of everything; a subset whose reads bridge the whole file), failing at its
# last record.  A subset of an older file read in parts is not checked (docs/tools.md).
# The error stops the copy before the output is completed.


class SourceCheck:
    """Checks the records of one database as they are read (NOTE [ checked sources ])."""

    def __init__(self, db: Database):
        self.db = db
        self.offsets = np.asarray(db.offsets, np.int64)
        self.tables = [meta_digests(m, where=str(p)) for m, p in zip(db.metas, db.paths)]
        self._chain: dict[int, tuple[int, str]] = {}  # shard -> (next local key, chain so far)
        self._unchecked: set[int] = set()

    def _fail(self, s: int, what: str) -> None:
        path = self.db.paths[s]
        raise FormatError(f"{path}: {what}: the source file is damaged. Restore it or re-create "
                          f"it (`seqloader verify {path}` shows the damage); the output was not "
                          "completed")

    def __call__(self, index: int, value: bytes | memoryview) -> None:
        s = int(np.searchsorted(self.offsets, index, "right")) - 1
        local = index - int(self.offsets[s])
        meta = self.db.metas[s]
        digest = record_digest(value, meta.checksum_algorithm)
        table = self.tables[s]
        if table is not None:
            if digest_entry(digest) != table[local * DIGEST_BYTES:(local + 1) * DIGEST_BYTES]:
                self._fail(s, f"record {local} does not match its digest in the file's metadata")
            return
        nxt, chain = self._chain.get(s, (0, EMPTY_CHECKSUM))
        if local != nxt:  # (not read in order from the first record: not checked)
            self._chain.pop(s, None)
            if s not in self._unchecked:
                self._unchecked.add(s)
                if len(self._unchecked) == 1:
                    warnings.warn(f"{self.db.paths[s]} was written by an older seqloader (no "
                                  "record digests) and is read in part: its records are not "
                                  f"checked; run `seqloader verify {self.db.paths[s]}` first",
                                  stacklevel=2)
            return
        chain = chain_checksum(chain, encode_key(local), digest, meta.checksum_algorithm)
        if local + 1 == meta.num_records:
            self._chain.pop(s, None)
            if chain != meta.checksum:
                self._fail(s, "its records do not match the checksum in its metadata")
        else:
            self._chain[s] = (local + 1, chain)


@dataclass
class Selection:
    """Records ``indices`` (global, ascending) of ``db``, in that order; ``label_map``
    (old label -> new, an int array) rewrites each record's label, None keeps it."""

    db: Database
    indices: np.ndarray
    label_map: np.ndarray | None = None


def runs(indices: np.ndarray, bridge: int = 0) -> list[tuple[int, int]]:
    """Ascending ``indices`` as ``[start, stop)`` ranges; gaps of at most ``bridge``
    records are included in a range."""
    if not len(indices):
        return []
    cut = np.flatnonzero(np.diff(indices) > bridge + 1)
    starts = np.concatenate([[0], cut + 1])
    stops = np.concatenate([cut, [len(indices) - 1]])
    return [(int(indices[a]), int(indices[b]) + 1) for a, b in zip(starts, stops)]


class RecordStream:
    """The values of a concatenation of :class:`Selection` s, by output position: a
    ``values(start, stop)`` for :func:`~.copier.write_copy`.  Opens one reader per
    database, in this process; :meth:`close` closes them."""

    def __init__(self, parts: Sequence[Selection]):
        self.parts = list(parts)
        self.cum = np.concatenate([[0], np.cumsum([len(p.indices) for p in parts])]).astype(np.int64)
        self._readers: dict[int, RangeReader] = {}
        self._labels: dict[int, np.ndarray] = {}
        self._checks: dict[int, SourceCheck] = {}

    def __len__(self) -> int:
        return int(self.cum[-1])

    def labels(self) -> np.ndarray | None:
        """Every output record's label (after the parts' label maps), from the metadata;
        None when the databases hold other targets than classes."""
        out = []
        for p in self.parts:
            if p.db.metas[0].target_kind != "class":
                return None
            lab = p.db.labels()[p.indices]
            out.append(p.label_map[lab] if p.label_map is not None else lab)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _reader(self, j: int) -> RangeReader:
        if j not in self._readers:
            self._readers[j] = RangeReader(self.parts[j].db)
        return self._readers[j]

    def __call__(self, start: int, stop: int) -> Iterator[memoryview | bytes]:
        for j, p in enumerate(self.parts):
            a, b = max(start, self.cum[j]) - self.cum[j], min(stop, self.cum[j + 1]) - self.cum[j]
            if a >= b:
                continue
            want = p.indices[a:b]
            mean = max(1, p.db.image_bytes // max(1, p.db.num_records))
            labels = p.db.labels() if p.label_map is not None else None
            k = 0
            check = self._checks.setdefault(id(p.db), SourceCheck(p.db))
            for index, value in self._reader(j).read(runs(want, BRIDGE_BYTES // mean)):
                check(index, value)
                if index != want[k]:
                    continue  # a bridged record (NOTE [ reading a selection ])
                k += 1
                yield value if labels is None else relabel(value, int(p.label_map[labels[index]]))
            if k != len(want):  # pragma: no cover - invariant
                raise AssertionError(f"{k} of {len(want)} records read")

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()


def plan_fingerprint(op: str, parts: Sequence[Selection], *extra: object) -> str:
    """The fingerprint of a tool's output: its sources (their writers' fingerprints and
    checksums), the records chosen, label maps and ``extra`` options."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((op, extra)).encode())
    for p in parts:
        h.update(repr([(m.fingerprint, m.checksum) for m in p.db.metas]).encode())
        h.update(np.asarray(p.indices, "<i8").tobytes())
        if p.label_map is not None:
            h.update(np.asarray(p.label_map, "<i8").tobytes())
    return h.hexdigest()
