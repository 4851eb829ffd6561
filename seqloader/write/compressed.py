"""A compressed archive's bytes, decompressed as they are read: gzip, bzip2, xz (the
standard library) and zstd (the optional ``zstandard`` package), told apart by their
magic bytes, not by the file's name.

NOTE [ compressed streams ]
Each decompressor is read front to back once and seeks forward only (tarfile skips a
member it does not need by seeking past it: the decompressor reads through it).  A
damaged stream raises what its library raises -- bz2 an ``OSError``, xz an
``LZMAError``, zstd a ``ZstdError`` -- so every stream but gzip's (whose errors
:data:`~.tarwalk.STREAM_ERRORS` already knows) is wrapped in :class:`Checked`, which
turns those into :class:`CorruptStreamError`: one error for the walk to report as
"damaged", and an ``OSError`` of the disk itself is never taken for damage.  A stream
cut short raises ``EOFError`` (gzip, bz2, xz); a cut zstd stream just ends, and the
tar's proven end (NOTE [ proven end ] in :mod:`.tarwalk`) catches it.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma

__all__ = ["decompressed", "compression_of", "CorruptStreamError", "Checked", "ZSTD_HELP"]

#: (magic bytes, name) of the compressions read; zstd's frame magic is 28 B5 2F FD.
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
          (b"\x28\xb5\x2f\xfd", "zstd"))
#: How far back a :class:`Checked` stream can seek; the size of its forward reads.
_BACK, _CHUNK = 64 << 10, 1 << 20
ZSTD_HELP = ("reading it needs the zstandard package (pip install 'seqloader[zstd]'), or "
             "decompress it first (zstd -d FILE)")


class CorruptStreamError(Exception):
    """The compressed data of an archive is damaged (its library's own error, named)."""


def compression_of(head: bytes) -> str | None:
    """The compression whose magic ``head`` starts with: "gzip", "bzip2", "xz", "zstd",
    or None (not compressed, or a compression not read)."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return None


class Checked(io.RawIOBase):
    """A decompressing reader whose library errors become :class:`CorruptStreamError`
    (NOTE [ compressed streams ]).  It keeps the position itself: a forward seek reads
    through, and a seek back over the last :data:`_BACK` bytes (the walk re-reads the
    end-of-archive block it stopped at) is served from what was read.  Closing it closes
    ``under`` too, the stream the decompressor reads (bz2/lzma leave it open, and dropping
    an open buffered file warns "unclosed file")."""

    def __init__(self, inner, name: str, errors: tuple[type[BaseException], ...],
                 under=None):
        self._inner, self._name, self._errors = inner, name, errors
        self._under = under
        self._pos = 0
        self._tail = b""  # the last bytes read, ending at the inner stream's position
        self._replay = 0  # how many of them are read again before the inner stream

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _more(self, n: int) -> bytes:
        try:
            return self._inner.read(n)
        except self._errors as e:
            if isinstance(e, OSError) and e.errno is not None:
                raise  # the disk's own error, not damaged data
            raise CorruptStreamError(f"{self._name} data error: {e}") from None

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(_CHUNK), b""))
        out = b""
        if self._replay:
            start = len(self._tail) - self._replay
            out = self._tail[start:start + n]
            self._replay -= len(out)
        if len(out) < n:
            more = self._more(n - len(out))
            self._tail = (self._tail + more)[-_BACK:]
            out += more
        self._pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == io.SEEK_CUR:
            pos += self._pos
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("a compressed stream seeks from its start only")
        if pos < self._pos:
            back = self._pos - pos
            if back > len(self._tail) - self._replay:
                raise io.UnsupportedOperation(f"cannot seek back {back} bytes in a {self._name} "
                                              "stream (it is read front to back once)")
            self._replay += back
            self._pos = pos
        while self._pos < pos:
            if not self.read(min(_CHUNK, pos - self._pos)):
                break
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            try:
                self._inner.close()
            finally:
                if self._under is not None:
                    self._under.close()
        super().close()


def decompressed(fileobj, where: str):
    """``fileobj`` (buffered: its first bytes are peeked) decompressed if its magic says
    it is compressed, else ``fileobj`` itself.  A zstd stream without the ``zstandard``
    package raises ValueError "not supported: ..." naming ``where``."""
    head = fileobj.peek(8)[:8]
    kind = compression_of(head)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=fileobj, mode="rb")
    if kind == "bzip2":
        return Checked(bz2.BZ2File(fileobj, "rb"), kind, (OSError, ValueError), fileobj)
    if kind == "xz":
        return Checked(lzma.LZMAFile(fileobj, "rb"), kind, (lzma.LZMAError,), fileobj)
    if kind == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ValueError(f"not supported: {where} is zstd-compressed; {ZSTD_HELP}") from None
        reader = zstandard.ZstdDecompressor().stream_reader(fileobj, read_across_frames=True,
                                                            closefd=False)
        return Checked(reader, kind, (zstandard.ZstdError, OSError), fileobj)
    return fileobj
