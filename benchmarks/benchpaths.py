"""Where the benchmark scripts read and write, shared by them all.

Data paths are arguments (no machine's folder is a default).  Reports go to ``--out``:
the current directory unless named, so a run never replaces the committed results in
``benchmarks/results/``; to update those, pass ``--out benchmarks/results``.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The committed results (a log: each file names the command and commit that made it).
COMMITTED = REPO / "benchmarks" / "results"


def absolute(path: str) -> str:
    """``path`` made absolute against the current directory (an argparse ``type``): the
    scripts run their children in the repository, so a relative path must not reach them."""
    return str(Path(path).expanduser().resolve())


def add_data_argument(ap: argparse.ArgumentParser, flag: str = "--data") -> None:
    """The required folder the benchmark data is built in and read from."""
    ap.add_argument(flag, required=True, metavar="DIR", type=absolute,
                    help="the benchmark data's folder (hdd_compare.py --phase build fills "
                         "it: imagenet-synth/, lmdb-hdd/, ...)")


def add_out_argument(ap: argparse.ArgumentParser, what: str = "the report (.md, .json)"
                     ) -> None:
    """``--out DIR``: the folder for ``what`` (default: the current directory)."""
    ap.add_argument("--out", metavar="DIR", default=".",
                    help=f"folder for {what} (default: the current directory; "
                         "--out benchmarks/results replaces the committed results)")


def out_dir(args: argparse.Namespace) -> Path:
    """``args.out`` as a path, created if missing."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def default_hddsim() -> str | None:
    """The hard-disk simulator: ``hddsim`` on the PATH, else ``../shared/tools/hddsim``
    beside the repository (where the project keeps it), else None."""
    found = shutil.which("hddsim")
    if found:
        return found
    beside = REPO.parent / "shared" / "tools" / "hddsim"
    return str(beside) if beside.is_file() else None


def add_hddsim_argument(ap: argparse.ArgumentParser) -> None:
    """``--hddsim PATH``: the simulator's wrapper (default: :func:`default_hddsim`)."""
    ap.add_argument("--hddsim", metavar="PATH", default=default_hddsim(),
                    help="the hddsim wrapper (default: hddsim on the PATH, else "
                         "../shared/tools/hddsim beside the repository: %(default)s)")


def need_hddsim(args: argparse.Namespace) -> str:
    """``args.hddsim``, or exit naming the fix when there is none."""
    if not args.hddsim or not Path(args.hddsim).is_file():
        raise SystemExit(f"hddsim not found ({args.hddsim or 'not on the PATH'}): "
                         "pass --hddsim PATH")
    return args.hddsim
