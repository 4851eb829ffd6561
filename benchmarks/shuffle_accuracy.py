"""Does seqloader's shuffling cost accuracy?  Train the same small CNN with different orders.

Generates a learnable synthetic dataset (:func:`seqloader.tools.synth.make_synthetic_imagenet`,
``size="small"``: 64-128 px JPEGs; default 20 classes x 250 train / 100 val images),
writes it twice with :func:`seqloader.preprocess` -- shuffled once at write (the
default) and class-sorted (``shuffle=False``) -- and trains one CNN per configuration
and seed, on CPU, with everything else identical (model, initialisation, SGD +
momentum, warm-up + cosine schedule, epochs, batch size, the training transform
``RandomResizedCrop(--size, scale=(0.25, 1)) + RandomHorizontalFlip + ToTensor +
Normalize``, evaluation on the val split after every epoch):

  a_ideal             ``torch.utils.data.DataLoader(shuffle=True)`` over the image
                      files (a fresh uniform permutation every epoch): the reference.
  b_seq_default       seqloader, database shuffled at write, default settings (scaled).
  c_sorted_default    seqloader, class-sorted database, default settings (scaled).
  c_sorted_bigbuf     seqloader, class-sorted database, ``cache`` = 25 % of the records
                      and ``chunk_size`` = 16 (``--big-cache-frac``, ``--big-chunk``).
  d_sorted_noshuffle  class-sorted database read sequentially, no shuffling at all
                      (``Loader(shuffle=False)``): the worst case.
  e_seq_noshuffle     (optional, not run by default) database shuffled at write, read
                      in the same order every epoch (``Loader(shuffle=False)``).

All loaders decode with the same code (OpenCV, RGB) and run the same seqloader
transform objects; the Loader gets them through a wrapper so that it uses the
generic (unfused) path too (``--fused`` lets it use its fused pipeline).  With seed
``s``: ``torch.manual_seed(s)`` before building the model, Loader ``seed=s``,
DataLoader ``generator`` seeded with ``s``, augmentation generators derived from
``(s, epoch, ...)``.  Decoding is in-process by default (``--workers 0``); orders do
not depend on the number of workers.

Scaling the defaults
--------------------
``cache=5000`` and ``chunk_size=1024`` are designed for ImageNet (1.28 M records,
~1281 per class).  On the default 5000-record dataset they would cover the whole
split (a perfect shuffle), so they are scaled.  ``--scale-rule class`` (default) keeps
them in units of *one class's records*: chunk = 1024/1281 = 0.80 of a class, cache =
5000/1281 = 3.9 classes' worth (here: chunk 200, cache 976).  A chunk of a
class-sorted database then still covers about one class, and the buffer holds ~15
batches and a chunk ~3 batches, as on ImageNet (19.5 and 4 batches of 256).
``--scale-rule records`` keeps ``cache/N`` and ``chunk/N`` instead (0.39 % and 0.080 %
of the split; here: cache 64 after the floor below, chunk 4): with 4-record chunks a
class-sorted database looks well mixed (distinct 0.88), far *better* than ImageNet with
the defaults (0.14), which would make the class-sorted comparison meaningless; on a
database shuffled at write both rules give ~ideal orders.  Both rules keep
``cache >= batch_size`` (a buffer smaller than a batch would make every batch little
more than one buffer's worth of consecutive records) and ``chunk_size >= 1``.  No rule
can keep everything: with 20 classes and batches of 64 a batch holds most classes
even from a few chunks, while ImageNet's 1000 classes cannot fit in a batch of 256,
so ``distinct`` of the class-sorted default is 0.69 here against 0.14 at full scale:
the harm measured here for class-sorted data is a *lower bound*.  The report prints
the quality figures for both rules and for the ImageNet-size layout (1000 x 1300,
batch 256, from the plan).  ``--cache``/``--chunk-size`` override the scaled values.

Trade-off for data that cannot be shuffled at write time
--------------------------------------------------------
If the records are stored class-sorted (or otherwise clustered: by source, by date,
by camera), the only mixing is the Loader's: a random chunk order per epoch plus a
shuffle buffer of ``cache`` records.  A batch then holds only the classes of the few
chunks the buffer currently mixes (records leave the buffer at random, so it holds
more chunks than ``cache / chunk_size``, but still few).  With ImageNet and the
defaults (cache 5000, chunk 1024) a batch of 256 has ~32 classes instead of ~226
(``distinct`` 0.14; ``benchmarks/shuffle_quality.py``).  Diversity grows with a larger
buffer and with smaller chunks, and both cost something:

* buffer memory = ``cache x mean record size`` of page cache (ImageNet, 110 KB/record:
  5000 -> 550 MB, 20000 -> 2.2 GB, 50000 -> 5.5 GB); it must stay resident or the
  buffered records are read twice, and the first batch waits for ``warmup`` records;
* small chunks = more seeks: each chunk is one random access.  On a 100-seek/s,
  150 MiB/s disk, chunks of 1024 ImageNet records (113 MB) keep ~99 % of the
  sequential bandwidth, 256 (28 MB) ~95 %, 64 (7 MB) ~82 %, 16 (1.8 MB) ~53 %
  (modelled; measure with ``--hdd-throughput``).  On SSDs or page-cached data chunk
  size hardly matters;
* what it buys, ImageNet layout (batch 256): distinct 0.14 at the defaults, 0.58 at
  cache 5000 / chunk 64, 0.85 at 20000 / 64 (2.2 GB, ~82 % of the disk), 0.93 at
  50000 / 64 (5.5 GB), 0.96 at 20000 / 16 (2.2 GB, ~53 %);
* accuracy (this experiment, 20 classes x 250, 3 seeds, final val accuracy): ideal
  shuffle 85.5 +- 1.8 %, seqloader defaults on a database shuffled at write
  86.5 +- 1.2 %, class-sorted with the (scaled) defaults 54.3 +- 3.4 % (distinct 0.69),
  class-sorted with a 25 % buffer and 16-record chunks 82.5 +- 6.0 % (distinct 0.96),
  class-sorted read without shuffling 5.0 % (chance: the model ends up predicting the
  last class it saw).  Partial mixing is not "almost as good": even distinct 0.96
  left a 3 pp mean gap with a large spread.
Shuffling once at write (the default of ``preprocess``) costs nothing at read time and
makes the defaults match an ideal shuffle, so rewrite the data if at all possible;
otherwise use the smallest chunks the storage tolerates and the largest buffer memory
allows, and check ``seqloader.tools.quality.shuffle_quality`` (or
``benchmarks/shuffle_quality.py --db``) before training.

Outputs (``--out-dir``, default: the current directory; ``--out-dir benchmarks/results``
updates the committed results): ``shuffle_accuracy.json``
(everything), ``shuffle_accuracy.md`` (tables) and ``shuffle_accuracy.png`` (val
accuracy vs epoch per configuration, mean over seeds with a min-max band; needs the
optional ``matplotlib``, skipped with a message without it).  ``--json`` prints the
JSON document on stdout (progress and messages go to stderr).

``--hdd-throughput`` (implemented, not part of the default run): for each
configuration, and for a sweep of chunk sizes (``--hdd-chunks``), reads one epoch of
raw records (no decoding; seqloader ``transform=None``, the files baseline reads
each file in a seeded random order) in a fresh process started under
``hddsim`` (``--hddsim``; it needs root, drops the page cache and
throttles the disk holding the data to ``--hdd-iops`` reads/s and ``--hdd-mbps``
MiB/s), and reports records/s and MB/s.  By default it generates a separate copy of
the dataset with ImageNet-sized images (``--hdd-size imagenet``, ~110 KB/record) so
that chunk sizes in bytes are realistic; ``--hdd-size small`` uses the training data.
``--work`` must then be on a block device (not tmpfs).

    python benchmarks/shuffle_accuracy.py                          # the experiment
    python benchmarks/shuffle_accuracy.py --seeds 0 --epochs 4     # a quick look
    python benchmarks/shuffle_accuracy.py --hdd-throughput --skip-training --work /data/sa
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchpaths import add_hddsim_argument  # noqa: E402

IMAGENET_RECORDS = 1_281_167
IMAGENET_PER_CLASS = IMAGENET_RECORDS / 1000
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

CONFIGS: dict[str, dict[str, Any]] = {
    "a_ideal": {"desc": "ideal: DataLoader(shuffle=True) over the files", "source": "files"},
    "b_seq_default": {"desc": "seqloader defaults, DB shuffled at write", "source": "shuffled",
                      "settings": "default", "shuffle": True},
    "c_sorted_default": {"desc": "seqloader defaults, class-sorted DB", "source": "sorted",
                         "settings": "default", "shuffle": True},
    "c_sorted_bigbuf": {"desc": "seqloader, big buffer + small chunks, class-sorted DB",
                        "source": "sorted", "settings": "big", "shuffle": True},
    "d_sorted_noshuffle": {"desc": "sequential, no shuffling, class-sorted DB",
                           "source": "sorted", "settings": None, "shuffle": False},
    "e_seq_noshuffle": {"desc": "sequential, no shuffling, DB shuffled at write (same order "
                                "every epoch)", "source": "shuffled", "settings": None,
                        "shuffle": False},
}
DEFAULT_CONFIGS = ["a_ideal", "b_seq_default", "c_sorted_default", "c_sorted_bigbuf",
                   "d_sorted_noshuffle"]


def log(*a: Any) -> None:
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- settings

def scaled_defaults(n: int, per_class: float, batch_size: int, rule: str) -> dict[str, int]:
    """The Loader defaults (cache 5000, chunk 1024 for ImageNet) scaled to ``n`` records
    (see "Scaling the defaults" in the module docstring)."""
    from seqloader.loader import DEFAULT_CACHE, DEFAULT_CHUNK

    if rule == "class":
        cache = DEFAULT_CACHE / IMAGENET_PER_CLASS * per_class
        chunk = DEFAULT_CHUNK / IMAGENET_PER_CLASS * per_class
    elif rule == "records":
        cache = DEFAULT_CACHE / IMAGENET_RECORDS * n
        chunk = DEFAULT_CHUNK / IMAGENET_RECORDS * n
    else:
        raise ValueError(f"unknown scale rule {rule!r}")
    return {"cache": int(min(n, max(batch_size, round(cache)))),
            "chunk_size": int(min(n, max(1, round(chunk))))}


def config_settings(name: str, args: argparse.Namespace, n: int) -> dict[str, Any]:
    """(cache, chunk_size, shuffle, source) of a configuration for an ``n``-record split."""
    cfg = CONFIGS[name]
    out: dict[str, Any] = {"source": cfg["source"], "shuffle": cfg.get("shuffle", True),
                           "cache": None, "chunk_size": None}
    if cfg["source"] == "files":
        return out
    if cfg["settings"] == "default":
        out.update(args.scaled)
    elif cfg["settings"] == "big":
        out["cache"] = int(min(n, max(args.batch_size, round(args.big_cache_frac * n))))
        out["chunk_size"] = int(min(n, args.big_chunk))
    else:  # no shuffling: the chunk size does not change the (file) order
        out["chunk_size"] = args.scaled["chunk_size"]
        out["cache"] = 1
    return out


# ----------------------------------------------------------------------------- data

def prepare_data(work: Path, args: argparse.Namespace, *, size: str, tag: str) -> dict[str, Any]:
    """Images under ``work/<tag>/images``, databases ``lmdb-shuffled`` and ``lmdb-sorted``;
    reused when a previous run made them with the same parameters."""
    from seqloader import WriteOptions, preprocess
    from seqloader.tools.synth import make_synthetic_imagenet

    base = work / tag
    params = {"classes": args.classes, "per_class": args.per_class,
              "val_per_class": args.val_per_class, "seed": args.data_seed, "size": size}
    marker = base / "params.json"
    paths = {"root": base / "images", "shuffled": base / "lmdb-shuffled",
             "sorted": base / "lmdb-sorted"}
    if marker.exists() and json.loads(marker.read_text()) == params:
        log(f"reusing the data in {base}")
        return {"params": params, **paths}
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_synthetic_imagenet(paths["root"], classes=args.classes, per_class=args.per_class,
                                val_per_class=args.val_per_class, seed=args.data_seed,
                                odd_fraction=0.0, size=size, workers=args.gen_workers,
                                progress=not args.no_progress)
        for key, shuffle in (("shuffled", True), ("sorted", False)):
            preprocess(paths["root"], paths[key],
                       options=WriteOptions(shuffle=shuffle, seed=args.data_seed, progress=False,
                                            workers=args.gen_workers))
    log(f"generated {tag} data in {time.perf_counter() - t:.1f} s")
    marker.write_text(json.dumps(params))
    return {"params": params, **paths}


def train_transform(size: int):
    import seqloader.transforms as T

    return T.Compose([T.RandomResizedCrop(size, scale=(0.25, 1.0)), T.RandomHorizontalFlip(),
                      T.ToTensor(), T.Normalize(MEAN, STD)])


def val_transform(size: int):
    import seqloader.transforms as T

    return T.Compose([T.Resize(int(round(size * 1.15))), T.CenterCrop(size), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


class Unfused:
    """Hide a seqloader Compose from ``compile_fused``: the Loader then decodes with
    ``decode_rgb`` and calls ``transform(img, rng)``, like the files baseline."""

    accepts_rng = True

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, img: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        return self.transform(img, rng)


class FilesDataset:
    """Item ``i``: ``(transform(RGB image), label, i)``, read from a file with OpenCV.  The
    augmentation generator is derived from ``(seed, epoch, i)``."""

    def __init__(self, root: Path, transform: Any, seed: int) -> None:
        from seqloader.write.scan import scan_class_tree

        scan = scan_class_tree(root)
        self.root, self.paths, self.labels = str(root), list(scan.paths), np.asarray(scan.labels)
        self.transform, self.seed, self.epoch = transform, seed, 0

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import cv2
        import torch

        bgr = cv2.imread(os.path.join(self.root, self.paths[i]), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"cannot decode {self.paths[i]}")
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.epoch, i, 0xF11E]))
        return torch.from_numpy(np.ascontiguousarray(self.transform(rgb, rng))), \
            int(self.labels[i]), i


class FilesTrain:
    """The ideal loader: a fresh uniform permutation every epoch."""

    def __init__(self, root: Path, args: argparse.Namespace, seed: int) -> None:
        import torch

        self.dataset = FilesDataset(root, train_transform(args.size), seed)
        self.labels = self.dataset.labels
        g = torch.Generator()
        g.manual_seed(seed)
        self.loader = torch.utils.data.DataLoader(self.dataset, batch_size=args.batch_size,
                                                  shuffle=True, num_workers=args.workers,
                                                  generator=g, drop_last=False)
        self.orders: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, e: int) -> Iterator[tuple[Any, Any]]:
        self.dataset.epoch = e  # workers are not persistent: they see it
        order = []
        for x, y, idx in self.loader:
            order.append(idx.numpy())
            yield x, y
        self.orders.append(np.concatenate(order))

    def close(self) -> None:
        pass


class SeqTrain:
    """seqloader on one of the databases; orders come from the plan (exact)."""

    def __init__(self, db_dir: Path, st: dict[str, Any], args: argparse.Namespace,
                 seed: int) -> None:
        from seqloader import Loader, open_database

        tf = train_transform(args.size)
        self.loader = Loader(db_dir, "train", tf if args.fused else Unfused(tf),
                             batch_size=args.batch_size, shuffle=st["shuffle"],
                             num_workers=args.workers, cache=st["cache"],
                             chunk_size=st["chunk_size"], seed=seed)
        self.labels = open_database(db_dir, "train").labels()
        self.cache = st["cache"]
        self.orders: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.loader)

    def epoch(self, e: int) -> Iterator[tuple[Any, Any]]:
        from seqloader.tools.quality import epoch_order

        self.loader.set_epoch(e)
        yield from self.loader
        self.orders.append(epoch_order(self.loader.plan_spec, e, cache=self.cache))

    def close(self) -> None:
        self.loader.close()


def load_val(db_dir: Path, size: int):
    """The whole val split as tensors (decoded once; the val transform is deterministic)."""
    import torch
    from seqloader import Loader

    xs, ys = [], []
    with Loader(db_dir, "val", Unfused(val_transform(size)), batch_size=256, shuffle=False,
                num_workers=0) as loader:
        for x, y in loader:
            xs.append(x)
            ys.append(y)
    return torch.cat(xs), torch.cat(ys)


# ----------------------------------------------------------------------------- training

def make_model(num_classes: int, width: int = 32):
    import torch.nn as nn

    def block(i: int, o: int) -> list:
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]

    w = width
    return nn.Sequential(*block(3, w), nn.MaxPool2d(2), *block(w, 2 * w), nn.MaxPool2d(2),
                         *block(2 * w, 4 * w), nn.MaxPool2d(2), *block(4 * w, 4 * w),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, num_classes))


def lr_at(step: int, total: int, base: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 0."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1 + math.cos(math.pi * t))


def evaluate(model, x_val, y_val) -> float:
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x_val), 500):
            correct += int((model(x_val[i:i + 500]).argmax(1) == y_val[i:i + 500]).sum())
    model.train()
    return correct / len(x_val)


def batch_distinct(labels: np.ndarray) -> int:
    return len(np.unique(labels))


def run_one(name: str, seed: int, data: dict[str, Any], args: argparse.Namespace,
            val: tuple[Any, Any]) -> dict[str, Any]:
    import torch
    from tqdm import tqdm
    from seqloader.tools.quality import distinct_ratio, epoch_correlation, expected_distinct
    from shuffle_quality import pair_repeat

    st = config_settings(name, args, args.n_train)
    train = FilesTrain(data["root"] / "train", args, seed) if st["source"] == "files" else \
        SeqTrain(data[st["source"]], st, args, seed)
    torch.manual_seed(seed)
    model = make_model(args.classes, args.width)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                          weight_decay=args.weight_decay)
    steps = len(train)
    total, warm = steps * args.epochs, max(1, int(round(args.warmup_epochs * steps)))
    loss_fn = torch.nn.CrossEntropyLoss()
    accs, losses, seconds, observed = [], [], [], []
    step = 0
    bar = tqdm(total=total, desc=f"{name} seed {seed}", unit="batch", leave=False,
               disable=args.no_progress, file=sys.stderr, dynamic_ncols=True)
    try:
        for e in range(args.epochs):
            t = time.perf_counter()
            tot_loss = n_seen = 0.0
            distinct = []
            for x, y in train.epoch(e):
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, total, args.lr, warm)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                tot_loss += loss.item() * len(y)
                n_seen += len(y)
                if len(y) == args.batch_size:
                    distinct.append(batch_distinct(y.numpy()))
                bar.update(1)
            seconds.append(time.perf_counter() - t)
            losses.append(tot_loss / max(n_seen, 1))
            accs.append(evaluate(model, *val))
            observed.append(float(np.mean(distinct)) if distinct else float("nan"))
            bar.set_postfix(acc=f"{accs[-1]:.3f}")
    finally:
        bar.close()
        train.close()
    labels = train.labels
    orders = train.orders
    exp = expected_distinct(labels, args.batch_size)
    quality = {
        "distinct_ratio": float(np.mean([distinct_ratio(labels, o, args.batch_size)
                                         for o in orders])),
        "epoch_correlation": float(np.mean([epoch_correlation(a, b)
                                            for a, b in zip(orders, orders[1:])]))
        if len(orders) > 1 else None,
        "pair_repeat": float(np.mean([pair_repeat(a, b, args.batch_size)
                                      for a, b in zip(orders, orders[1:])]))
        if len(orders) > 1 else None,
        "observed_distinct_ratio": float(np.nanmean(observed) / exp)}
    log(f"{name} seed {seed}: val acc " + " ".join(f"{a:.3f}" for a in accs)
        + f"  ({sum(seconds):.0f} s)")
    return {"config": name, "seed": seed, "settings": st, "val_acc": accs, "train_loss": losses,
            "epoch_seconds": seconds, "final_acc": accs[-1], "best_acc": max(accs),
            "quality": quality}


# ----------------------------------------------------------------------------- reference

def reference_quality(args: argparse.Namespace, labels_sorted: np.ndarray,
                      labels_shuffled: np.ndarray) -> list[dict[str, Any]]:
    """Shuffle-quality figures of the default settings: on ImageNet-size label layouts
    (1000 x 1300, batch 256, the real defaults) and on this dataset under both scaling
    rules (computed from the plan; two epochs)."""
    from seqloader.loader import DEFAULT_CACHE, DEFAULT_CHUNK
    from seqloader.read.plan import PlanSpec
    from seqloader.tools.quality import distinct_ratio, epoch_correlation, epoch_order
    from shuffle_quality import ideal_pair_repeat, pair_repeat

    def fig(lab_sorted, lab_shuf, n, B, cache, chunk) -> dict[str, Any]:
        spec = PlanSpec((n,), B, chunk, True, seed=0, num_workers=2)
        o = [epoch_order(spec, e, cache=cache) for e in (0, 1)]
        return {"records": n, "batch_size": B, "cache": cache, "chunk_size": chunk,
                "distinct_sorted": float(np.mean([distinct_ratio(lab_sorted, x, B) for x in o])),
                "distinct_shuffled": float(np.mean([distinct_ratio(lab_shuf, x, B) for x in o])),
                "epoch_correlation": epoch_correlation(o[0], o[1]),
                "pair_repeat": pair_repeat(o[0], o[1], B),
                "pair_repeat_ideal": ideal_pair_repeat(n, B)}

    rows = []
    if not args.no_imagenet_reference:
        big = np.repeat(np.arange(1000), 1300)
        perm = np.random.default_rng(0).permutation(len(big))
        rows.append({"what": "ImageNet-size layout, real defaults",
                     **fig(big, big[perm], len(big), 256, DEFAULT_CACHE, DEFAULT_CHUNK)})
    n = len(labels_sorted)
    for rule in ("class", "records"):
        s = scaled_defaults(n, args.per_class, args.batch_size, rule)
        rows.append({"what": f"this dataset, defaults scaled by rule '{rule}'"
                             + (" (used)" if rule == args.scale_rule else ""),
                     **fig(labels_sorted, labels_shuffled, n, args.batch_size,
                           s["cache"], s["chunk_size"])})
    return rows


# ----------------------------------------------------------------------------- hdd

def _read_once(spec: dict[str, Any]) -> dict[str, Any]:
    """Child of --hdd-throughput: read one epoch of raw records, report bytes and time
    (imports and opening the database are timed separately: ``open_seconds``)."""
    t = time.perf_counter()
    records = nbytes = 0
    if spec["kind"] == "files":
        paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(spec["root"]) for f in fs)
        order = np.random.default_rng(spec["seed"]).permutation(len(paths))
        t0 = time.perf_counter()
        for i in order:
            with open(paths[i], "rb") as f:
                nbytes += len(f.read())
            records += 1
    else:
        from seqloader import Loader

        with Loader(spec["db"], "train", None, batch_size=spec["batch_size"],
                    shuffle=spec["shuffle"], num_workers=0, cache=spec["cache"],
                    chunk_size=spec["chunk_size"], seed=spec["seed"]) as loader:
            t0 = time.perf_counter()
            for raw, _ in loader:
                records += len(raw)
                nbytes += sum(len(b) for b in raw)
    t1 = time.perf_counter()
    return {"records": records, "bytes": nbytes, "seconds": t1 - t0, "open_seconds": t0 - t}


def hdd_throughput(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Raw one-epoch read throughput of every configuration (and a chunk sweep) under
    hddsim, each in a fresh process with a cold page cache."""
    from seqloader import open_database

    data = prepare_data(work, args, size=args.hdd_size, tag=f"data-{args.hdd_size}")
    db = open_database(data["shuffled"], "train")
    n, rec_bytes = len(db), db.image_bytes / max(len(db), 1)
    jobs: list[tuple[str, dict[str, Any], Path]] = []
    for name in args.hdd_configs or args.configs:
        st = config_settings(name, args, n)
        if st["source"] == "files":
            jobs.append((name, {"kind": "files", "root": str(data["root"] / "train"),
                                "seed": 0}, data["root"]))
        else:
            jobs.append((name, {"kind": "db", "db": str(data[st["source"]]), "shuffle": st["shuffle"],
                                "cache": st["cache"], "chunk_size": st["chunk_size"],
                                "batch_size": args.batch_size, "seed": 0}, data[st["source"]]))
    for chunk in args.hdd_chunks:
        if chunk <= n:
            jobs.append((f"sweep chunk {chunk}", {
                "kind": "db", "db": str(data["shuffled"]), "shuffle": True,
                "cache": args.scaled["cache"], "chunk_size": chunk,
                "batch_size": args.batch_size, "seed": 0}, data["shuffled"]))
    rows = []
    for name, spec, where in jobs:
        cmd = [args.hddsim, "--iops", str(args.hdd_iops), "--mbps", str(args.hdd_mbps),
               "--dir", str(where), "--", sys.executable, str(Path(__file__).resolve()),
               "--_read-once", json.dumps(spec)]
        log(f"hdd: {name}: {' '.join(cmd[:7])} ...")
        p = subprocess.run(cmd, capture_output=True, text=True)
        row: dict[str, Any] = {"name": name, **{k: spec.get(k) for k in
                                                ("kind", "shuffle", "cache", "chunk_size")}}
        if p.returncode != 0:
            row["error"] = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            log(f"hdd: {name}: FAILED: {row['error']}")
        else:
            r = json.loads(p.stdout.strip().splitlines()[-1])
            row.update(r, records_per_s=r["records"] / r["seconds"],
                       mb_per_s=r["bytes"] / r["seconds"] / 1e6)
            if spec["kind"] == "db":
                row["chunk_mb"] = spec["chunk_size"] * rec_bytes / 1e6
                row["buffer_mb"] = spec["cache"] * rec_bytes / 1e6 if spec["shuffle"] else 0.0
        rows.append(row)
    return {"size": args.hdd_size, "records": n, "mean_record_bytes": rec_bytes,
            "iops": args.hdd_iops, "mbps": args.hdd_mbps, "hddsim": args.hddsim, "rows": rows}


