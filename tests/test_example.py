"""examples/imagenet/main.py end to end, as subprocesses, on a tiny synthetic dataset:
train + validate, exact mid-epoch resume (Ctrl-C-style stop, SIGINT, kill -9), evaluate
only, the folder loader, --gpu-normalize and 2-process DDP (gloo)."""
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "examples" / "imagenet" / "main.py"
SMALL = ["--image-size", "32", "-b", "8", "--workers", "2", "--lr", "0.01", "--print-freq", "1"]
# 2 epochs of 4 iterations (of 6), a mid-epoch checkpoint every 2
TRAIN = SMALL + ["--epochs", "2", "--max-iters", "4", "--save-every", "2"]
TIMEOUT = 120


def _env():
    # one thread per process: the machine is small and shared with the loader workers
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def run(*args, cwd, expect=0, launcher=None):
    cmd = (launcher or [sys.executable, str(MAIN)]) + [str(a) for a in args]
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == expect, f"exit {p.returncode}\n{p.stdout}\n{p.stderr[-4000:]}"
    return p


def batches(log):
    """The logged training batches: (epoch, iteration, pixel checksum, labels) lines."""
    return Path(log).read_text().splitlines() if Path(log).exists() else []


def accuracy_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith(" * acc@1")]


def load(path):
    return torch.load(path, map_location="cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from seqloader import WriteOptions, preprocess
    from seqloader.tools.synth import make_synthetic_imagenet

    root = tmp_path_factory.mktemp("example")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_synthetic_imagenet(root / "tree", classes=4, per_class=12, val_per_class=3, seed=0,
                                size="small", progress=False)
        preprocess(root / "tree", root / "lmdb", options=WriteOptions(progress=False))
    return root


@pytest.fixture(scope="module")
def reference(data):
    """An uninterrupted run of TRAIN: (process, checkpoint dir, logged batches)."""
    p = run(data / "lmdb", *TRAIN, "--checkpoint-dir", data / "ref",
            "--log-batches", data / "ref.log", cwd=data)
    return p, data / "ref", batches(data / "ref.log")


def test_trains_and_validates_end_to_end(reference):
    p, ckdir, log = reference
    assert p.stdout.splitlines()[-1].startswith("done: epochs=2, best acc@1=")
    assert len(accuracy_lines(p.stdout)) == 2 and "(12 images)" in p.stdout
    assert "train 1" in p.stderr and "img_s=" in p.stderr  # tqdm bars
    assert [line.split()[:2] for line in log] == [[str(e), str(i)] for e in (0, 1) for i in range(4)]
    assert all(len(line.split()) == 3 + 8 for line in log)  # batches of 8 labels
    assert len(set(log)) == len(log)
    ck = load(ckdir / "checkpoint.pth.tar")
    assert (ck["epoch"], ck["iteration"]) == (2, 0)
    assert (ck["loader"]["epoch"], ck["loader"]["position"]) == (2, 0)
    assert {"state_dict", "optimizer", "scheduler", "best_acc1"} <= set(ck)
    assert (ckdir / "model_best.pth.tar").exists()


@pytest.mark.slow
def test_stop_and_resume_sees_exactly_the_remaining_batches(data, reference):
    ref_p, _, ref_log = reference
    ck, log = data / "stop", data / "stop.log"
    p = run(data / "lmdb", *TRAIN, "--checkpoint-dir", ck, "--log-batches", log,
            "--stop-after-iters", 3, cwd=data, expect=130)  # "Ctrl-C" after 3 iterations
    assert "interrupted at epoch 0, iteration 3" in p.stderr
    state = load(ck / "checkpoint.pth.tar")
    assert (state["epoch"], state["iteration"]) == (0, 3)  # not the periodic one at 2
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (0, 3)
    assert batches(log) == ref_log[:3]

    resume = shlex.split(p.stderr.split("resume with: ")[1].splitlines()[0])  # as printed
    assert resume[-2:] == ["--resume", str(ck / "checkpoint.pth.tar")]
    # resumed reading with direct I/O (the first run read through the page cache): the
    # order depends on record positions only, so the batches must not change
    q = run(*resume[2:], "--io", "direct", cwd=data, launcher=resume[:2])
    assert "resumed from" in q.stdout and q.stdout.splitlines()[-1].startswith("done: epochs=2")
    assert batches(log) == ref_log  # the resumed run logged exactly ref_log[3:]
    # model, optimizer and scheduler were restored too: the same validation results
    assert accuracy_lines(q.stdout) == accuracy_lines(ref_p.stdout)


@pytest.mark.slow
def test_evaluate_a_checkpoint(data, reference):
    ref_p, ckdir, _ = reference
    p = run(data / "lmdb", *SMALL, "--evaluate", "--resume", ckdir / "model_best.pth.tar", cwd=data)
    (line,) = accuracy_lines(p.stdout)
    assert line in accuracy_lines(ref_p.stdout)  # the best epoch's validation, reproduced
    assert "done:" in p.stdout and "train" not in p.stderr


@pytest.mark.slow
def test_folder_loader_runs(data):
    log = data / "folder.log"
    p = run("--loader", "folder", "--folder-data", data / "tree", *SMALL, "--epochs", 1,
            "--max-iters", 2, "--checkpoint-dir", data / "folder", "--log-batches", log, cwd=data)
    assert [line.split()[:2] for line in batches(log)] == [["0", "0"], ["0", "1"]]
    assert "(12 images)" in p.stdout and "done: epochs=1" in p.stdout
    assert (data / "folder" / "checkpoint.pth.tar").exists()


def test_folder_loader_names_a_file_it_cannot_decode(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("imagenet_main", MAIN)
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "broken.JPEG").write_bytes(b"")
    ds = main.ImageFolder(str(tmp_path), lambda img: img)
    with pytest.raises(ValueError, match=r"broken\.JPEG: .*remove or replace it"):
        ds[0]


@pytest.mark.slow
def test_gpu_normalize_path_gives_the_same_batches(data, reference):
    log = data / "gpu.log"
    run(data / "lmdb", *SMALL, "--gpu-normalize", "--epochs", 1, "--max-iters", 2,
        "--checkpoint-dir", data / "gpu", "--log-batches", log, cwd=data)
    got_all, want_all = batches(log), reference[2][:2]
    assert len(got_all) == len(want_all)
    for got, want in zip(got_all, want_all):
        g, w = got.split(), want.split()
        assert g[:2] == w[:2] and g[3:] == w[3:]  # same batch and labels
        assert float(g[2]) == pytest.approx(float(w[2]), rel=1e-5, abs=1e-2)  # ~same pixels


def _start(args, cwd, err, out=subprocess.DEVNULL):
    return subprocess.Popen([sys.executable, str(MAIN)] + [str(a) for a in args], cwd=cwd,
                            env=_env(), stdout=out, stderr=err)


def _wait_for_lines(proc, log, n):
    deadline = time.monotonic() + TIMEOUT
    while len(batches(log)) < n:
        assert proc.poll() is None, "finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
def test_sigint_and_kill_9_then_resume(data):
    args = [data / "lmdb", *SMALL, "--epochs", 1, "--max-iters", 6, "--save-every", 2]
    ref = data / "long.log"
    run(*args, "--checkpoint-dir", data / "long", "--log-batches", ref, cwd=data)
    ref = batches(ref)

    # Ctrl-C: stops after the batch in progress, saves the exact position, exits 130
    ck, log = data / "int", data / "int.log"
    with open(data / "int.err", "w") as err:
        proc = _start([*args, "--checkpoint-dir", ck, "--log-batches", log], data, err)
        _wait_for_lines(proc, log, 1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 130
    done = load(ck / "checkpoint.pth.tar")["iteration"]
    assert len(batches(log)) == done and 1 <= done < 6
    run(*args, "--checkpoint-dir", ck, "--log-batches", log, "--resume", ck / "checkpoint.pth.tar",
        cwd=data)
    assert batches(log) == ref

    # kill -9: the last periodic checkpoint (every 2 iterations) is the resume point
    ck, log = data / "kill", data / "kill.log"
    proc = _start([*args, "--checkpoint-dir", ck, "--log-batches", log], data, subprocess.DEVNULL)
    _wait_for_lines(proc, log, 3)
    proc.kill()
    proc.wait(TIMEOUT)
    state = load(ck / "checkpoint.pth.tar")
    done = state["iteration"]
    assert state["epoch"] == 0 and done in (2, 4) and state["loader"]["position"] == done
    lines = batches(log)[:done]  # those trained after the checkpoint are lost
    log.write_text("".join(line + "\n" for line in lines))
    run(*args, "--checkpoint-dir", ck, "--log-batches", log, "--resume", ck / "checkpoint.pth.tar",
        cwd=data)
    assert batches(log) == ref


@pytest.mark.slow
def test_ddp_two_processes_stop_and_resume(data):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                "2", str(MAIN)]
    args = [data / "lmdb", *SMALL, "--workers", 1, "--epochs", 2, "--max-iters", 2]
    run(*args, "--checkpoint-dir", data / "ddp", "--log-batches", data / "ddp.log", cwd=data,
        launcher=torchrun)
    ref = batches(data / "ddp.log")
    assert len(ref) == 4  # rank 0's batches
    ck, log = data / "ddp-stop", data / "ddp-stop.log"
    p = run(*args, "--checkpoint-dir", ck, "--log-batches", log, "--stop-after-iters", 1,
            cwd=data, launcher=torchrun, expect=1)  # torchrun reports a failed worker as 1
    assert "interrupted at epoch 0, iteration 1" in p.stderr and "torchrun" in p.stderr
    state = load(ck / "checkpoint.pth.tar")
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (0, 1)  # (rank 0's: alike)
    q = run(*args, "--checkpoint-dir", ck, "--log-batches", log, "--resume",
            ck / "checkpoint.pth.tar", cwd=data, launcher=torchrun)
    assert batches(log) == ref and "done: epochs=2" in q.stdout


@pytest.mark.slow
def test_ddp_validation_with_uneven_batches_across_ranks(tmp_path):
    """A 1-record val split: rank 0 has no validation batch, rank 1 one.  Validation used
    the DDP wrapper, whose forward is a collective (a buffer broadcast): the rank without
    a batch went on to all_reduce and both waited forever.  Same for --evaluate."""
    from seqloader import WriteOptions, preprocess
    from seqloader.tools.synth import make_synthetic_imagenet

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_synthetic_imagenet(tmp_path / "tree", classes=1, per_class=8, val_per_class=1,
                                seed=0, size="small", progress=False)
        preprocess(tmp_path / "tree", tmp_path / "lmdb", options=WriteOptions(progress=False))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                "2", str(MAIN)]
    args = [tmp_path / "lmdb", *SMALL, "-b", 4, "--workers", 1, "--epochs", 1,
            "--checkpoint-dir", tmp_path / "ck"]
    p = run(*args, cwd=tmp_path, launcher=torchrun)
    assert accuracy_lines(p.stdout)[0].endswith("(1 images)") and "done: epochs=1" in p.stdout
    q = run(*args, "--evaluate", "--resume", tmp_path / "ck" / "checkpoint.pth.tar",
            cwd=tmp_path, launcher=torchrun)
    assert accuracy_lines(q.stdout)[0].endswith("(1 images)")


