"""Walking a tar's members to its proven end.

NOTE [ proven end ]
Python's tarfile takes a member header it cannot parse (damaged, or cut short) as the
end of the archive when it is not the first one, and never reads a gzip stream to its
end, where the CRC-32 and length are checked: a damaged download would become a
smaller dataset, without a word.  So when tarfile says "no more members", the walk
checks what it stopped at: from there to the end of the stream there must be at least
one zero block (tar's end-of-archive marker; writers add two, then pad with zeros to
a record) and then nothing but zeros.  Reading those last bytes also reads a gzip
stream to its end, so its trailer is checked (and anything after it refused).  The
tail is a few KiB: the check adds no pass over the data.
"""
from __future__ import annotations

import gzip
import tarfile
import zlib
from typing import Iterator

from .compressed import CorruptStreamError
from ..errors import DamagedArchiveError, FormatError

__all__ = ["Walk", "LinkError", "STREAM_ERRORS", "BLOCK"]

BLOCK = 512
#: What a damaged or cut tar or gzip stream raises while it is read.
STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, tarfile.TarError, CorruptStreamError)
_CHUNK = 1 << 20


class LinkError(FormatError):
    """A link inside an archive (read front to back, links are not followed)."""


class Walk:
    """The walk of one archive (``where`` names it in messages): its members, and the
    last one read, which errors name."""

    def __init__(self, where: str):
        self.where = where
        self.last: str | None = None

    def damaged(self, offset: int | None, what: str) -> DamagedArchiveError:
        at = f" at byte {offset:,}" if offset is not None else ""
        last = repr(self.last) if self.last is not None else "none"
        return DamagedArchiveError(
            f"{self.where}: damaged or cut short{at}: {what} (last member read: {last}); "
            "download or copy it again (`tar -tvf` shows the damage; `gzip -t`, `bzip2 -t`, "
            "`xz -t` or `zstd -t` that of a compressed one)")

    def members(self, tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
        """The members of ``tf`` in order, without the TarFile keeping a list of them (1.28 M
        TarInfos would hold ~1 GB); at the end, the end is proven (NOTE [ proven end ])."""
        while True:
            try:
                m = tf.next()
            except STREAM_ERRORS as e:
                raise self.damaged(tf.offset, _reason(e)) from None
            if m is None:
                self.check_end(tf)
                return
            tf.members.clear()
            self.last = m.name
            if ".." in m.name.split("/"):
                raise FormatError(
                    f"{self.where}: member {m.name} has a '..' in its path (extraction refuses "
                    "it: it would be written outside the folder); rebuild the archive with "
                    "paths relative to its top folder (tar -C DIR .)")
            if (m.islnk() or m.issym()) and not m.name.rsplit("/", 1)[-1].startswith("."):
                raise LinkError(
                    f"{self.where}: member {m.name} is a {'hard' if m.islnk() else 'symbolic'} "
                    f"link to {m.linkname}; archives are read front to back once and links "
                    "are not followed (nor skipped: the extracted tree would hold the file): "
                    "extract the archive and preprocess the folder, or rebuild the archive "
                    "without links (tar --hard-dereference --dereference)")
            yield m

    def check_end(self, tf: tarfile.TarFile) -> None:
        """NOTE [ proven end ]: ``tf`` stopped at ``tf.offset``; it must be an
        end-of-archive block followed by nothing but zeros to the stream's end."""
        f, start = tf.fileobj, tf.offset
        try:
            f.seek(start)
            zeros = 0
            while chunk := f.read(_CHUNK):
                stripped = chunk.lstrip(b"\0")
                if stripped:
                    at = zeros + len(chunk) - len(stripped)
                    if at < BLOCK:
                        raise self.damaged(start, "this member header is not a valid header "
                                                  "(a damaged header, or the data of a member "
                                                  "cut short before it)")
                    raise self.damaged(start + at, "data after an end-of-archive block at byte "
                                                   f"{start:,} (a zeroed member header, or "
                                                   "something appended to the archive)")
                zeros += len(chunk)
        except STREAM_ERRORS as e:
            raise self.damaged(start, _reason(e)) from None
        if zeros < BLOCK:
            raise self.damaged(start + zeros, "the archive ends without its end-of-archive "
                                              "blocks (cut short)")


def _reason(e: BaseException) -> str:
    if isinstance(e, EOFError):
        return "the compressed stream ends early (cut short)"
    if isinstance(e, tarfile.ReadError) and "unexpected end of data" in str(e):
        return "the archive ends inside a member's data (cut short)"
    if isinstance(e, gzip.BadGzipFile) and "CRC" in str(e):
        return f"gzip CRC-32 check failed ({e})"
    return f"{type(e).__name__}: {e}"
