"""Damaged, truncated and hostile inputs fail loudly: every source kind, built here,
damaged many ways; each case ends with exit 0 and every record, or exit 2 and one line
of error without a traceback -- never a smaller database with exit 0, never a signal."""
from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import lzma
import json
import os
import pickle
import random
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import lmdb
import numpy as np
import pytest

from kaggle_hf import KAGGLE_NAME, hf_parquet, kaggle_zip

REPO = Path(__file__).resolve().parents[2]
CLASSES = ["n01", "n02", "n03"]
PER_CLASS = 3

#: Runs each case's command line in a forked child (so a signal is seen as one) and
#: writes {"rc": ..., "signal": ..., "err": ...} per case.
RUNNER = textwrap.dedent("""
    import json, os, sys, traceback
    cases = json.load(open(sys.argv[1]))
    from seqloader.cli import main
    results = []
    for argv in cases:
        err = argv[-1] + ".stderr"
        pid = os.fork()
        if pid == 0:
            try:
                fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 2)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                rc = main(argv[:-1])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
                rc = 1
            sys.stderr.flush()
            os._exit(rc)
        _, status = os.waitpid(pid, 0)
        results.append({"rc": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                        "err": open(err, errors="replace").read()})
    json.dump(results, open(sys.argv[2], "w"))
""")