@pytest.fixture(scope="module")
def long_val(tmp_path_factory):
    """Few training images, many validation ones: validation takes seconds."""
    from seqloader import WriteOptions, preprocess
    from seqloader.tools.synth import make_synthetic_imagenet

    root = tmp_path_factory.mktemp("longval")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_synthetic_imagenet(root / "tree", classes=2, per_class=8, val_per_class=400,
                                seed=0, size="small", progress=False)
        preprocess(root / "tree", root / "lmdb", options=WriteOptions(progress=False))
    return root


def _wait_for_text(proc, path, text):
    deadline = time.monotonic() + TIMEOUT
    while text not in Path(path).read_text(errors="replace"):
        assert proc.poll() is None, "finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.slow
def test_ctrl_c_during_validation_stops_it_and_keeps_the_trained_epoch(long_val):
    """Ctrl-C while validating: validation stops (it used to run to its end -- under
    torchrun, past the 30 s before workers are killed), the epoch's training is kept
    (checkpoint at the next epoch), its accuracy does not count; --evaluate stops too."""
    args = [long_val / "lmdb", *SMALL, "--epochs", 2, "--workers", 1]  # 2 train, 100 val batches
    ck, log, err, out = (long_val / "ck", long_val / "train.log", long_val / "err.txt",
                         long_val / "out.txt")
    with open(err, "w") as f, open(out, "w") as o:
        proc = _start([*args, "--checkpoint-dir", ck, "--log-batches", log], long_val, f, o)
        _wait_for_lines(proc, log, 2)  # epoch 0's training is done: validation runs
        _wait_for_text(proc, err, "val")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 130
    counted = [line for line in out.read_text().splitlines() if line.startswith(" * acc@1")]
    assert len(counted) == 1 and int(counted[0].split("(")[1].split()[0]) < 800  # cut short
    text = err.read_text()
    assert "validation of epoch 0 stopped early" in text and "interrupted at epoch 1, iteration 0" in text
    state = load(ck / "checkpoint.pth.tar")
    assert (state["epoch"], state["iteration"], state["best_acc1"]) == (1, 0, 0.0)
    assert not (ck / "model_best.pth.tar").exists()
    with open(err, "w") as f:
        proc = _start([long_val / "lmdb", *SMALL, "--workers", 1, "--evaluate", "--resume",
                       ck / "checkpoint.pth.tar"], long_val, f)
        _wait_for_text(proc, err, "val")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 143


