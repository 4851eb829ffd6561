#!/usr/bin/env python
"""Train an ImageNet classifier, reading the data with seqloader.

The PyTorch ImageNet example (pytorch/examples, imagenet/main.py), rewritten, with
``torch.utils.data.DataLoader`` over an image folder swapped for seqloader's ``Loader``
over the LMDB files of ``preprocess_sequential.py``.  CPU or CUDA, one process or
DistributedDataParallel (``torchrun --nproc_per_node N main.py ...``); checkpoints hold
the loader position, so ``--resume`` continues mid-epoch with exactly the batches not
yet seen.  See README.md next to this file.
"""
import argparse
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import seqloader.transforms as T
from seqloader import Loader, format_stats
from seqloader.read.iomode import IO_MODES
from seqloader.errors import FormatError

try:  # optional: without torchvision, the ResNet-18 below is used
    import torchvision.models as tv_models
except Exception:  # not installed, or broken (e.g. built for another torch)
    tv_models = None

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
ARCHS = ["resnet18"] if tv_models is None else sorted(
    n for n, f in vars(tv_models).items() if n.islower() and not n.startswith("_") and callable(f))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="ImageNet training with seqloader")
    p.add_argument("data", nargs="?", help="folder holding ILSVRC-train.lmdb and ILSVRC-val.lmdb")
    p.add_argument("-a", "--arch", default="resnet18", choices=ARCHS)
    p.add_argument("--epochs", default=90, type=int)
    p.add_argument("-b", "--batch-size", default=256, type=int, help="per process")
    p.add_argument("--lr", "--learning-rate", default=0.1, type=float)
    p.add_argument("--momentum", default=0.9, type=float)
    p.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    p.add_argument("-j", "--workers", default=4, type=int, help="loader worker processes")
    p.add_argument("-p", "--print-freq", default=10, type=int, help="progress-bar update period")
    p.add_argument("--resume", default="", metavar="PATH",
                   help="checkpoint to continue from (on any number of processes); 'auto': "
                        "CHECKPOINT_DIR/checkpoint.pth.tar if it exists (requeued or restarted jobs)")
    p.add_argument("-e", "--evaluate", action="store_true", help="only validate the model")
    p.add_argument("--seed", default=0, type=int, help="model initialisation and data order")
    p.add_argument("--loader", default="seqloader", choices=["seqloader", "folder"])
    p.add_argument("--folder-data", metavar="DIR", help="image-folder tree (train/, val/) for --loader folder")
    p.add_argument("--image-size", default=224, type=int)
    p.add_argument("--max-iters", default=0, type=int,
                   help="end each epoch's training, and each validation, after N iterations "
                        "(smoke tests)")
    p.add_argument("--cache", default=5000, type=int, help="seqloader shuffle buffer (records)")
    p.add_argument("--io", default="auto", choices=IO_MODES,
                   help="seqloader reads: page cache or O_DIRECT (auto: direct for data larger "
                        "than half the RAM)")
    p.add_argument("--gpu-normalize", action="store_true", help="ship uint8, normalise on the device")
    p.add_argument("--checkpoint-dir", default=".")
    p.add_argument("--save-every", default=0, type=int, help="also checkpoint every N iterations")
    p.add_argument("--dist-url", default="env://")
    p.add_argument("--world-size", default=-1, type=int, help="default: $WORLD_SIZE or 1")
    p.add_argument("--rank", default=-1, type=int, help="default: $RANK or 0")
    p.add_argument("--dist-backend", default=None, help="default: nccl with CUDA, else gloo")
    p.add_argument("--log-batches", metavar="FILE", help=argparse.SUPPRESS)  # for the tests
    p.add_argument("--stop-after-iters", default=0, type=int, help=argparse.SUPPRESS)  # ditto
    args = p.parse_args(argv)
    if args.loader == "seqloader" and not args.data:
        p.error("give the LMDB folder (data), or --loader folder --folder-data DIR")
    if args.loader == "folder" and not args.folder_data:
        p.error("--loader folder needs --folder-data DIR")
    for name, least in (("batch_size", 1), ("workers", 0), ("print_freq", 1), ("image_size", 1),
                        ("epochs", 0), ("max_iters", 0), ("cache", 1), ("save_every", 0)):
        if getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    return args


