"""The order-preserving parallel maps behind the writer (real forked processes)."""
import hashlib
import multiprocessing as mp
import os
import signal
import pytest

from seqloader.workers.processmap import process_map
from seqloader.workers.arena import ARENAS
from seqloader.workers.threadmap import thread_map
from seqloader.errors import RecordError, WorkerDiedError


@pytest.fixture(autouse=True)
def _no_other_children():
    """Start with no child processes of earlier tests (a Loader they left to the garbage
    collector), so that each test's ``mp.active_children()`` check sees its own."""
    import gc
    gc.collect()
    for p in mp.active_children():
        p.join(5)
    yield


def _payload(i: int) -> bytes:
    n = (i * 7919) % 40_000 + (100_000 if i % 13 == 0 else 0)  # some exceed a 64 KB slot
    seed = hashlib.sha256(str(i).encode()).digest()
    return (seed * (n // 32 + 1))[:n]


def _work(i: int):
    if i % 5 == 0:
        return i  # not a tuple: passes through as it is
    return i, _payload(i), b"small", _payload(i + 1)


def _fail_on_7(i: int):
    if i == 7:
        raise ValueError(f"bad item {i}")
    return i


def _die_on_5(i: int):
    if i == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


def _expected(i: int):
    return i if i % 5 == 0 else (i, _payload(i), b"small", _payload(i + 1))


@pytest.mark.parametrize("slot_bytes", [64 << 10, 0])
def test_process_map_returns_every_result_in_order_and_intact(slot_bytes):
    """Bytes come back through the shared slots (several per slot, offsets matter),
    by pipe when they do not fit, and the pickled way with ``slot_bytes=0``."""
    items = range(150)
    got = list(process_map(_work, items, workers=2, chunk=4, slot_bytes=slot_bytes))
    assert len(got) == len(items)
    for i, r in zip(items, got):
        assert r == _expected(i), i
        if isinstance(r, tuple):
            assert all(type(v) in (int, bytes) for v in r)


def test_process_map_raises_the_workers_error_with_its_traceback():
    with pytest.raises(RecordError, match="record 7: ValueError: bad item 7") as info:
        list(process_map(_fail_on_7, range(40), workers=2, chunk=3))
    e = info.value
    assert (e.index, e.path, e.exc_type, e.exc_message) == (7, None, "ValueError", "bad item 7")
    assert e.worker == 7 // 3 % 2
    assert "_fail_on_7" in str(e.__cause__) and "_fail_on_7" in e.worker_traceback
    assert not mp.active_children()
    assert not ARENAS  # its slots are gone with it


def test_process_map_reports_a_killed_worker_and_leaves_no_children():
    with pytest.raises(WorkerDiedError, match=r"worker 0 \(pid \d+\) was killed by SIGKILL") as info:
        list(process_map(_die_on_5, range(40), workers=2, chunk=2))
    assert info.value.exitcode == -signal.SIGKILL
    assert not mp.active_children()


def test_process_map_closed_early_stops_its_workers():
    gen = process_map(_work, range(10_000), workers=2, chunk=4)
    assert next(gen) == _expected(0)
    gen.close()
    assert not mp.active_children() and not ARENAS


def test_thread_map_keeps_order_and_raises_at_the_failing_item():
    assert list(thread_map(lambda i: i * i, range(100), workers=3)) == [i * i for i in range(100)]
    got = []
    with pytest.raises(ValueError, match="bad item 7"):
        for r in thread_map(_fail_on_7, range(20), workers=3):
            got.append(r)
    assert got == list(range(7))