@pytest.mark.slow
def test_resume_errors_are_one_line(data, tmp_path):
    p = run(data / "lmdb", *SMALL, "--resume", tmp_path / "nope.pth.tar", cwd=data, expect=1)
    assert "no such checkpoint file" in p.stderr and "Traceback" not in p.stderr
    p = run(tmp_path / "no-data", *SMALL, cwd=data, expect=1)
    assert "does not exist" in p.stderr and "Traceback" not in p.stderr
    junk = tmp_path / "junk.pth.tar"
    junk.write_text("not a checkpoint")
    p = run(data / "lmdb", *SMALL, "--resume", junk, cwd=data, expect=1)
    assert "cannot load it as a checkpoint" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("arg, needle", [
    pytest.param("-b 0", "--batch-size must be >= 1", marks=pytest.mark.slow),
    pytest.param("-j -1", "--workers must be >= 0", marks=pytest.mark.slow),
    pytest.param("-p 0", "--print-freq must be >= 1", marks=pytest.mark.slow),
    pytest.param("--image-size 0", "--image-size must be >= 1", marks=pytest.mark.slow)])
def test_bad_numbers_are_usage_errors(data, arg, needle):
    """They were tracebacks (-p 0: a ZeroDivisionError once training had started)."""
    p = run(data / "lmdb", *SMALL, *arg.split(), cwd=data, expect=2)
    assert needle in p.stderr and "Traceback" not in p.stderr