# ----------------------------------------------------------------------------- model
class BasicBlock(nn.Module):
    """Two 3x3 convolutions plus a shortcut (a 1x1 projection where the shape changes)."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class ResNet18(nn.Module):
    """BasicBlock, [2, 2, 2, 2], with torchvision's parameter names (checkpoints are
    interchangeable); adaptive average pooling takes any image size."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = 64
        for i, width in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, width, stride),
                                                         BasicBlock(width, width)))
            cin = width
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model(arch, num_classes):
    if tv_models is not None:
        return tv_models.__dict__[arch](num_classes=num_classes)
    return ResNet18(num_classes)


# ----------------------------------------------------------------------------- folder data
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolder(torch.utils.data.Dataset):
    """torchvision's ImageFolder without PIL: the sorted class folders are the labels;
    images are decoded to RGB by OpenCV and transformed by seqloader transforms."""

    def __init__(self, root, transform):
        self.transform = transform
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = []
        for label, name in enumerate(self.classes):
            for folder, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
                self.samples += [(os.path.join(folder, f), label) for f in sorted(files)
                                 if f.lower().endswith(IMG_EXTENSIONS)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        try:
            image = T.decode_rgb(np.fromfile(path, np.uint8))  # cv2.imdecode, then BGR -> RGB
        except ValueError as e:  # (torchvision's ImageFolder stops on such a file too)
            raise ValueError(f"{path}: {e}; remove or replace it (seqloader's preprocessing "
                             "skips such files and lists them)") from None
        return torch.from_numpy(self.transform(image)), label


def seed_worker(worker_id):
    T.seed_default(torch.initial_seed() % 2**63)  # forked workers would share one RNG state


# ----------------------------------------------------------------------------- helpers
class Stopper:
    """The first Ctrl-C, SIGTERM or SIGUSR1 (a scheduler's notice: SLURM's --signal,
    Kubernetes, spot instances) asks to stop after the current batch: every rank stops at
    the same batch, a checkpoint is saved and the run exits with 128 + the signal number.
    Another one, a second or more later, aborts.  (Under torchrun, Ctrl-C reaches each
    rank twice: from the terminal and forwarded by torchrun.)"""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, run):
        self.run, self.signum, self.since, self.pid = run, 0, 0.0, os.getpid()
        for s in self.SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame):
        if os.getpid() != self.pid:  # a forked DataLoader/seqloader worker: the parent decides
            return
        if self.signum:
            if time.monotonic() - self.since > 1:
                raise KeyboardInterrupt
            return
        self.signum, self.since = signum, time.monotonic()
        print(f"\n{signal.Signals(signum).name}: stopping after this batch and saving a "
              "checkpoint (again to abort without one)", file=sys.stderr, flush=True)

    def requested(self):
        """Whether any rank was asked to stop (so that all ranks stop at the same batch)."""
        if self.run.distributed:
            flag = torch.tensor([self.signum], device=self.run.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            got = int(flag.item())
            if got and not self.signum:  # asked on another rank: a signal here now (torchrun
                self.since = time.monotonic()  # stopping us) is not a second Ctrl-C yet
            self.signum = got
        return bool(self.signum)


def topk_correct(output, target, ks):
    """How many targets are among the top-k predictions, for each k."""
    hit = output.topk(max(ks), 1).indices.eq(target.view(-1, 1))
    return [hit[:, :k].any(1).sum().item() for k in ks]


def atomic_save(obj, path):
    """``torch.save`` to ``path`` so that a kill at any moment leaves the old file or the
    new one, whole: write a temporary file, fsync it, rename it over ``path``, fsync the
    folder (the rename itself survives a power cut)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resume_command(path):
    """This run's command line, continuing from ``path``."""
    drop = ("--resume", "--stop-after-iters")
    argv = [a for a, before in zip(sys.argv, [""] + sys.argv) if not a.startswith(drop)
            and before not in drop]
    launcher = shlex.quote(sys.executable)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun
        launcher = f"torchrun --nproc_per_node {os.environ.get('LOCAL_WORLD_SIZE', '?')}"
    return f"{launcher} {shlex.join(argv)} --resume {shlex.quote(str(path))}"


# ----------------------------------------------------------------------------- training
class Run:
    """Process group, device, data, model and optimiser of one training run."""

    def __init__(self, args):
        self.args, env = args, os.environ
        world = args.world_size if args.world_size != -1 else int(env.get("WORLD_SIZE", 1))
        rank = args.rank if args.rank != -1 else int(env.get("RANK", 0))
        self.distributed = world > 1
        if torch.cuda.is_available():
            self.device = torch.device("cuda", int(env.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        cuda = self.device.type == "cuda"
        if self.distributed:
            dist.init_process_group(args.dist_backend or ("nccl" if cuda else "gloo"),
                                    init_method=args.dist_url, world_size=world, rank=rank)
        self.rank, self.world = (dist.get_rank(), world) if self.distributed else (0, 1)
        self.main = self.rank == 0
        torch.manual_seed(args.seed)
        torch.backends.cudnn.benchmark = True

        size, normalize = args.image_size, T.Normalize(mean=MEAN, std=STD)
        imagenet_transforms = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(),
                                         T.ToTensor(), normalize])
        val_transforms = T.Compose([T.Resize(int(256 * size / 224)), T.CenterCrop(size),
                                    T.ToTensor(), normalize])
        self.seq = args.loader == "seqloader"
        if self.seq:  # the Loader takes rank and world size from torch.distributed
            # --gpu-normalize: uint8 batches go to the device and are normalised there
            fast = dict(output="uint8", device=self.device) if args.gpu_normalize else {}
            # train_dataset = datasets.ImageFolder(traindir, imagenet_transforms)
            # train_loader = torch.utils.data.DataLoader(
            #     train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
            #     num_workers=args.workers, pin_memory=True, sampler=train_sampler)
            train_loader = Loader(args.data, 'train', imagenet_transforms, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                  cache=args.cache, seed=args.seed, pin_memory=cuda, io=args.io, **fast)
            val_loader = Loader(args.data, 'val', val_transforms, batch_size=args.batch_size,
                                shuffle=False, num_workers=args.workers, pin_memory=cuda,
                                io=args.io, **fast)
            num_classes, self.sampler = len(train_loader.db.classes), None
        else:
            train_set = ImageFolder(os.path.join(args.folder_data, "train"), imagenet_transforms)
            val_set = ImageFolder(os.path.join(args.folder_data, "val"), val_transforms)
            val_set = torch.utils.data.Subset(val_set, range(self.rank, len(val_set), self.world))
            self.sampler = (torch.utils.data.distributed.DistributedSampler(train_set, seed=args.seed)
                            if self.distributed else None)
            kw = dict(batch_size=args.batch_size, num_workers=args.workers, pin_memory=cuda,
                      worker_init_fn=seed_worker, persistent_workers=args.workers > 0)
            train_loader = torch.utils.data.DataLoader(
                train_set, shuffle=self.sampler is None, sampler=self.sampler, **kw)
            val_loader = torch.utils.data.DataLoader(val_set, shuffle=False, **kw)
            num_classes = len(train_set.classes)
        self.train_loader, self.val_loader = train_loader, val_loader

        self.bare_model = build_model(args.arch, num_classes).to(self.device)
        if args.gpu_normalize:  # the memory format the batches arrive in
            self.bare_model = self.bare_model.to(memory_format=torch.channels_last)
        self.model = self.bare_model
        if self.distributed:
            self.model = DistributedDataParallel(self.model, device_ids=[self.device] if cuda else None)
        self.criterion = nn.CrossEntropyLoss().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), args.lr, momentum=args.momentum,
                                         weight_decay=args.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=30, gamma=0.1)
        self.best_acc1, self.start_epoch, self.iters_run = 0.0, 0, 0
        self.stopper = Stopper(self)

    def resume(self, path):
        if not os.path.isfile(path):
            sys.exit(f"--resume {path}: no such checkpoint file")
        try:
            ckpt = torch.load(path, map_location="cpu")
            keys = ("state_dict", "optimizer", "scheduler", "epoch", "best_acc1")
            if not isinstance(ckpt, dict) or any(k not in ckpt for k in keys):
                raise ValueError(f"not a checkpoint of this script (it needs {', '.join(keys)})")
        except Exception as e:  # noqa: BLE001 -- any unreadable file: one line, not a traceback
            sys.exit(f"--resume {path}: cannot load it as a checkpoint ({type(e).__name__}: "
                     f"{str(e)[:200]}); pass a checkpoint.pth.tar this script wrote")
        self.bare_model.load_state_dict(ckpt["state_dict"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.start_epoch, self.best_acc1 = ckpt["epoch"], ckpt["best_acc1"]
        state = ckpt.get("loader")
        if isinstance(state, list):  # (older checkpoints: every rank's, all alike)
            state = state[0]
        if self.seq and state and not self.args.evaluate:
            try:  # the records no rank had trained on, on this run's processes and -b
                self.train_loader.load_state_dict(state)
            except ValueError as e:
                sys.exit(f"cannot resume from {path}: {e}\n(use the data and --seed of the "
                         "run that wrote it)")
        elif ckpt["iteration"] and not self.args.evaluate:
            print(f"warning: this loader cannot resume mid-epoch; epoch {self.start_epoch} "
                  "restarts", file=sys.stderr)
        if self.main:
            print(f"resumed from {path}: epoch {self.start_epoch}, iteration "
                  f"{ckpt['iteration']}, best acc@1 {self.best_acc1:.3f}", flush=True)

    def checkpoint(self, epoch, iteration, is_best=False):
        """Save on rank 0 (call on all ranks).  The loader's state is rank 0's: it is the
        same on every rank and resumes on any number of them."""
        state = self.train_loader.state_dict() if self.seq else None
        folder = Path(self.args.checkpoint_dir)
        path = folder / "checkpoint.pth.tar"
        if self.main:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_save({"epoch": epoch, "iteration": iteration, "arch": self.args.arch,
                         "state_dict": self.bare_model.state_dict(), "best_acc1": self.best_acc1,
                         "optimizer": self.optimizer.state_dict(),
                         "scheduler": self.scheduler.state_dict(), "loader": state,
                         "args": vars(self.args)}, path)
            if is_best:
                atomic_save(torch.load(path, map_location="cpu"), folder / "model_best.pth.tar")
        if self.distributed:  # no rank leaves (e.g. to stop) before the file is in place
            dist.barrier()
        return path

    def interrupted(self, epoch, iteration, path):
        if self.main:
            print(f"\ninterrupted at epoch {epoch}, iteration {iteration}; checkpoint saved to "
                  f"{path}\nresume with: {resume_command(path)}\n(on any number of processes: "
                  "the rest of the epoch is split across them)", file=sys.stderr, flush=True)
        self.close()
        sys.exit(128 + self.stopper.signum)

    def close(self):
        for loader in (self.train_loader, self.val_loader):
            if isinstance(loader, Loader):
                loader.close()
        if self.distributed:
            dist.destroy_process_group()

    def fit(self):
        args = self.args
        for epoch in range(self.start_epoch, args.epochs):
            if self.sampler is not None:
                self.sampler.set_epoch(epoch)
            if self.seq:
                self.train_loader.set_epoch(epoch)  # keeps a resumed position in this epoch
            stopped_at = self.train(epoch)
            if stopped_at is not None:
                self.interrupted(epoch, stopped_at, self.checkpoint(epoch, stopped_at))
            acc1 = self.validate()
            stop = self.stopper.requested()  # (on every rank, once: validation may be cut short)
            self.scheduler.step()
            is_best = False
            if stop:  # the epoch's training is done; its validation does not count
                if self.main:
                    print(f"validation of epoch {epoch} stopped early: not counted for the best "
                          "acc@1", file=sys.stderr, flush=True)
            else:
                is_best, self.best_acc1 = acc1 > self.best_acc1, max(acc1, self.best_acc1)
            if self.seq:
                self.train_loader.set_epoch(epoch + 1)  # the checkpoint starts the next epoch
            path = self.checkpoint(epoch + 1, 0, is_best)
            if epoch + 1 < args.epochs and stop:
                self.interrupted(epoch + 1, 0, path)

    def train(self, epoch):
        """One epoch, or its rest after a resume.  Returns the number of iterations
        done if stopped on request (Ctrl-C) before the end, else None."""
        args, loader, device = self.args, self.train_loader, self.device
        self.model.train()
        first = loader.state_dict()["position"] if self.seq else 0
        batches = iter(loader)
        # the plan's batches: the epoch's, or after a resume on other settings its rest's
        planned = first + len(batches) if self.seq else len(loader)
        total = min(planned, args.max_iters) if args.max_iters else planned
        log = None
        if args.log_batches:  # rank 0 to the file, rank r to FILE.rank<r>
            log = open(args.log_batches + ("" if self.main else f".rank{self.rank}"), "a")
        bar = tqdm(total=total, initial=first, desc=f"train {epoch}", disable=not self.main)
        seen = correct = 0
        loss_sum, start = 0.0, time.perf_counter()
        try:
            for i, (images, target) in enumerate(batches, first) if first < total else ():
                images = images.to(device, non_blocking=True)
                target = target.to(device, non_blocking=True)
                output = self.model(images)
                loss = self.criterion(output, target)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()

                if log is not None:  # which batch this was: pixel checksum and labels
                    log.write(f"{epoch} {i} {images.double().sum().item():.6f} "
                              f"{' '.join(map(str, target.tolist()))}\n")
                    log.flush()
                seen += target.numel()
                loss_sum += loss.item() * target.numel()
                correct += topk_correct(output, target, [1])[0]
                bar.update(1)
                if (i + 1 - first) % args.print_freq == 0 or i + 1 == total:
                    # the data-wait share: how much of the time the loop waited for batches
                    wait = loader.stats().get("wait_share") if self.seq else None
                    bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc1=f"{100 * correct / seen:.2f}",
                                    img_s=f"{seen * self.world / (time.perf_counter() - start):.1f}",
                                    **({} if wait is None else {"data_wait": f"{100 * wait:.0f}%"}))
                self.iters_run += 1
                if args.stop_after_iters and self.iters_run >= args.stop_after_iters:
                    self.stopper.signum = self.stopper.signum or signal.SIGINT  # as if Ctrl-C
                if i + 1 >= total:  # the end of an epoch is checkpointed by fit()
                    break
                if self.stopper.requested():
                    return i + 1
                if args.save_every and (i + 1) % args.save_every == 0:
                    self.checkpoint(epoch, i + 1)
        finally:
            bar.close()
            if log is not None:
                log.close()
            if self.seq and self.main:  # the loader's figures of the epoch, on one line
                print(f"train {epoch} data: {format_stats(loader.stats())}", file=sys.stderr,
                      flush=True)
        return None

    def validate(self):
        """Top-1/top-5 over the validation split (each rank reads its part)."""
        args, device = self.args, self.device
        # the bare model, not the DDP wrapper: DDP's forward is a collective (it broadcasts
        # buffers), and ranks have different numbers of validation batches (one fewer on
        # some, none on a rank of a tiny split) or stop early on a signal -- a rank that
        # ran no forward left the others waiting in it forever.  Instead every rank takes
        # rank 0's buffers (BatchNorm statistics) once, as that broadcast would.
        model = self.bare_model
        model.eval()
        if self.distributed:
            for buf in model.buffers():
                dist.broadcast(buf, 0)
        total = min(len(self.val_loader), args.max_iters) if args.max_iters else len(self.val_loader)
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1, top-5, count
        with torch.no_grad(), tqdm(total=total, desc="val", disable=not self.main) as bar:
            for i, (images, target) in enumerate(self.val_loader):
                # a stop request ends validation here (this rank's own flag: ranks may have
                # different numbers of batches, so no collective per batch)
                if i >= total or self.stopper.signum:
                    break
                images = images.to(device, non_blocking=True)
                target = target.to(device, non_blocking=True)
                output = model(images)
                c1, c5 = topk_correct(output, target, [1, min(5, output.shape[1])])
                n = target.numel()
                sums += torch.tensor([self.criterion(output, target).item() * n, c1, c5, n],
                                     dtype=torch.float64, device=device)
                bar.update(1)
                bar.set_postfix(loss=f"{sums[0] / sums[3]:.4f}", acc1=f"{100 * sums[1] / sums[3]:.2f}")
        if self.distributed:
            dist.all_reduce(sums)
        loss, acc1, acc5 = (sums[:3] / sums[3].clamp(min=1)).tolist()
        if self.main:
            print(f" * acc@1 {100 * acc1:.3f} acc@5 {100 * acc5:.3f} loss {loss:.4f} "
                  f"({int(sums[3])} images)", flush=True)
        return 100 * acc1


def main():
    args = parse_args()
    try:
        run = Run(args)
    except (FileNotFoundError, FormatError) as e:  # a missing data folder or split, ...
        sys.exit(f"{Path(sys.argv[0]).name}: error: {e}")
    if args.resume == "auto":  # a requeued or restarted job: the last checkpoint, if any
        auto = Path(args.checkpoint_dir) / "checkpoint.pth.tar"
        args.resume = str(auto) if auto.is_file() else ""
    if args.resume:
        run.resume(args.resume)
    if args.evaluate:
        acc1 = run.validate()
        if run.stopper.signum:
            run.close()
            sys.exit(128 + run.stopper.signum)
    else:
        run.fit()
        acc1 = run.best_acc1
    run.close()
    if run.main:
        print(f"done: epochs={run.start_epoch if args.evaluate else args.epochs}, "
              f"best acc@1={acc1:.3f}", flush=True)


if __name__ == "__main__":
    main()
