"""Builders of the two layouts people download ImageNet in today, from a synthetic
tree: Kaggle's ``imagenet-object-localization-challenge.zip`` (the same paths, CSV
and mapping formats) and Hugging Face's ``imagenet-1k`` parquet files (the same
columns and schema metadata)."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

KAGGLE_NAME = "imagenet-object-localization-challenge.zip"


def _entry(zf: zipfile.ZipFile, name: str, data: bytes | None = None, compress=None) -> None:
    info = zipfile.ZipInfo(name, date_time=(2019, 3, 1, 0, 0, 0))
    if data is None:  # a folder entry, as `zip -r` writes
        info.external_attr = 0o40755 << 16 | 0x10
        zf.writestr(info, b"")
        return
    info.compress_type = compress if compress is not None else zf.compression
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def kaggle_zip(tree: Path, path: Path, *, compression=zipfile.ZIP_STORED) -> Path:
    """Kaggle's layout of ``tree`` (train/<wnid>/*, val/<wnid>/*): train under
    ILSVRC/Data/CLS-LOC/train/, val flat and renamed ILSVRC2012_val_N.JPEG with
    LOC_val_solution.csv, test/ and annotations alongside, LOC_synset_mapping.txt."""
    classes = sorted(p.name for p in (tree / "train").iterdir())
    vals = [f for c in classes for f in sorted((tree / "val" / c).iterdir())]
    with zipfile.ZipFile(path, "w", compression) as zf:
        _entry(zf, "ILSVRC/")
        _entry(zf, "ILSVRC/Annotations/CLS-LOC/train/")
        for c in classes:
            f = sorted((tree / "train" / c).iterdir())[0]
            _entry(zf, f"ILSVRC/Annotations/CLS-LOC/train/{c}/{f.stem}.xml",
                   f"<annotation><filename>{f.stem}</filename></annotation>".encode(),
                   zipfile.ZIP_DEFLATED)
        for i in range(2):
            _entry(zf, f"ILSVRC/Data/CLS-LOC/test/ILSVRC2012_test_{i + 1:08d}.JPEG",
                   vals[i].read_bytes())
        _entry(zf, "ILSVRC/Data/CLS-LOC/train/")
        for c in classes:
            _entry(zf, f"ILSVRC/Data/CLS-LOC/train/{c}/")
            for f in sorted((tree / "train" / c).iterdir()):
                _entry(zf, f"ILSVRC/Data/CLS-LOC/train/{c}/{f.name}", f.read_bytes())
        _entry(zf, "ILSVRC/Data/CLS-LOC/val/")
        rows = ["ImageId,PredictionString"]
        for i, f in enumerate(vals, 1):
            name = f"ILSVRC2012_val_{i:08d}"
            _entry(zf, f"ILSVRC/Data/CLS-LOC/val/{name}.JPEG", f.read_bytes())
            rows.append(f"{name},{f.parent.name} 12 34 56 78 {f.parent.name} 1 2 30 40 ")
        _entry(zf, "ILSVRC/ImageSets/CLS-LOC/train_cls.txt", b"n0/x 1\n", zipfile.ZIP_DEFLATED)
        _entry(zf, "LOC_sample_submission.csv", b"ImageId,PredictionString\n",
               zipfile.ZIP_DEFLATED)
        _entry(zf, "LOC_synset_mapping.txt", "".join(
            f"{c} synthetic class {c}, a description\n" for c in classes).encode(),
            zipfile.ZIP_DEFLATED)
        _entry(zf, "LOC_train_solution.csv", b"ImageId,PredictionString\n",
               zipfile.ZIP_DEFLATED)
        _entry(zf, "LOC_val_solution.csv", ("\n".join(rows) + "\n").encode(),
               zipfile.ZIP_DEFLATED)
    return path


def extracted_kaggle(zip_path: Path, dest: Path) -> tuple[Path, Path]:
    """(the extracted tree's CLS-LOC folder, its LOC_val_solution.csv)."""
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(dest)
    return dest / "ILSVRC" / "Data" / "CLS-LOC", dest / "LOC_val_solution.csv"


def hf_metadata(classes: list[str]) -> dict[bytes, bytes]:
    """The schema metadata Hugging Face's datasets writes for imagenet-1k's features."""
    info = {"info": {"features": {
        "image": {"_type": "Image"},
        "label": {"names": list(classes), "_type": "ClassLabel"}}}}
    return {b"huggingface": json.dumps(info).encode()}


def hf_parquet(tree: Path, folder: Path, *, shards: int = 2, row_group: int = 5,
               **write_options) -> list[Path]:
    """Hugging Face's imagenet-1k layout of ``tree``: data/train-0000K-of-0000N.parquet,
    validation-..., test-... (labels -1), an ``image`` struct of bytes and path, a
    ``label`` int64 column, the ClassLabel names in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted(p.name for p in (tree / "train").iterdir())
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("label", pa.int64())], metadata=hf_metadata(classes))
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    out = []
    for split, word, n in (("train", "train", shards), ("val", "validation", 1),
                           ("val", "test", 1)):
        rows = [({"bytes": f.read_bytes(), "path": f.name}, -1 if word == "test" else k)
                for k, c in enumerate(classes) for f in sorted((tree / split / c).iterdir())]
        for s in range(n):
            part = rows[s::n]
            table = pa.table({"image": [r[0] for r in part], "label": [r[1] for r in part]},
                             schema=schema)
            p = data / f"{word}-{s:05d}-of-{n:05d}.parquet"
            pq.write_table(table, p, row_group_size=row_group, **write_options)
            out.append(p)
    return out