# ----------------------------------------------------------------------------- report

def summarise(runs: list[dict[str, Any]], configs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by = {c: [r for r in runs if r["config"] == c] for c in configs}
    ref = {r["seed"]: r["final_acc"] for r in by.get("a_ideal", [])}
    for c, rs in by.items():
        if not rs:
            continue
        acc = np.asarray([r["val_acc"] for r in rs])
        final = acc[:, -1]
        paired = [r["final_acc"] - ref[r["seed"]] for r in rs if r["seed"] in ref]
        q = {k: float(np.mean([r["quality"][k] for r in rs]))
             if all(r["quality"][k] is not None for r in rs) else None
             for k in rs[0]["quality"]}
        out[c] = {"desc": CONFIGS[c]["desc"], "settings": rs[0]["settings"], "seeds": len(rs),
                  "val_acc_mean": acc.mean(0).tolist(), "val_acc_min": acc.min(0).tolist(),
                  "val_acc_max": acc.max(0).tolist(),
                  "final_mean": float(final.mean()), "final_std": float(final.std(ddof=1))
                  if len(final) > 1 else 0.0,
                  "final_min": float(final.min()), "final_max": float(final.max()),
                  "delta_vs_ideal_mean": float(np.mean(paired)) if paired else None,
                  "delta_vs_ideal_std": float(np.std(paired, ddof=1)) if len(paired) > 1 else None,
                  "quality": q,
                  "seconds_per_epoch": float(np.mean([np.mean(r["epoch_seconds"]) for r in rs]))}
    return out


def goals(summary: dict[str, Any], *, tol: float = 0.01, clear: float = 0.05) -> dict[str, Any]:
    g: dict[str, Any] = {"b_within_1pp": None, "d_clearly_worse": None,
                         "tolerance": tol, "clear_margin": clear}
    a, b, d = (summary.get(k) for k in ("a_ideal", "b_seq_default", "d_sorted_noshuffle"))
    if a and b:
        diff = b["final_mean"] - a["final_mean"]
        g["b_minus_a"] = diff
        g["b_within_1pp"] = abs(diff) <= tol
    if a and d:
        diff = d["final_mean"] - a["final_mean"]
        g["d_minus_a"] = diff
        g["d_clearly_worse"] = bool(diff <= -clear and d["final_max"] < a["final_min"])
    return g


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:+.1f}" if signed else f"{100 * v:.1f}"