def _jpeg(seed: int) -> bytes:
    import cv2

    img = np.random.default_rng(seed).integers(0, 256, (24, 24, 3), np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


def _images() -> dict[str, list[tuple[str, bytes]]]:
    return {c: [(f"{c}_{i}.JPEG", _jpeg(10 * k + i)) for i in range(PER_CLASS)]
            for k, c in enumerate(CLASSES)}


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return b.getvalue()


def _tensorpack_lmdb(path: Path, images) -> None:
    """As tensorpack's LMDBSerializer.save writes: '{:08}' keys, pickled datapoints
    ``[uint8 array, label]``, then ``__keys__``."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24, meminit=False, map_async=True)
    keys = []
    with env.begin(write=True) as txn:
        for label, c in enumerate(CLASSES):
            for _, data in images[c]:
                keys.append(f"{len(keys):08}".encode("ascii"))
                txn.put(keys[-1], pickle.dumps([np.frombuffer(data, np.uint8), label], -1))
        txn.put(b"__keys__", pickle.dumps(keys, -1))
    env.sync()
    env.close()


def _zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(write_checksum=True).compress(data)


#: The compressions besides gzip a tar is read through (zstd where zstandard is installed).
_COMPRESSORS = {"bz2": bz2.compress, "xz": lzma.compress}
if importlib.util.find_spec("zstandard") is not None:
    _COMPRESSORS["zst"] = _zstd


def build_sources(root: Path) -> dict[str, tuple[Path, list[str]]]:
    """Each source kind: (the file to damage, the rest of its command line)."""
    images = _images()
    root.mkdir(parents=True, exist_ok=True)
    tree = [(f"train/{c}/{n}", d) for c in CLASSES for n, d in images[c]]
    out: dict[str, tuple[Path, list[str]]] = {}
    (root / "tree.tar").write_bytes(_tar(tree))
    out["tree tar"] = root / "tree.tar", ["--split", "train"]
    (root / "tree.tar.gz").write_bytes(gzip.compress(_tar(tree), mtime=0))
    out["tree tar.gz"] = root / "tree.tar.gz", ["--split", "train"]
    for suffix, compress in _COMPRESSORS.items():
        (root / f"tree.tar.{suffix}").write_bytes(compress(_tar(tree)))
        out[f"tree tar.{suffix}"] = root / f"tree.tar.{suffix}", ["--split", "train"]
    (root / "tars.tar").write_bytes(_tar([(f"{c}.tar", _tar(images[c])) for c in CLASSES]))
    out["tar of tars"] = root / "tars.tar", ["--split", "train"]
    shard = []
    for label, c in enumerate(CLASSES):
        for n, d in images[c]:
            key = n.split(".")[0]
            shard += [(f"{key}.jpg", d), (f"{key}.cls", str(label).encode())]
    (root / "shard-000000.tar").write_bytes(_tar(shard))
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    out["webdataset"] = root / "shard-000000.tar", ["--split", "train", "--class-names",
                                                    str(root / "classes.txt")]
    flat = [(n, d) for c in CLASSES for n, d in images[c]]
    (root / "val.tar").write_bytes(_tar(flat))
    (root / "val.txt").write_text("".join(f"{n} {c}\n" for c in CLASSES for n, _ in images[c]))
    out["flat val tar"] = root / "val.tar", ["--split", "val", "--val-labels",
                                             str(root / "val.txt")]
    tree = root / "tree"  # (Kaggle's zip and Hugging Face's parquet, built from it)
    for split in ("train", "val"):
        for c in CLASSES:
            (tree / split / c).mkdir(parents=True)
            for n, d in images[c]:
                (tree / split / c / n).write_bytes(d)
    out["kaggle zip"] = kaggle_zip(tree, root / KAGGLE_NAME), ["--split", "val"]
    with zipfile.ZipFile(root / "train.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for c in CLASSES:
            for n, d in images[c]:
                zf.writestr(f"train/{c}/{n}", d)
    out["tree zip"] = root / "train.zip", ["--split", "train"]
    if importlib.util.find_spec("pyarrow") is not None:
        # (with page checksums: a damaged page is found, not read as other labels)
        hf, = [f for f in hf_parquet(tree, root / "hf", shards=1, row_group=4,
                                     write_page_checksum=True) if f.name.startswith("train")]
        out["hf parquet"] = hf, ["--split", "train"]
    _tensorpack_lmdb(root / "tp.lmdb", images)
    out["tensorpack lmdb"] = root / "tp.lmdb", ["--split", "train", "--class-names",
                                                str(root / "classes.txt")]
    return out


def _tar_spots(data: bytes) -> tuple[list[int], list[int]]:
    """(member header offsets, member data offsets) of an intact tar."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        ms = tf.getmembers()
    return [m.offset for m in ms], [m.offset_data for m in ms if m.size]


def damages(kind: str, data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """Damaged copies of ``data``: cuts, flipped and zeroed bytes in headers and data."""
    def flip(at: int) -> bytes:
        b = bytearray(data)
        b[at] ^= 0x5A
        return bytes(b)

    def zero(at: int, n: int = 16) -> bytes:
        b = bytearray(data)
        b[at:at + n] = bytes(len(b[at:at + n]))
        return bytes(b)

    out = [("empty", b""), ("cut to 100 bytes", data[:100]),
           ("cut before the end blocks", data[:len(data) - 2048 if not kind.startswith(
               "tree tar.") else len(data) - 8]),
           ("junk after the end", data + b"junk" * 300)]
    if kind == "tensorpack lmdb":
        psize = 4096
        pages = len(data) // psize
        out += [(f"cut at page {p}", data[:p * psize]) for p in range(1, pages)]
        out += [(f"cut inside page {p}", data[:p * psize + 1000]) for p in range(1, pages)]
        out += [("zeroed meta pages", zero(0, 2 * psize)), ("magic flipped", flip(16)),
                ("zeroed meta 0", zero(0, psize))]
        out += [(f"zeroed page {p}", zero(p * psize, psize)) for p in range(2, pages)]
        return out
    if kind.endswith("zip"):
        return out + _zip_damages(data, flip, zero, rng)
    if kind == "hf parquet":
        n = len(data)
        footer = int.from_bytes(data[n - 8:n - 4], "little")
        out += [("magic flipped", flip(1)), ("end magic flipped", flip(n - 2)),
                ("footer length flipped", flip(n - 7)), ("cut inside the footer", data[:n - 20])]
        out += [(f"footer flipped at {a}", flip(a)) for a in
                sorted(rng.sample(range(n - 8 - footer, n - 8), 6))]
        out += [(f"16 bytes zeroed at {a}", zero(a)) for a in
                sorted(rng.sample(range(4, n - 8 - footer), 6))]
        out += [(f"flipped at {a}", flip(a)) for a in sorted(rng.sample(range(4, n - 8 - footer), 8))]
        out += [(f"cut at {a}", data[:a]) for a in sorted(rng.sample(range(10, n), 4))]
        return out
    if kind.startswith("tree tar."):  # compressed: gzip, bz2, xz, zst
        n = len(data)
        out += [("trailer CRC flipped", flip(n - 8)), ("trailer length flipped", flip(n - 2)),
                ("header flipped", flip(3)), ("cut inside the trailer", data[:n - 3])]
        out += [(f"16 bytes zeroed at {a}", zero(a)) for a in
                sorted(rng.sample(range(10, n - 8), 8))]
        out += [(f"cut at {a}", data[:a]) for a in sorted(rng.sample(range(10, n), 4))]
        return out
    headers, datas = _tar_spots(data)
    pick = sorted(set(headers[1:])) if len(headers) > 1 else []
    pick = rng.sample(pick, min(4, len(pick)))
    for h in pick:
        out += [(f"cut at header {h}", data[:h]), (f"cut inside header {h}", data[:h + 100]),
                (f"header {h} zeroed", zero(h, 512)), (f"header {h} checksum flipped",
                                                      flip(h + 148)),
                (f"header {h} size flipped", flip(h + 124 + 5)),
                (f"header {h} name zeroed", zero(h, 16))]
    for d in rng.sample(datas, min(3, len(datas))):
        out += [(f"cut inside data {d}", data[:d + 7]), (f"data {d} flipped", flip(d + 3))]
    return out


def _zip_damages(data: bytes, flip, zero, rng: random.Random) -> list[tuple[str, bytes]]:
    """A cut central directory, bad local headers, CRC mismatches, truncated members."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = [i for i in zf.infolist() if i.file_size]
        cd = zf.start_dir
    out = [("central directory cut", data[:cd + 10]), ("end record zeroed", zero(len(data) - 22)),
           ("central directory offset flipped", flip(len(data) - 6))]
    for i in rng.sample(infos, min(4, len(infos))):
        h = i.header_offset
        data_at = h + 30 + len(i.filename.encode()) + len(i.extra)
        out += [(f"cut at header {h}", data[:h]), (f"header {h} signature flipped", flip(h + 1)),
                (f"header {h} name flipped", flip(h + 31)),
                (f"data of {i.filename} flipped", flip(data_at + i.compress_size // 2)),
                (f"data of {i.filename} zeroed", zero(data_at + 2)),
                (f"cut inside {i.filename}", data[:data_at + 5])]
    entries = []
    at = cd
    while data[at:at + 4] == b"PK\x01\x02":
        entries.append(at)
        n, m, k = (int.from_bytes(data[at + o:at + o + 2], "little") for o in (28, 30, 32))
        at += 46 + n + m + k
    for e in rng.sample(entries, min(4, len(entries))):
        out += [(f"central entry {e} CRC flipped", flip(e + 17)),
                (f"central entry {e} size flipped", flip(e + 20)),
                (f"central entry {e} name flipped", flip(e + 46 + 2)),
                (f"central entry {e} offset flipped", flip(e + 42))]
    return out


def _run_cases(cases: list[list[str]], tmp_path: Path) -> list[dict]:
    spec, res = tmp_path / "cases.json", tmp_path / "results.json"
    spec.write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-c", RUNNER, str(spec), str(res)], env=env, check=True,
                   timeout=900, stdout=subprocess.DEVNULL)
    return json.loads(res.read_text())


def _records(out: Path, split: str) -> list[tuple[str | None, int]]:
    from conftest import read_records

    return [(r.path, r.label) for _, r in read_records(out / f"ILSVRC-{split}.lmdb")]


def _fuzz(tmp_path: Path, per_kind: int | None, seed: int) -> None:
    rng = random.Random(seed)
    sources = build_sources(tmp_path / "src")
    cases, meta = [], []
    for kind, (path, args) in sources.items():
        split = args[args.index("--split") + 1]
        intact = path.read_bytes()
        todo = [("intact", intact)] + damages(kind, intact, rng)
        if per_kind is not None:
            todo = todo[:1] + rng.sample(todo[1:], min(per_kind, len(todo) - 1))
        for k, (what, data) in enumerate(todo):
            case = tmp_path / "cases" / f"{kind.replace(' ', '_')}-{k}"
            case.mkdir(parents=True)
            src = case / path.name
            src.write_bytes(data)
            cases.append(["preprocess", str(src), str(case / "out"), "--strict", "--workers",
                          "1", "--no-progress", *args, str(case / "run")])
            meta.append((kind, what, split, case / "out"))
    results = _run_cases(cases, tmp_path)
    want = {}
    problems = []
    for (kind, what, split, out), r in zip(meta, results):
        label = f"{kind}, {what}"
        if r["signal"] is not None:
            problems.append(f"{label}: killed by signal {r['signal']}")
            continue
        err = [line for line in r["err"].splitlines()
               if line.strip() and not line.startswith("warning:")]
        if what == "intact":
            assert r["rc"] == 0, f"{label}: {r['err']}"
            want[kind] = _records(out, split)
            assert len(want[kind]) == len(CLASSES) * PER_CLASS
        elif r["rc"] == 0:
            got = _records(out, split)
            if sorted(got, key=str) != sorted(want[kind], key=str):
                problems.append(f"{label}: exit 0 with {len(got)} of {len(want[kind])} records")
        elif r["rc"] != 2 or len(err) != 1 or "Traceback" in r["err"]:
            problems.append(f"{label}: exit {r['rc']} with {len(err)} lines:\n{r['err'][-2000:]}")
    assert not problems, "\n".join(problems)


def test_damaged_inputs_fail_loudly_or_give_every_record(tmp_path):
    _fuzz(tmp_path, per_kind=7, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_damaged_inputs_fail_loudly_every_damage(tmp_path, seed):
    _fuzz(tmp_path, per_kind=None, seed=seed)
