"""Preprocess into object storage: write each shard in a local staging folder, upload it.

NOTE [ writing to object storage ]
An object store cannot be written in place (LMDB maps its file), so ``preprocess SRC
s3://bucket/prefix`` writes each shard with the ordinary local writer into a staging
folder and uploads it once it is complete, while the next shard is being written.  At
most two shards (the one being written, the one being uploaded) are in staging at a
time, so it needs about ``2 x split size / --shards`` of free space; an uploaded shard
is removed from it.

Atomicity: an object store makes an object visible only when its upload completes (a
single PUT, or a multipart upload's final Complete call: s3fs uploads files of 100 MiB
and more in 50 MiB parts, several at once, and aborts the upload on an error), so an
interrupted upload leaves no object; a killed process can leave an incomplete multipart
upload that is invisible to readers (a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` removes those).  Other filesystems (sftp, hdfs, ...)
are written under ``<name>.partial`` and renamed.  The bad-files report of a shard is
uploaded before the shard, so a complete shard never lacks it.

Re-runs: a shard whose object exists, is complete and carries this command's
fingerprint (the same sources, order and options: NOTE [ crash-safe, resumable writes ])
is skipped without writing; the metadata is read with a few ranged GETs (NOTE
[ metadata over ranged reads ]), which also checks the object's size against the
LMDB layout.  After each upload, the object's size and its metadata checksum are read
back and compared with the local file's.  A shard interrupted while being written
resumes from the staging folder, as a local write does.

Time budget: every request runs under NOTE [ remote time budget ] (the process's
default budget: ``--remote-timeout`` / ``--remote-deadline``), so a silent or dripping
server is a :class:`~seqloader.errors.RemoteTimeoutError` within the deadline, not a
wait of minutes.  An upload's attempt may take ``timeout`` plus its size at
:data:`MIN_RATE` (a whole object is one attempt), and is retried until ``deadline``
seconds after that.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
import tempfile
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..errors import FormatError, OutputExistsError, RemoteNotFoundError
from ..format.files import bad_files_path, db_name, shard_path
from ..format.keys import META_KEY
from ..format.meta import Meta, unpack_meta
from ..read.lmdbpages import lookup_first_leaf
from ..read.remote import remote_extra_missing, safe_url, stat_remote
from ..read.remotefaults import call_with_timeout, retrying
from ..read.database import close_env, open_env, read_meta
from .scan import Scan
from .outfiles import BAD_FILES_SAID, bad_files_said, write_report
from .options import ShardResult, WriteOptions, WriteReport, scan_fingerprint, write_order
from .writer import write_split

__all__ = ["Uploader", "ATOMIC_PROTOCOLS", "default_staging"]

#: Protocols whose uploads are atomic (the object appears only once complete).
ATOMIC_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl"})
#: Upload part size (s3fs's multipart chunk); files of 2 parts or more go multipart.
PART_BYTES = 64 << 20
#: The slowest upload rate waited for, in bytes per second (an attempt's time limit).
MIN_RATE = 1 << 20
_SHARD_NAME = re.compile(r"^(?P<stem>.+?)(?:-\d{5}-of-\d{5})?\.lmdb$")


def default_staging(url: str) -> Path:
    """The staging folder used when none is given: one per destination URL in the system
    temp folder (``$TMPDIR``), so a re-run on the same machine resumes a shard that was
    being written."""
    digest = hashlib.sha256(safe_url(url).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"seqloader-staging-{digest}"


class Uploader:
    """Writes splits to the folder URL ``url`` through a local ``staging`` folder (NOTE
    [ writing to object storage ]).  ``storage_options`` go to fsspec (credentials
    otherwise come from the environment and config files, as for reading);
    ``part_bytes`` is the multipart upload's part size."""

    def __init__(self, url: str, *, staging: str | Path | None = None,
                 storage_options: dict | None = None, part_bytes: int | None = None):
        try:
            import fsspec

            fsspec.get_filesystem_class(url.split("://", 1)[0])  # (its protocol's package too)
        except ImportError as e:
            raise remote_extra_missing(f"writing to {safe_url(url)}", e) from None
        from ..read.remote import default_options, filesystem

        self.url = url.rstrip("/")
        self.options = dataclasses.replace(default_options(),
                                           storage_options=dict(storage_options or {}))
        self.fs, self.path = filesystem(self.url, self.options)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.atomic = bool(set(protocols) & ATOMIC_PROTOCOLS)
        self.staging = Path(staging) if staging is not None else default_staging(self.url)
        self.part_bytes = part_bytes or PART_BYTES
        self._upload_kw = ({"chunksize": self.part_bytes, "max_concurrency": 4}
                           if hasattr(self.fs, "_call_s3") else {})
        self.check_writable()

    def check_writable(self) -> None:
        """Write and remove a small probe object under the destination, before any shard
        is written: a bucket that does not exist, wrong credentials or no permission
        raise the :class:`~seqloader.errors.RemoteError` naming it now, not after the
        writing (NOTE [ remote time budget ] bounds the wait)."""
        probe = f"{self.path}/.seqloader-write-check-{os.getpid()}"

        def attempt(timeout: float) -> None:
            call_with_timeout(self.fs, "pipe_file", probe, timeout, b"seqloader")
            try:
                call_with_timeout(self.fs, "rm_file", probe, timeout)
            except FileNotFoundError:
                pass
        retrying(attempt, f"cannot write to {safe_url(self.url)}", self.url, self.options)

    _RAISE = object()

    def _call(self, name: str, path: str, where: str, *args, options=None, missing=_RAISE,
              **kwargs):
        """``fs.<name>(path, ...)`` under NOTE [ remote time budget ] (``options``: another
        budget than the Uploader's); ``missing`` is returned for a ``FileNotFoundError``
        (else raised as :class:`~seqloader.errors.RemoteNotFoundError`)."""
        def attempt(timeout: float):
            try:
                return call_with_timeout(self.fs, name, path, timeout, *args, **kwargs)
            except FileNotFoundError:
                if missing is Uploader._RAISE:
                    raise
                return missing
        return retrying(attempt, where, self.url, options or self.options)

    def where(self, name: str) -> str:
        """The URL of object ``name`` under the destination, for messages."""
        return safe_url(f"{self.url}/{name}")

    # ------------------------------------------------------------------ one split

    def write_split(self, scan: Scan, split: str, options: WriteOptions) -> WriteReport:
        """Write and upload the shards of ``split`` that ``options`` asks for (all, or
        ``shard_ids``); skip those already uploaded by this same command.  The report's
        shard ``path`` s are the objects' URLs (credentials removed).

        Raises :class:`FileExistsError` when the destination holds the split written
        differently or in another layout (pass ``overwrite``), the local writer's errors
        (a shard none of whose images could be stored raises
        :class:`~seqloader.write.writer.NoRecordsError`), and :class:`OSError` when an
        upload fails or does not read back as written."""
        opt = options
        name = f"{db_name(split)}.lmdb"
        fingerprint = scan_fingerprint(scan, split, write_order(len(scan), seed=opt.seed,
                                                            shuffle=opt.shuffle), opt)
        self._check_layout(name, split, opt)
        self.staging.mkdir(parents=True, exist_ok=True)
        report = WriteReport(split)
        caught: list[warnings.WarningMessage] = []
        with ThreadPoolExecutor(1, thread_name_prefix="seqloader-upload") as pool:
            pending: Future | None = None
            try:
                for k in (opt.shard_ids if opt.shard_ids is not None else range(opt.shards)):
                    shard = shard_path(name, k, opt.shards).name
                    done = self._uploaded(shard, fingerprint, opt)
                    if done is not None:
                        report.shards.append(done)
                        continue
                    with warnings.catch_warnings(record=True) as w:  # (re-said with URLs below)
                        warnings.simplefilter("always")
                        local = write_split(scan, self.staging / name, split,
                                            dataclasses.replace(opt, shard_ids=[k])).shards[0]
                    caught += [m for m in w if not _about_bad_files(m)]
                    if pending is not None:
                        pending.result()  # (at most one shard uploading: bounded staging)
                    pending = pool.submit(self._upload, local, opt.progress)
                    report.shards.append(dataclasses.replace(local, path=self.where(shard),
                                                               skipped=False))
                if pending is not None:
                    pending.result()
            except BaseException:
                if pending is not None and not pending.done():
                    pending.cancel()
                _cleanup(self.staging)  # (only when empty: a complete shard there is resumed)
                raise
        for m in caught:
            warnings.warn_explicit(m.message, m.category, m.filename, m.lineno)
        _cleanup(self.staging)
        bad = [r for r in report.shards if r.bad_files or r.warned_files]
        if bad:
            said = bad_files_said(len(report.bad_files), len(report.warned_files))
            warnings.warn(f"{split}: {said}; see "
                          f"{', '.join(f'{r.path}.bad-files.tsv' for r in bad[:3])}"
                          f"{f' (+{len(bad) - 3} more)' if len(bad) > 3 else ''}", stacklevel=3)
        return report

    # ------------------------------------------------------------------ checks

    def _ls(self) -> list[str]:
        self.fs.invalidate_cache(self.path)
        names = self._call("ls", self.path, f"listing {safe_url(self.url)}", detail=False,
                           missing=[])
        return [p.rstrip("/").rpartition("/")[2] for p in names]

    def _check_layout(self, name: str, split: str, opt: WriteOptions) -> None:
        """The split in another layout (one object vs shards, another shard count) would
        be what readers open: refuse it, or with ``overwrite`` delete it (as locally)."""
        ours = {shard_path(name, k, opt.shards).name for k in range(opt.shards)}
        stem = db_name(split)
        others = sorted(n for n in self._ls() if n not in ours and (m := _SHARD_NAME.match(n))
                        and m["stem"] == stem)
        if others and not opt.overwrite:
            raise OutputExistsError(f"{self.where(others[0])} holds split {split!r} in another "
                                    f"layout ({len(others)} object(s); this command writes "
                                    f"{opt.shards}); pass --overwrite to replace them, or choose "
                                    "another destination")
        for n in others:
            self._rm(n)
            self._rm(bad_files_path(n).name)

    def _rm(self, name: str) -> None:
        self._call("rm_file", f"{self.path}/{name}", f"removing {self.where(name)}", missing=None)

    def _exists(self, name: str) -> bool:
        try:
            stat_remote(f"{self.url}/{name}", self.options)
            return True
        except RemoteNotFoundError:
            return False

    def remote_meta(self, name: str) -> tuple[int, Meta | None] | None:
        """``(size, metadata)`` of object ``name`` (metadata None when it is not a
        seqloader file, e.g. truncated), or None when there is no such object."""
        try:
            f = stat_remote(f"{self.url}/{name}", self.options)
        except RemoteNotFoundError:
            return None
        size, where = f.size, self.where(name)
        try:
            value = lookup_first_leaf(lambda o, n: f.fetch(o, o + n), size, META_KEY, where=where)
            return size, (unpack_meta(value, where=where, require_complete=False)
                          if value is not None else None)
        except FormatError:
            return size, None

    def _uploaded(self, shard: str, fingerprint: str, opt: WriteOptions) -> ShardResult | None:
        """The result of ``shard`` if its object is this command's complete output."""
        found = self.remote_meta(shard)
        if found is None or opt.overwrite:
            return None
        _, meta = found
        if meta is None or not meta.complete or meta.fingerprint != fingerprint:
            why = ("not a complete seqloader file (an interrupted upload by another tool?)"
                   if meta is None or not meta.complete else
                   "different sources, order or options")
            raise OutputExistsError(f"{self.where(shard)} already exists and was not written by "
                                    f"this command ({why}); pass --overwrite to replace it, or "
                                    "choose another destination")
        if opt.strict and meta.bad_files:
            raise OutputExistsError(f"{self.where(shard)} was written without --strict and skipped "
                                    f"{len(meta.bad_files)} bad file(s), listed in "
                                    f"{self.where(bad_files_path(shard).name)}; pass --overwrite "
                                    "to write it again with --strict")
        report = bad_files_path(shard).name
        if (meta.bad_files or meta.warned_files) and not self._exists(report):
            local = self.staging / shard  # (its report was deleted: put it back from the metadata)
            self.staging.mkdir(parents=True, exist_ok=True)
            write_report(local, meta.bad_files, meta.warned_files)
            self._put(bad_files_path(local), report)
            bad_files_path(local).unlink()
        return ShardResult(self.where(shard), meta.num_records, meta.image_bytes, meta.bad_files,
                           0.0, skipped=True, warned_files=meta.warned_files)

    # ------------------------------------------------------------------ upload

    def _put(self, local: Path, name: str) -> None:
        """Upload ``local`` as object ``name``; it appears only when complete."""
        target = f"{self.path}/{name}"
        # (one attempt is the whole object: its time limit grows with its size)
        limit = self.options.timeout + local.stat().st_size / MIN_RATE
        budget = dataclasses.replace(self.options, timeout=limit,
                                     deadline=self.options.deadline + limit)
        where = f"cannot upload to {self.where(name)}"
        try:
            if self.atomic:
                self._call("put_file", str(local), where, target, options=budget,
                           **self._upload_kw)
            else:
                self._call("put_file", str(local), where, target + ".partial", options=budget,
                           **self._upload_kw)
                self._call("mv", target + ".partial", where, target)
        except RemoteNotFoundError as e:
            raise RemoteNotFoundError(f"{e} (does the bucket exist? create it first)") from None

    def _upload(self, result: ShardResult, progress: bool) -> None:
        """Upload a complete local shard (its report first), check it reads back as
        written, and remove it from staging."""
        local = Path(result.path)
        name = local.name
        size = local.stat().st_size
        if progress:
            print(f"uploading {name} ({size / 2**20:.1f} MiB) to {self.where(name)}",
                  file=sys.stderr, flush=True)
        report = bad_files_path(local)
        if report.exists():
            self._put(report, report.name)
        else:
            self._rm(report.name)  # (an earlier write's, now wrong)
        self._put(local, name)
        want = _local_meta(local)
        found = self.remote_meta(name)
        if found is None or found[0] != size or found[1] is None \
                or found[1].checksum != want.checksum or not found[1].complete:
            got = "nothing" if found is None else f"{found[0]:,} bytes, " + (
                "no readable metadata" if found[1] is None else f"checksum {found[1].checksum[:16]}…")
            raise OSError(f"{self.where(name)} does not read back as uploaded ({size:,} bytes, "
                          f"checksum {want.checksum[:16]}…; got {got}); re-run to upload it "
                          "again")
        for p in (local, report, local.with_name(local.name + "-lock")):
            p.unlink(missing_ok=True)


def _local_meta(path: Path) -> Meta:
    env = open_env(path)
    try:
        return read_meta(env, path)
    finally:
        close_env(env)


def _about_bad_files(m: warnings.WarningMessage) -> bool:
    """The local writer's bad-files warning (names staging paths: said again with URLs)."""
    text = str(m.message)
    return any(words in text for words in BAD_FILES_SAID)


def _cleanup(staging: Path) -> None:
    """Remove the staging folder once nothing is left in it."""
    try:
        staging.rmdir()
    except OSError:
        pass