class Numbered:
    """Records whose label is their number: what each rank trained on is in its log."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return rng.integers(0, 256, (24, 24, 3), np.uint8), i


def _labels_by_epoch(*logs):
    out = {}
    for log in logs:
        for line in batches(log):
            e, _, _, *labels = line.split()
            out.setdefault(int(e), []).extend(int(x) for x in labels)
    return out


@pytest.mark.slow
def test_sigterm_under_torchrun_then_resume_on_one_process(tmp_path):
    """The scheduler's SIGTERM reaches torchrun mid-epoch: both ranks stop after the same
    batch, save one checkpoint (atomically) and exit; the run resumes on ONE process and
    trains each record of that epoch exactly once over the two runs."""
    from seqloader import write_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_dataset(Numbered(96), tmp_path / "db", workers=1, progress=False)
        write_dataset(Numbered(4), tmp_path / "db", split="val", workers=1, progress=False)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                "2", str(MAIN)]
    args = [tmp_path / "db", "--image-size", 16, "-b", 4, "--workers", 1, "--lr", 0.01,
            "--epochs", 2, "--cache", 16, "--checkpoint-dir", tmp_path / "ck"]
    log, err = tmp_path / "a.log", tmp_path / "a.err"
    with open(err, "w") as f:
        proc = subprocess.Popen(torchrun + [str(a) for a in args] + ["--log-batches", str(log)],
                                cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=f)
        _wait_for_lines(proc, log, 3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(TIMEOUT)
    text = err.read_text()
    assert "SIGTERM: stopping after this batch and saving a checkpoint" in text, text[-3000:]
    # (torchrun itself prints a traceback of its SignalException; the ranks print none)
    assert "resume with:" in text and 'main.py", line' not in text, text[-3000:]
    state = load(tmp_path / "ck" / "checkpoint.pth.tar")
    epoch = state["epoch"]
    assert state["loader"]["world_size"] == 2 and not list((tmp_path / "ck").glob(".*tmp"))
    before = _labels_by_epoch(log, f"{log}.rank1")
    run(*args, "--log-batches", tmp_path / "b.log", "--resume", "auto", cwd=tmp_path)
    after = _labels_by_epoch(tmp_path / "b.log")
    got = before.get(epoch, []) + after.get(epoch, [])
    assert sorted(got) == list(range(96))  # each record once (1 process: nothing dropped)
    for e in range(epoch + 1, 2):
        assert sorted(after[e]) == list(range(96))


@pytest.mark.slow
def test_progress_bar_after_a_resume_on_another_batch_size_ends_full(data, tmp_path):
    """After a resume on other settings the epoch's rest has its own number of batches:
    the bar's total is that, so it ends at N/N (it ended at 3/6), and every record of the
    rest is trained."""
    import re

    ck = tmp_path / "ck"
    run(data / "lmdb", *SMALL, "--epochs", "1", "--checkpoint-dir", ck, "--stop-after-iters", 2,
        cwd=data, expect=130)
    small = [a if a != "8" else "12" for a in SMALL]  # batch 8 -> 12: 32 records left, 3 batches
    q = run(data / "lmdb", *small, "--epochs", "1", "--checkpoint-dir", ck,
            "--log-batches", tmp_path / "rest.log", "--resume", ck / "checkpoint.pth.tar", cwd=data)
    bars = re.findall(r"train 0:[^\r\n]*?(\d+)/(\d+)", q.stderr)
    assert bars and bars[-1] == ("3", "3"), bars[-3:]
    assert sum(len(line.split()) - 3 for line in batches(tmp_path / "rest.log")) == 32
