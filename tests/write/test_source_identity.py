"""The source is part of a finished database's identity: a re-run into the same folder
with another archive, other labels or other options is refused (or, with --overwrite,
rewritten) for every source kind."""
from __future__ import annotations

import shutil
import warnings

import pytest

from seqloader.cli import main
from test_damaged_inputs import build_sources


def _run(argv, capsys) -> tuple[int, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["preprocess", *argv, "--workers", "1", "--no-progress"])
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    a = build_sources(tmp_path_factory.mktemp("a"))
    return a


@pytest.mark.parametrize("kind", ["tree tar", "tree tar.gz", "tar of tars", "webdataset",
                                  "flat val tar", "tensorpack lmdb"])
def test_another_source_labels_or_options_are_refused(sources, kind, tmp_path, capsys):
    path, args = sources[kind]
    out = tmp_path / "out"
    assert _run([str(path), str(out), *args], capsys)[0] == 0
    # the same command again: already complete
    rc, err = _run([str(path), str(out), *args], capsys)
    assert rc == 0, err
    # another archive of the same kind (one image fewer: another size)
    other = tmp_path / "other" / path.name
    other.parent.mkdir()
    if kind == "tensorpack lmdb":
        import lmdb

        shutil.copy(path, other)
        env = lmdb.open(str(other), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            txn.delete(b"00000000")
        env.close()
    else:
        from test_damaged_inputs import _tar
        import gzip
        import io
        import tarfile

        raw = path.read_bytes()
        gz = raw[:2] == b"\x1f\x8b"
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(raw) if gz else raw)) as tf:
            members = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers() if m.isfile()]
        data = _tar(members[:-2] if kind == "webdataset" else members[:-1])
        other.write_bytes(gzip.compress(data) if gz else data)
    rc, err = _run([str(other), str(out), *args], capsys)
    assert rc == 2 and "already exists and was written from another source" in err, err
    # other options
    rc, err = _run([str(path), str(out), *args, "--seed", "7"], capsys)
    assert rc == 2 and "already exists" in err, err
    # other labels
    if "--val-labels" in args or "--class-names" in args:
        flag = "--val-labels" if "--val-labels" in args else "--class-names"
        labels = tmp_path / "labels.txt"
        text = open(args[args.index(flag) + 1]).read()
        labels.write_text(text.replace("n01", "n09") if flag == "--class-names"
                          else text.replace(" n01", " n02"))
        relabelled = list(args)
        relabelled[args.index(flag) + 1] = str(labels)
        rc, err = _run([str(path), str(out), *relabelled], capsys)
        assert rc == 2 and "already exists and was written from another source" in err, err
    # --overwrite rewrites it
    rc, err = _run([str(other), str(out), *args, "--overwrite"], capsys)
    assert rc == 0, err


def test_a_database_from_a_folder_tree_is_not_taken_for_an_archives(sources, synth_tree,
                                                                     tmp_path, capsys):
    out = tmp_path / "out"
    assert _run([str(synth_tree.root), str(out), "--splits", "train", "--no-verify"],
                capsys)[0] == 0
    path, args = sources["tree tar"]
    rc, err = _run([str(path), str(out), *args, "--no-verify"], capsys)
    assert rc == 2 and "was written from a folder tree source" in err, err


def _without_last_image(path, other) -> None:
    """``path`` (a zip or a parquet file) rewritten without its last image."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        pq.write_table(table.slice(0, table.num_rows - 1), other, row_group_size=4)
        return
    import zipfile

    with zipfile.ZipFile(path) as src, zipfile.ZipFile(other, "w") as dst:
        infos = src.infolist()
        last = max(i for i, m in enumerate(infos) if m.filename.endswith(".JPEG")
                   and "/val/" not in m.filename)  # (Kaggle's val: one CSV line each)
        for i, m in enumerate(infos):
            if i != last:
                dst.writestr(m, src.read(m))


@pytest.mark.parametrize("kind", ["kaggle zip", "tree zip", "hf parquet"])
def test_another_zip_or_parquet_or_its_labels_are_refused(sources, kind, tmp_path, capsys):
    if kind not in sources:
        pytest.skip("needs pyarrow (pip install -c constraints.txt -e '.[parquet]')")
    path, args = sources[kind]
    out = tmp_path / "out"
    assert _run([str(path), str(out), *args], capsys)[0] == 0
    rc, err = _run([str(path), str(out), *args], capsys)
    assert rc == 0, err  # the same command again: already complete
    other = tmp_path / "other" / path.name
    other.parent.mkdir()
    _without_last_image(path, other)
    rc, err = _run([str(other), str(out), *args], capsys)
    assert rc == 2 and "already exists and was written from another source" in err, err
    if kind == "kaggle zip":  # its val labels changed
        import zipfile

        relabelled = tmp_path / "relabelled" / path.name
        relabelled.parent.mkdir()
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(relabelled, "w") as dst:
            for m in src.infolist():
                data = src.read(m)
                if m.filename == "LOC_val_solution.csv":
                    data = data.replace(b",n01 ", b",n02 ", 1)
                dst.writestr(m, data)
        rc, err = _run([str(relabelled), str(out), *args], capsys)
        assert rc == 2 and "already exists and was written from another source" in err, err
    rc, err = _run([str(other), str(out), *args, "--overwrite"], capsys)
    assert rc == 0, err
