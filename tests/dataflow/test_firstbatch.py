"""The first batch decoded by every worker together (seqloader/dataflow/firstbatch.py,
NOTE [ first batch split ]): the same order and pixels as one worker's, each part's
records inside its own region, errors named as ever."""
from __future__ import annotations

import numpy as np
import pytest

import seqloader.transforms as T
from seqloader import Loader, RecordError
from seqloader.dataflow.batch import BatchSpec
from seqloader.dataflow.cpumode import CPUMode
from seqloader.dataflow.gpugather import GatherMode, GPUOptions
from seqloader.dataflow.rawmode import RawMode
from seqloader.dataflow.feedthread import FeedThread
from seqloader.dataflow.firstbatch import MIN_PART, part_layout, splittable


def _fused():
    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2])])


@pytest.fixture
def splits(monkeypatch):
    """The parts of each split batch the feed threads sent (0: not split)."""
    got: list[int] = []
    split = FeedThread._split

    def counted(self, plan, gen, j, recs, slot, whole, parts, *counting):
        done = split(self, plan, gen, j, recs, slot, whole, parts, *counting)
        got.append(parts if done else 0)
        return done
    monkeypatch.setattr(FeedThread, "_split", counted)
    return got


def _epochs(lmdb_dir, workers, epochs=2, **kw):
    out = []
    with Loader(lmdb_dir, "train", _fused(), batch_size=16, shuffle=True, num_workers=workers,
                world_size=1, rank=0, **kw) as loader:
        for _ in range(epochs):
            out.append([(x.numpy().copy(), y.numpy().copy()) for x, y in loader])
    return out


@pytest.mark.parametrize("workers,persistent", [(2, True), (3, False)])
def test_a_split_first_batch_has_the_pixels_of_one_worker(lmdb_dir, splits, workers,
                                                          persistent):
    one = _epochs(lmdb_dir, 1)
    assert splits == []  # (one worker: nothing to split)
    many = _epochs(lmdb_dir, workers, persistent_workers=persistent)
    # the first epoch's first batch always; without persistent workers every epoch's
    assert splits == [workers] * (1 if persistent else 2)
    for e1, e2 in zip(one, many):
        assert len(e1) == len(e2)
        for (x1, y1), (x2, y2) in zip(e1, e2):
            np.testing.assert_array_equal(y1, y2)
            np.testing.assert_array_equal(x1, x2)


def _cursed(label):
    if label == 2:
        raise ZeroDivisionError("label two is cursed")
    return label


def test_a_failing_record_in_a_part_is_named(lmdb_dir, splits):
    def first_error(workers):
        with Loader(lmdb_dir, "train", _fused(), batch_size=48, shuffle=True,
                    num_workers=workers, world_size=1, rank=0,
                    target_transform=_cursed) as loader:
            with pytest.raises(RecordError) as ei:
                next(iter(loader))
        return ei.value
    e0, e2 = first_error(0), first_error(2)
    assert splits == [2]
    assert (e2.index, e2.path, e2.exc_type) == (e0.index, e0.path, "ZeroDivisionError")
    assert e2.worker is not None


def _spec(sample_nbytes: int, batch: int = 16, tail: int = 0) -> BatchSpec:
    spec = BatchSpec(mode=CPUMode(), batch_size=batch, sample_shape=(sample_nbytes,),
                     sample_dtype="uint8", mean_record=tail)
    return spec


@pytest.mark.parametrize("seed", range(5))
def test_each_parts_records_lie_in_its_own_region(seed):
    rng = np.random.default_rng(seed)
    spec = _spec(1000, tail=400)
    sizes = rng.integers(100, 900, 16).tolist()
    layout = part_layout(spec, sizes, 3)
    assert layout is not None
    L, S = spec.labels_nbytes, spec.sample_nbytes
    assert [a for a, _, _ in layout] == [0, 5, 10] and layout[-1][1] == 16
    for k, (a, b, start) in enumerate(layout):
        end = spec.slot_nbytes if k == 2 else L + b * S
        ends = start + np.cumsum(sizes[a:b])
        assert start >= L + a * S and ends[-1] == end  # inside the part's region
        # record i+1 begins at or after sample i's end: read before it is overwritten
        assert np.all(ends[:-1] >= L + S * np.arange(a + 1, b))


