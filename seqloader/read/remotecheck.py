"""Check records read over the network as they arrive.

NOTE [ records checked on arrival ]
A remote database's bytes pass through servers, proxies and caches the reader does
not control; a wrong byte there must not become a silently wrong sample.  With
``RemoteOptions.verify`` (on by default) every record a remote reader yields is
checked against what the format says of it before anything uses it:

* in files with a digest table (``Meta.digests``, NOTE [ record digests ] in
  ``seqloader/format/meta.py``: every file this version writes), the record's digest
  must equal the table's entry: any changed byte, in the image data too, a record read
  from the wrong offset, or a file replaced under the same URL by another of the same
  size (its records are not the ones the metadata read at opening describes) fails.
  The other checks below follow from this one and are skipped;
* in older files: it unpacks as a whole (``msgpack``: the map, the image's length,
  nothing after it); its label equals the metadata's label for that record
  (``Meta.labels``); a JPEG image starts with the SOI marker.  A flipped byte inside
  an image's entropy-coded data passes these (the file's checksum is a chain over all
  of its records: only ``seqloader verify URL``, which reads every record in order,
  checks it; re-create the file to get the table).

A record that fails is read once more from the origin (``reread``: past the block
cache, whose blocks holding it are dropped), so damage in transit, or a block cached
before it was checked, costs one GET, not the run; only a record that fails twice raises
:class:`~seqloader.errors.RemoteDataError` naming the URL, the record and what differs.
The block cache stores a block only once the records wholly inside it agree with the
table (:func:`block_agrees`), so a block damaged in transit is not kept for later runs.  Cost: one SHA-256 per record (~0.5 ms of CPU per MB, 1.8-2 GB/s
with the CPU's SHA extensions; older files: one ``msgpack`` unpack), measured in
benchmarks/RESULTS.md ("Record digests").
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import msgpack
import numpy as np

from ..errors import RemoteDataError
from ..format.checksum import record_digest
from ..format.meta import DIGEST_BYTES, meta_digests
from .remotefaults import safe_url

__all__ = ["block_agrees", "checked_records"]


def block_agrees(block: memoryview, start: int, offsets: np.ndarray, lengths: np.ndarray,
                 first: int, digests: bytes | None, algorithm: str) -> bool:
    """Whether the records wholly inside ``block`` (file bytes ``[start, start +
    len(block))``) agree with the digest table; ``offsets``/``lengths`` are those of
    records ``first``, ``first + 1``... of the file (a part of a pass), in file order
    (others may go unchecked here).  True without a table (nothing to check against)."""
    if not digests:
        return True
    end = start + len(block)
    # (records lie in file order as this writer makes them: a window found by bisection;
    # a record outside it is left to the check on arrival)
    lo, hi = np.searchsorted(offsets, [start, end]).tolist()
    window = np.arange(lo, hi)
    inside = window[(offsets[lo:hi] >= start) & (offsets[lo:hi] + lengths[lo:hi] <= end)]
    for k in inside.tolist():
        local, off = first + k, int(offsets[k]) - start
        got = record_digest(block[off:off + int(lengths[k])], algorithm)[:DIGEST_BYTES]
        if got != digests[local * DIGEST_BYTES:(local + 1) * DIGEST_BYTES]:
            return False
    return True


def checked_records(pairs: Iterator[tuple[int, memoryview]], urls: Sequence[str],
                    offsets: Sequence[int], metas: Sequence,
                    reread: Callable[[int, int], bytes] | None = None
                    ) -> Iterator[tuple[int, memoryview]]:
    """``pairs`` (global index, value) passed through NOTE [ records checked on arrival ];
    ``urls``, ``offsets`` and ``metas`` describe the database's shards; ``reread(shard,
    local)`` reads a record again from the origin (None: a failure is raised at once)."""
    labels = [np.frombuffer(m.labels, "<i4") if m.labels and m.target_kind == "class" else None
              for m in metas]
    digests = [meta_digests(m, where=safe_url(u)) for m, u in zip(metas, urls)]
    jpeg = [m.image_format == "jpeg" for m in metas]

    def problem_of(shard: int, local: int, v: memoryview) -> str | None:
        table = digests[shard]
        if table is not None:
            want = table[local * DIGEST_BYTES:(local + 1) * DIGEST_BYTES]
            got = record_digest(v, metas[shard].checksum_algorithm)[:DIGEST_BYTES]
            return None if got == want else (f"its digest {got.hex()} differs from the "
                                             f"metadata's {want.hex()}")
        return _problem(v, None if labels[shard] is None else int(labels[shard][local]),
                        jpeg[shard])

    shard, lo, hi = 0, offsets[0], offsets[1]
    for i, v in pairs:
        if not lo <= i < hi:
            shard = int(np.searchsorted(offsets, i, side="right")) - 1
            lo, hi = offsets[shard], offsets[shard + 1]
        local = i - lo
        problem = problem_of(shard, local, v)
        if problem and reread is not None:  # once more from the origin, past the cache
            v = memoryview(reread(shard, local))
            problem = problem_of(shard, local, v)
            problem = problem and f"{problem} (read twice from the server)"
        if problem:
            raise RemoteDataError(
                f"{safe_url(urls[shard])} record {local} (global {i}): {problem}; the bytes "
                "read over the network are not the record the metadata describes (damaged "
                "at the server, in transit or by a proxy, or the file was replaced): run "
                "`seqloader verify` on the URL")
        yield i, v


def _problem(value: memoryview, label: int | None, jpeg: bool) -> str | None:
    try:
        d = msgpack.unpackb(value, raw=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types
        return f"does not unpack ({type(e).__name__}: {str(e)[:80]})"
    if not isinstance(d, dict) or not isinstance(d.get("image"), bytes):
        return "is not a record (no image)"
    if label is not None and d.get("label") != label:
        return f"has label {d.get('label')!r}, the metadata says {label}"
    if jpeg and "shape" not in d and not d["image"].startswith(b"\xff\xd8"):
        return "its image does not start as a JPEG"
    return None