def format_markdown(doc: dict[str, Any]) -> str:
    c = doc["conditions"]
    lines = ["# Shuffling vs accuracy (small CNN, synthetic ImageNet-like data)", ""]
    if doc["summary"]:
        lines += _training_markdown(doc)
    else:
        lines += ["No training in this run (`--skip-training`)."]
    lines += _hdd_markdown(doc)
    lines += ["", "Reproduce: `" + c["command"] + "`"]
    return "\n".join(lines) + "\n"


def _training_markdown(doc: dict[str, Any]) -> list[str]:
    c = doc["conditions"]
    s = doc["summary"]
    lines = [
        f"Data: {c['classes']} classes x {c['per_class']} train / {c['val_per_class']} val "
        f"images (`make_synthetic_imagenet`, size `{c['image_size']}`, data seed "
        f"{c['data_seed']}); {c['n_train']} train records. Training: {c['epochs']} epochs, batch "
        f"{c['batch_size']}, SGD (momentum 0.9, nesterov, wd {c['weight_decay']:g}), lr "
        f"{c['lr']:g} with {c['warmup_epochs']:g}-epoch warm-up + cosine, CNN width "
        f"{c['width']}, input {c['size']} px (RandomResizedCrop(scale 0.25-1) + flip); seeds "
        f"{c['seeds']}; {c['torch_threads']} torch thread(s), {c['workers']} loader worker(s); "
        f"{'fused' if c['fused'] else 'unfused'} seqloader transforms. Wall time "
        f"{c['seconds'] / 60:.1f} min ({c['date']}).", "",
        f"Scaled defaults (rule `{c['scale_rule']}`): cache {c['scaled']['cache']}, chunk_size "
        f"{c['scaled']['chunk_size']} (ImageNet: 5000 and 1024 for 1.28 M records); big buffer: "
        f"cache {c['big']['cache']} ({100 * c['big_cache_frac']:.0f} % of the records), chunk_size "
        f"{c['big']['chunk_size']}.", "",
        "## Final validation accuracy", "",
        "| config | order | DB | cache | chunk | distinct | epoch corr | pair repeat % "
        "| final acc % (mean ± sd) | min–max | Δ vs ideal (pp, paired) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in s.items():
        st, q = r["settings"], r["quality"]
        db = {"files": "files", "shuffled": "shuffled at write", "sorted": "class-sorted"}[st["source"]]
        d_sd = r["delta_vs_ideal_std"]
        delta = "–" if name == "a_ideal" or r["delta_vs_ideal_mean"] is None else (
            _pct(r["delta_vs_ideal_mean"], True) + ("" if d_sd is None else f" ± {100 * d_sd:.1f}"))
        lines.append(
            f"| {name} | {r['desc']} | {db} | {st['cache'] if st['shuffle'] and st['cache'] else '–'} "
            f"| {st['chunk_size'] if st['shuffle'] and st['chunk_size'] else '–'} "
            f"| {q['distinct_ratio']:.3f} "
            f"| {'–' if q['epoch_correlation'] is None else format(q['epoch_correlation'], '+.3f')} "
            f"| {'–' if q['pair_repeat'] is None else format(100 * q['pair_repeat'], '.2f')} "
            f"| {_pct(r['final_mean'])} ± {_pct(r['final_std'])} "
            f"| {_pct(r['final_min'])}–{_pct(r['final_max'])} | {delta} |")
    lines += ["", f"Ideal pair repeat for this dataset: {100 * c['ideal_pair_repeat']:.2f} %. "
              "Quality figures are means over the seeds and the epochs of training (Loader "
              "orders from the plan, the DataLoader's from the indices it yielded).", "",
              "## Validation accuracy per epoch (mean over seeds, %)", "",
              "| config | " + " | ".join(str(e + 1) for e in range(c["epochs"])) + " |",
              "|---|" + "---:|" * c["epochs"]]
    for name, r in s.items():
        lines.append(f"| {name} | " + " | ".join(_pct(v) for v in r["val_acc_mean"]) + " |")
    g = doc["goals"]
    lines += ["", "## Goals", ""]
    if g.get("b_within_1pp") is not None:
        lines.append(f"* (b) within {100 * g['tolerance']:.0f} pp of (a): "
                     f"{'**yes**' if g['b_within_1pp'] else '**no**'} "
                     f"(b − a = {100 * g['b_minus_a']:+.2f} pp on the mean final accuracy).")
    if g.get("d_clearly_worse") is not None:
        lines.append(f"* (d) clearly worse than (a) (≥ {100 * g['clear_margin']:.0f} pp lower and "
                     f"no overlap of the seeds' ranges): "
                     f"{'**yes**' if g['d_clearly_worse'] else '**no**'} "
                     f"(d − a = {100 * g['d_minus_a']:+.2f} pp).")
    lines += ["", "Notes: the seeds' spread (sd of the final accuracy) bounds what the 1-pp test "
              "can resolve. The class-sorted harm measured here is a lower bound for ImageNet: "
              "with few classes a batch covers most of them even from a few chunks (see "
              "`distinct` below: the defaults give far less diverse batches at full scale)."]
    ref = doc.get("reference_quality") or []
    if ref:
        lines += ["", "## Scale check: shuffle quality of the defaults (from the plan, 2 epochs)", "",
                  "| layout / rule | records | batch | cache | chunk | distinct (class-sorted) "
                  "| distinct (shuffled) | epoch corr | pair repeat % (ideal) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in ref:
            lines.append(f"| {r['what']} | {r['records']:,} | {r['batch_size']} | {r['cache']:,} "
                         f"| {r['chunk_size']:,} | {r['distinct_sorted']:.3f} "
                         f"| {r['distinct_shuffled']:.3f} | {r['epoch_correlation']:+.3f} "
                         f"| {100 * r['pair_repeat']:.3f} ({100 * r['pair_repeat_ideal']:.3f}) |")
    return lines


def _hdd_markdown(doc: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    hdd = doc.get("hdd_throughput")
    if hdd:
        lines += ["", f"## Raw read throughput under hddsim ({hdd['iops']:g} IO/s, "
                      f"{hdd['mbps']:g} MiB/s; {hdd['records']} records of "
                      f"{hdd['mean_record_bytes'] / 1e3:.0f} KB, size `{hdd['size']}`)", "",
                  "| setting | cache | chunk | chunk MB | buffer MB | records/s | MB/s | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in hdd["rows"]:
            if "error" in r:
                lines.append(f"| {r['name']} | | | | | error: {r['error']} | | |")
                continue
            shuf = r.get("shuffle")
            lines.append(f"| {r['name']} | {r['cache'] if shuf else '–'} "
                         f"| {r['chunk_size'] if shuf else '–'} "
                         f"| {_f(r.get('chunk_mb') if shuf else None, '.1f')} "
                         f"| {_f(r.get('buffer_mb') if shuf else None, '.1f')} "
                         f"| {r['records_per_s']:,.0f} "
                         f"| {r['mb_per_s']:.1f} | {r['seconds']:.1f} |")
    return lines


def _f(v: Any, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def plot(doc: dict[str, Any], path: Path) -> str | None:
    """Val accuracy vs epoch per configuration; None if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): plot skipped"
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    epochs = np.arange(1, doc["conditions"]["epochs"] + 1)
    for name, r in doc["summary"].items():
        line, = ax.plot(epochs, 100 * np.asarray(r["val_acc_mean"]), marker="o", ms=3,
                        label=f"{name} ({100 * r['final_mean']:.1f} %)")
        ax.fill_between(epochs, 100 * np.asarray(r["val_acc_min"]),
                        100 * np.asarray(r["val_acc_max"]), color=line.get_color(), alpha=0.15)
    c = doc["conditions"]
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"{c['classes']} classes x {c['per_class']}, seeds {c['seeds']} "
                 "(mean, min-max band)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# ----------------------------------------------------------------------------- CLI

def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers") from None


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in CONFIGS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown configuration(s) {bad}; choose from "
                                         f"{list(CONFIGS)}")
    return names


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the option help; the module docstring, as written, as the description."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    g = p.add_argument_group("data")
    g.add_argument("--classes", type=int, default=20)
    g.add_argument("--per-class", type=int, default=250, help="train images per class")
    g.add_argument("--val-per-class", type=int, default=100)
    g.add_argument("--data-seed", type=int, default=0, help="dataset and write-shuffle seed")
    g.add_argument("--work", type=Path, default=None,
                   help="folder for the generated data (kept and reused across runs); "
                        "default: a temporary folder, deleted at the end")
    g.add_argument("--gen-workers", type=int, default=2, help="processes for data generation")
    g = p.add_argument_group("training")
    g.add_argument("--configs", type=_names, default=list(DEFAULT_CONFIGS),
                   help=f"comma-separated, from {list(CONFIGS)}")
    g.add_argument("--seeds", type=_ints, default=[0, 1, 2])
    g.add_argument("--epochs", type=int, default=10)
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--size", type=int, default=32, help="input resolution (px)")
    g.add_argument("--width", type=int, default=32, help="CNN base width (channels)")
    g.add_argument("--lr", type=float, default=0.05)
    g.add_argument("--weight-decay", type=float, default=5e-4)
    g.add_argument("--warmup-epochs", type=float, default=0.5)
    g.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    g.add_argument("--workers", type=int, default=0,
                   help="decode workers of every loader (0 = in-process)")
    g.add_argument("--fused", action="store_true",
                   help="let the seqloader configurations use the Loader's fused pipeline")
    g = p.add_argument_group("seqloader settings")
    g.add_argument("--scale-rule", choices=("class", "records"), default="class",
                   help="how the defaults (cache 5000, chunk 1024 for ImageNet) are scaled")
    g.add_argument("--cache", type=int, default=None, help="override the scaled default cache")
    g.add_argument("--chunk-size", type=int, default=None,
                   help="override the scaled default chunk_size")
    g.add_argument("--big-cache-frac", type=float, default=0.25,
                   help="c_sorted_bigbuf: cache as a fraction of the records")
    g.add_argument("--big-chunk", type=int, default=16, help="c_sorted_bigbuf: chunk_size")
    g.add_argument("--no-imagenet-reference", action="store_true",
                   help="skip the ImageNet-size shuffle-quality reference (saves ~5 s)")
    g = p.add_argument_group("output")
    g.add_argument("--out-dir", "--out", dest="out_dir", default=".",
                   help="where shuffle_accuracy.{json,md,png} go ('' = nowhere; "
                        "benchmarks/results replaces the committed results)")
    g.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    g.add_argument("--no-plot", action="store_true")
    g.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("HDD throughput (run on a quiet machine, as root)")
    g.add_argument("--hdd-throughput", action="store_true",
                   help="also measure raw one-epoch read throughput of every configuration "
                        "under hddsim (cold page cache)")
    g.add_argument("--skip-training", action="store_true",
                   help="only the HDD throughput measurement")
    add_hddsim_argument(g)
    g.add_argument("--hdd-iops", type=int, default=100)
    g.add_argument("--hdd-mbps", type=int, default=150)
    g.add_argument("--hdd-size", choices=("imagenet", "small"), default="imagenet",
                   help="image size of the data read for the throughput measurement")
    g.add_argument("--hdd-configs", type=_names, default=None,
                   help="configurations to measure [default: --configs]")
    g.add_argument("--hdd-chunks", type=_ints, default=[16, 64, 256, 1024],
                   help="chunk sizes of the sweep (DB shuffled at write, scaled default cache)")
    p.add_argument("--_read-once", dest="read_once", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    args = build_parser().parse_args(argv)
    if args.read_once is not None:  # child of --hdd-throughput
        print(json.dumps(_read_once(json.loads(args.read_once))), flush=True)
        return None
    if args.skip_training and not args.hdd_throughput:
        raise SystemExit("--skip-training only makes sense with --hdd-throughput")
    if args.hdd_throughput and not (args.hddsim and os.access(args.hddsim, os.X_OK)):
        raise SystemExit(f"--hdd-throughput: {args.hddsim} is not an executable (give --hddsim PATH)")
    if not args.seeds or args.epochs < 1 or args.batch_size < 1:
        raise SystemExit("need at least one seed, one epoch and a positive batch size")
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    args.n_train = args.classes * args.per_class
    args.scaled = scaled_defaults(args.n_train, args.per_class, args.batch_size, args.scale_rule)
    if args.cache is not None:
        args.scaled["cache"] = args.cache
    if args.chunk_size is not None:
        args.scaled["chunk_size"] = args.chunk_size
    big = config_settings("c_sorted_bigbuf", args, args.n_train)
    tmp = None
    if args.work is None:
        tmp = tempfile.mkdtemp(prefix="shuffle_accuracy-")
        work = Path(tmp)
    else:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/shuffle_accuracy.py " + " ".join(
        sys.argv[1:] if argv is None else list(argv))
    doc: dict[str, Any] = {}
    try:
        runs: list[dict[str, Any]] = []
        ref: list[dict[str, Any]] = []
        if not args.skip_training:
            from seqloader import open_database

            data = prepare_data(work, args, size="small", tag="data-small")
            val = load_val(data["shuffled"], args.size)
            log(f"{args.n_train} train / {len(val[1])} val records; scaled defaults "
                f"({args.scale_rule}): {args.scaled}; big buffer: cache {big['cache']}, "
                f"chunk {big['chunk_size']}")
            ref = reference_quality(args, open_database(data["sorted"], "train").labels(),
                                    open_database(data["shuffled"], "train").labels())
            for seed in args.seeds:
                for name in args.configs:
                    runs.append(run_one(name, seed, data, args, val))
        hdd = hdd_throughput(args, work) if args.hdd_throughput else None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    import cv2
    from shuffle_quality import ideal_pair_repeat

    summary = summarise(runs, args.configs)
    doc = {"conditions": {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
        "python": platform.python_version(), "torch": torch.__version__,
        "opencv": cv2.__version__, "platform": platform.platform(),
        "classes": args.classes, "per_class": args.per_class,
        "val_per_class": args.val_per_class, "image_size": "small", "data_seed": args.data_seed,
        "n_train": args.n_train, "epochs": args.epochs, "batch_size": args.batch_size,
        "size": args.size, "width": args.width, "lr": args.lr,
        "weight_decay": args.weight_decay, "warmup_epochs": args.warmup_epochs,
        "seeds": args.seeds, "torch_threads": args.threads, "workers": args.workers,
        "fused": args.fused, "configs": args.configs, "scale_rule": args.scale_rule,
        "scaled": args.scaled, "big": {"cache": big["cache"], "chunk_size": big["chunk_size"]},
        "big_cache_frac": args.big_cache_frac,
        "ideal_pair_repeat": ideal_pair_repeat(args.n_train, args.batch_size),
        "seconds": time.perf_counter() - t0},
        "runs": runs, "summary": summary, "goals": goals(summary),
        "reference_quality": ref, "hdd_throughput": hdd}
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "shuffle_accuracy.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / "shuffle_accuracy.md").write_text(format_markdown(doc))
        if runs and not args.no_plot:
            msg = plot(doc, out / "shuffle_accuracy.png")
            if msg:
                log(msg)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_markdown(doc))
    return doc


if __name__ == "__main__":
    main()
