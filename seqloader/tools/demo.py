"""``seqloader demo``: the whole job end to end on a small synthetic dataset."""
from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path

__all__ = ["run_demo"]


def run_demo(work: Path, *, progress: bool = True, classes: int = 10, per_class: int = 60,
             val_per_class: int = 10, size: str = "imagenet", batch_size: int = 64) -> int:
    """Synthesise a small ImageNet-like tree in ``work`` (``classes`` x ``per_class`` train
    and ``val_per_class`` val images of ``size``, 2 of them broken), preprocess it to
    LMDB, verify it, and train-load it with :class:`~seqloader.Loader` for two epochs in
    batches of ``batch_size``.  Idempotent."""
    from ..read.database import open_database
    from ..write.preprocess import preprocess
    from .synth import make_synthetic_imagenet
    from .dbtools.verify import verify_database
    from ..write.writer import WriteOptions

    src, out = work / "imagenet", work / "lmdb"
    print(f"[1/4] synthetic ImageNet-like tree in {src}")
    if not (src / "train").is_dir():
        # generated under another name and renamed when complete: an interrupted run
        # leaves only that (its own) folder, which the next run discards and redoes
        tmp = work / "imagenet.partial"
        if tmp.exists():
            shutil.rmtree(tmp)
        make_synthetic_imagenet(tmp, classes=classes, per_class=per_class,
                                val_per_class=val_per_class, seed=0, bad=2, size=size,
                                workers=2, progress=progress)
        if src.is_dir() and not any(src.iterdir()):
            src.rmdir()
        tmp.rename(src)
    print(f"[2/4] preprocess -> {out}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the 2 bad files are reported below
        reports = preprocess(src, out, options=WriteOptions(progress=progress))
    for r in reports:
        bad = (f"; {len(r.bad_files)} broken file(s) skipped, listed in "
               f"{r.shards[0].path}.bad-files.tsv" if r.bad_files else "")
        print(f"      {r.split}: {r.num_records} records, {r.image_bytes / 2**20:.1f} MiB{bad}")
    print("[3/4] verify")
    for split in ("train", "val"):
        res = verify_database(out, split, progress=progress)
        print(f"      {split}: {res.num_records} records {'OK' if res.ok else 'FAILED'}")
        if not res.ok:
            return 1
    db = open_database(out, "train")
    print(f"[4/4] load {db.num_records} records with the ImageNet training transform, 2 workers")
    from .. import transforms as T
    from ..loader import Loader

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    loader = Loader(out, "train", tf, batch_size=batch_size, shuffle=True, num_workers=2,
                    world_size=1)  # (one process, also under a launcher's WORLD_SIZE)
    for epoch in range(2):
        t0, n, shape, last = time.perf_counter(), 0, None, 0
        for images, labels in loader:
            n += len(labels)
            shape = shape or tuple(images.shape)  # (the first batch: a full one)
            last = len(labels)
        dt = time.perf_counter() - t0
        tail = f" (the last of {last})" if last != batch_size else ""
        print(f"      epoch {epoch}: {len(loader)} batches of {shape}{tail}, {n} images, "
              f"{n / dt:.0f} images/s")
    loader.close()
    return 0