def test_a_batch_that_does_not_fit_per_part_is_not_split():
    spec = _spec(100, tail=0)
    assert part_layout(spec, [150] * 16, 2) is None  # records larger than samples
    assert part_layout(spec, [50] * 16, 2) is not None
    assert part_layout(spec, [50] * (2 * MIN_PART - 1), 2) is None  # too few records


def test_only_the_fused_recipe_with_class_labels_is_split():
    fused = BatchSpec(mode=CPUMode(), batch_size=8, fused=object())
    assert splittable(fused, 2) and not splittable(fused, 1)
    assert not splittable(BatchSpec(mode=CPUMode(), batch_size=8, transform=abs), 2)
    assert not splittable(BatchSpec(mode=GatherMode(GPUOptions()), batch_size=8,
                                    fused=object()), 2)
    assert not splittable(BatchSpec(mode=RawMode(), batch_size=8, fused=object()), 2)
    assert not splittable(BatchSpec(mode=CPUMode(), batch_size=8, fused=object(),
                                    target_kind="any"), 2)


@pytest.fixture(scope="module")
def unverified_dir(synth_tree, tmp_path_factory):
    """``synth_tree`` written without the decode check: its undecodable files are records."""
    import warnings

    from seqloader import WriteOptions, preprocess

    out = tmp_path_factory.mktemp("unverified")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preprocess(synth_tree.root, out, options=WriteOptions(progress=False, verify=False))
    return out


def test_an_undecodable_record_is_named_when_the_replay_meets_it(unverified_dir, splits,
                                                                 monkeypatch):
    from seqloader.dataflow import feedthread

    rngs: list = []  # (each part's generator)
    part_rngs = feedthread.part_rngs

    def kept(*args):
        rngs.extend(part_rngs(*args))
        return rngs
    monkeypatch.setattr(feedthread, "part_rngs", kept)

    def first_error(workers):
        with Loader(unverified_dir, "train", _fused(), batch_size=48, shuffle=True,
                    num_workers=workers, world_size=1, rank=0) as loader:
            with pytest.raises(RecordError) as ei:
                for _ in loader:
                    pass
        return ei.value
    e0, e3 = first_error(0), first_error(3)
    assert splits == [3]
    assert (e3.index, e3.path, e3.exc_type) == (e0.index, e0.path, e0.exc_type)
    assert e3.worker is not None and len(rngs) == 3


def test_each_part_gets_the_generator_its_first_record_finds(lmdb_dir):
    import msgpack

    from conftest import read_records
    from seqloader.dataflow.decode import batch_rng
    from seqloader.dataflow.firstbatch import part_rngs
    from seqloader.format.pixels import image_source
    from seqloader.transforms import compile_fused

    fused = compile_fused(_fused())
    spec = BatchSpec(mode=CPUMode(), batch_size=24, fused=fused, seed=5)
    values = [msgpack.packb({"image": r.image, "label": r.label, "path": r.path})
              for _, r in read_records(lmdb_dir / "ILSVRC-train.lmdb")[:24]]
    layout = [(0, 8, 0), (8, 16, 0), (16, 24, 0)]
    rngs = part_rngs(spec, values, layout, 3, 7)
    rng = batch_rng(5, 3, 0, 7)  # one worker's draws, record by record
    for i, v in enumerate(values[:16]):
        if i in (0, 8):
            assert rngs[i // 8].bit_generator.state == rng.bit_generator.state
        fused.prepare(image_source(msgpack.unpackb(v, raw=False)), rng)
    assert rngs[2].bit_generator.state == rng.bit_generator.state
    # a record whose draw fails: the parts after it get no generator (its worker reports it)
    broken = values[:10] + [b"not a record"] + values[11:]
    got = part_rngs(spec, broken, layout, 3, 7)
    assert got[1] is not None and got[1].bit_generator.state == rngs[1].bit_generator.state
    assert got[2] is None
