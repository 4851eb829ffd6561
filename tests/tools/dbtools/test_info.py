"""info: everything the metadata says, for class and any-target databases; quiet on EPIPE."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from seqloader.cli import main as cli
from seqloader.tools.dbtools import reshard

ROOT = Path(__file__).resolve().parents[3]


def test_info_tells_format_targets_shards_sizes_and_counts(lmdb_dir, tmp_path, capsys):
    reshard(lmdb_dir, tmp_path, split="train", shards=2, progress=False)
    assert cli(["info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["train"]
    assert info["image_format"] == "jpeg" and info["target_kind"] == "class"
    # the targets in their own type: labels are ints in JSON, not "3 (n0...)" strings
    assert len(info["sample_targets"]) == 5
    assert all(type(t) is int and 0 <= t < 4 for t in info["sample_targets"])
    assert [s["records"] for s in info["shards"]] == info["shard_sizes"] and len(info["shards"]) == 2
    rb = info["record_bytes"]
    assert 0 < rb["min"] <= rb["median"] <= rb["max"] and info["bad_files"] == 3
    assert info["fingerprint"] and info["writer"]["tool"]["command"] == "reshard"
    assert cli(["info", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    for words in ("images: jpeg", "targets: class labels", "record size: median",
                  "3 bad source file(s)", "fingerprint", "then `seqloader reshard`"):
        assert words in text, words


def test_info_of_a_dataset_of_any_targets(tmp_path, capsys):
    from seqloader.write.dataset import write_dataset

    rng = np.random.default_rng(0)
    data = [(rng.integers(0, 255, (20, 24, 3), np.uint8), {"box": [1, 2], "id": i})
            for i in range(6)]
    write_dataset(data, tmp_path, image_format="pixels", progress=False, workers=1)
    assert cli(["info", str(tmp_path), "--split", "train", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["target_kind"] == "any" and info["image_format"] == "pixels"
    assert info["first_image_hw"] == [20, 24]
    first = info["sample_targets"]
    assert len(first) == 5 and all(t == {"box": [1, 2], "id": t["id"]} for t in first)
    assert all(type(t["id"]) is int for t in first)
    assert cli(["info", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "0 classes ()" not in text and "targets: any values" in text
    assert f"first targets: {{'box': [1, 2], 'id': {first[0]['id']}}}; " in text


def test_info_says_one_count_when_every_class_has_as_many(lmdb_dir, tmp_path, capsys):
    """Not "12-12 images per class"; a range only when the classes differ."""
    assert cli(["info", str(lmdb_dir), "--split", "train"]) == 0
    text = capsys.readouterr().out
    assert "; 12 images per class" in text and "12-12" not in text, text
    assert re.search(r"first targets: [0-3] \(n\d{8}\); ", text), text
    from seqloader.tools.dbtools import subset

    subset(lmdb_dir, tmp_path, split="train", classes=["0"], per_class=5, progress=False)
    subset(lmdb_dir, tmp_path / "b", split="train", classes=["1"], per_class=7, progress=False)
    from seqloader.tools.dbtools import merge

    merge([tmp_path, tmp_path / "b"], tmp_path / "m", progress=False)
    assert cli(["info", str(tmp_path / "m"), "--split", "train"]) == 0
    assert "0-7 images per class, 2 empty" in capsys.readouterr().out


def test_info_into_a_closed_pipe_exits_0_quietly(lmdb_dir):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before info writes (as `| head -1` once it has its line)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "seqloader", "info", str(lmdb_dir)], stdout=w,
                       stderr=subprocess.PIPE, env=env, timeout=120, text=True)
    os.close(w)
    assert p.returncode == 0 and p.stderr == ""
