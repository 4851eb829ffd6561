"""One engine: a pipeline composed by hand from the public stages yields the Loader's
order, and both keep the order the Loader had before the stages became its engine."""
import hashlib
import json

import pytest

from conftest import read_records
from seqloader import Loader

#: sha256[:16] of the JSON list of batches of global record indices that the Loader yielded
#: for ``lmdb_dir``'s train split (48 records) before its engine was rebuilt from the stages,
#: keyed by (shuffle, drop_last, seed, rank, epoch); batch_size=5, cache=6, chunk_size=8,
#: world_size=2.  The order depends only on the record count and these settings.
ORACLE = {
    (False, False, 0, 0, 0): "8f1fe23c1d3b1a76",
    (False, False, 0, 0, 1): "8f1fe23c1d3b1a76",
    (False, False, 0, 1, 0): "f119e4bbe8546762",
    (False, False, 0, 1, 1): "f119e4bbe8546762",
    (False, False, 5, 0, 0): "8f1fe23c1d3b1a76",
    (False, False, 5, 0, 1): "8f1fe23c1d3b1a76",
    (False, False, 5, 1, 0): "f119e4bbe8546762",
    (False, False, 5, 1, 1): "f119e4bbe8546762",
    (False, True, 0, 0, 0): "5a9ff876033553de",
    (False, True, 0, 0, 1): "5a9ff876033553de",
    (False, True, 0, 1, 0): "ae36348a4c3dcde8",
    (False, True, 0, 1, 1): "ae36348a4c3dcde8",
    (False, True, 5, 0, 0): "5a9ff876033553de",
    (False, True, 5, 0, 1): "5a9ff876033553de",
    (False, True, 5, 1, 0): "ae36348a4c3dcde8",
    (False, True, 5, 1, 1): "ae36348a4c3dcde8",
    (True, False, 0, 0, 0): "bdd82025a0ab4d01",
    (True, False, 0, 0, 1): "d26e58751a18fe6d",
    (True, False, 0, 1, 0): "b97cefdbaeddeefd",
    (True, False, 0, 1, 1): "dbe655023e66a13d",
    (True, False, 5, 0, 0): "6274eab1830e008c",
    (True, False, 5, 0, 1): "53885ffdd73212fa",
    (True, False, 5, 1, 0): "5ee04e86daf51910",
    (True, False, 5, 1, 1): "e898790b3b14b2fa",
    (True, True, 0, 0, 0): "cad6784a708e5d7a",
    (True, True, 0, 0, 1): "671a401abed5d191",
    (True, True, 0, 1, 0): "3a3bbad0f85f5edc",
    (True, True, 0, 1, 1): "1230fe4213f37d97",
    (True, True, 5, 0, 0): "78b96beb9990935e",
    (True, True, 5, 0, 1): "35f546bf4acbb03d",
    (True, True, 5, 1, 0): "0357b28d6bd0ad69",
    (True, True, 5, 1, 1): "5e35e5414d3cf988",
}
KW = dict(batch_size=5, cache=6, chunk_size=8, world_size=2)


def _digest(order: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(order).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def index_of(lmdb_dir):
    """Encoded image bytes -> global record index (the images are distinct)."""
    out = {r.image: i for i, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")}
    assert len(out) == 48, "the oracle was recorded for 48 train records"
    return out


@pytest.mark.parametrize("key", sorted(ORACLE))
def test_loader_keeps_the_recorded_order(lmdb_dir, index_of, key):
    shuffle, drop_last, seed, rank, epoch = key
    with Loader(lmdb_dir, "train", None, shuffle=shuffle, drop_last=drop_last, seed=seed,
                rank=rank, num_workers=0, **KW) as loader:
        loader.set_epoch(epoch)
        order = [[index_of[bytes(b)] for b in raw] for raw, _ in loader]
    assert _digest(order) == ORACLE[key]


def _pipeline(lmdb_dir, shuffle, drop_last, seed, rank, epoch, num_workers=0, transform=None):
    """The Loader's stages, composed by hand with the Loader's settings."""
    from seqloader import BatchData, LMDBData, LocallyShuffleData, MultiProcessMapAndBatchData

    df = LMDBData(lmdb_dir, "train", shuffle=shuffle, chunk_size=KW["chunk_size"], seed=seed,
                  rank=rank, world_size=KW["world_size"])
    if shuffle:
        df = LocallyShuffleData(df, KW["cache"])
    df = BatchData(df, KW["batch_size"], remainder=not drop_last)
    df = MultiProcessMapAndBatchData(df, num_workers, transform)
    df.reset_state()
    df.source.epoch = epoch
    return df


@pytest.mark.parametrize("key", sorted(ORACLE))
def test_a_pipeline_of_the_stages_keeps_the_loaders_order(lmdb_dir, index_of, key):
    df = _pipeline(lmdb_dir, *key)
    try:
        assert len(df) == len(Loader(lmdb_dir, "train", None, shuffle=key[0], drop_last=key[1],
                                     seed=key[2], rank=key[3], **KW))
        order = [[index_of[bytes(b)] for b in images] for images, _ in df]
    finally:
        df.close()
    assert _digest(order) == ORACLE[key]


def test_batchdata_over_the_reader_stages_yields_the_same_batches(lmdb_dir, index_of):
    """The datapoint-level stages follow the same plan (labels and bytes)."""
    from seqloader import BatchData, LMDBData, LocallyShuffleData

    key = (True, True, 5, 1, 1)
    df = BatchData(LocallyShuffleData(LMDBData(lmdb_dir, "train", shuffle=True, chunk_size=8,
                                               seed=5, rank=1, world_size=2), 6), 5)
    df.reset_state()
    df.source.epoch = 1
    got = list(df)
    df.close()
    assert _digest([[index_of[b] for b in images] for images, _ in got]) == ORACLE[key]
    with Loader(lmdb_dir, "train", None, shuffle=True, drop_last=True, seed=5, rank=1,
                num_workers=0, **KW) as loader:
        loader.set_epoch(1)
        want = [([bytes(b) for b in raw], labels.tolist()) for raw, labels in loader]
    assert [(images, labels.tolist()) for images, labels in got] == want


def test_a_pipeline_decodes_exactly_as_the_loader(lmdb_dir):
    """Samples (augmentation draws included) and labels equal the Loader's, with workers."""
    import torch
    import seqloader.transforms as T

    tf = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor()])
    df = _pipeline(lmdb_dir, True, False, 5, 1, 1, num_workers=2, transform=tf)
    try:
        got = list(df)
    finally:
        df.close()
    with Loader(lmdb_dir, "train", tf, shuffle=True, seed=5, rank=1, num_workers=2,
                **KW) as loader:
        loader.set_epoch(1)
        want = [(x.clone(), y.clone()) for x, y in loader]
    assert len(got) == len(want) > 1
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(torch.from_numpy(x), wx) and torch.equal(torch.from_numpy(y), wy)
