"""Opening a URL fails with the cause, never "not found" for a request that failed: a
refused connection (HTTP and S3, file and folder URLs, ``info`` and the Loader), missing
S3 credentials (at once, saying where they go), and the command line's time budget
(``--remote-timeout`` / ``--remote-deadline``).  Real sockets on 127.0.0.1 only."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
sys.path.insert(0, str(HERE))
import remote_servers as rs  # noqa: E402


def _fast(storage_options=None, deadline=0.5):
    """A small budget (s3fs takes ~1 s to fail a call: the s3 tests give it 3 s)."""
    from seqloader.read.remote import RemoteOptions

    return RemoteOptions(storage_options=storage_options or {}, timeout=3.0,
                         connect_timeout=1.0, deadline=deadline)


def _cli(*argv: str, env: dict | None = None, timeout: float = 60):
    env = {**(env if env is not None else os.environ),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "seqloader.cli", *argv], env=env,
                         capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - t0


def _dead_http() -> str:
    return f"http://127.0.0.1:{rs.free_port()}/imagenet"  # (nothing listens there)


@pytest.mark.needs("fsspec", "aiohttp")
@pytest.mark.parametrize("tail,split", [("/ILSVRC-train.lmdb", None),
                                        ("/ILSVRC-train-00000-of-00002.lmdb", None),
                                        ("", "train"), ("", None)])
def test_refused_http_is_unreachable_not_missing(tail, split):
    """File, shard and folder URLs on a port nobody listens on: RemoteUnreachableError
    saying "connection refused", from open_database and the Loader alike."""
    from seqloader import Loader
    from seqloader.errors import RemoteUnreachableError
    from seqloader.read.database import open_database

    url = _dead_http() + tail
    for open_it in (lambda: open_database(url, split, remote=_fast()),
                    lambda: Loader(url, split or "train", batch_size=2, num_workers=0,
                                   remote=_fast())):
        with pytest.raises(RemoteUnreachableError, match="connection refused") as err:
            open_it()
        assert err.value.reason == "refused"
        assert "check the URL" not in str(err.value) and "not exist" not in str(err.value)


@pytest.mark.needs("fsspec", "aiohttp")
def test_cli_info_refused_names_it_within_the_cli_deadline():
    """``info`` on a dead URL with ``--remote-deadline 1``: exit 2 in about a second,
    the message saying "connection refused" and naming both ways to set the budget."""
    for url, extra in ((_dead_http() + "/ILSVRC-val.lmdb", []), (_dead_http(), []),
                       (_dead_http(), ["--split", "val"])):
        out, took = _cli("info", url, "--remote-deadline", "1", "--remote-timeout", "1", *extra)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "connection refused" in out.stderr and "check the URL" not in out.stderr
        assert "--remote-deadline" in out.stderr and "RemoteOptions(" in out.stderr
        assert took < 1.0 + 1.0 + 6.0, took  # deadline + one connect + interpreter start


@pytest.mark.needs("s3fs")
@pytest.mark.parametrize("url,split", [("ILSVRC-train.lmdb", None), ("", "train"), ("", None)])
def test_refused_s3_endpoint_is_unreachable(url, split):
    """An S3 endpoint that refuses: named as refused (s3fs's and botocore's own retries
    do not turn it into a timeout), not as a missing bucket or split."""
    from seqloader.errors import RemoteUnreachableError
    from seqloader.read.database import open_database

    options = _fast({"key": rs.KEY, "secret": rs.SECRET,
                     "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{rs.free_port()}"}},
                    deadline=2.0)
    with pytest.raises(RemoteUnreachableError, match="connection refused") as err:
        open_database(f"s3://bucket/imagenet/{url}", split, remote=options)
    assert rs.SECRET not in str(err.value)


def _no_aws_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")  # (no instance metadata on loopback)
    return env


@pytest.mark.needs("s3fs")
@pytest.mark.parametrize("url", ["s3://bucket/imagenet", "s3://bucket/imagenet/ILSVRC-val.lmdb"])
def test_missing_s3_credentials_fail_at_once_saying_where_they_go(tmp_path, url):
    """No AWS variables, no ~/.aws: an immediate RemoteAccessError (not a minute of
    retries, not "is the server reachable?")."""
    out, took = _cli("info", url, env=_no_aws_env(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no credentials were found" in out.stderr, out.stderr
    assert "AWS_ACCESS_KEY_ID" in out.stderr and "~/.aws/credentials" in out.stderr
    assert "'anon': True" in out.stderr and "reachable" not in out.stderr
    assert took < 15, took


def test_missing_credentials_are_not_retried():
    """botocore's credential errors (matched by name) are permanent access errors."""
    from seqloader.errors import RemoteAccessError
    from seqloader.read.remote import RemoteOptions
    from seqloader.read.remotefaults import classify, retrying

    NoCredentialsError = type("NoCredentialsError", (Exception,), {"__module__": "botocore.exceptions"})
    calls = []

    def call(timeout):
        calls.append(timeout)
        raise NoCredentialsError("Unable to locate credentials")
    assert classify(NoCredentialsError()) == "access"
    with pytest.raises(RemoteAccessError, match="no credentials were found") as err:
        retrying(call, "s3://b/x", "s3://b/x", RemoteOptions())
    assert len(calls) == 1 and err.value.reason == "no credentials"


def test_remote_budget_options_on_every_url_command():
    """``--remote-timeout`` / ``--remote-deadline`` on the commands that open URLs,
    checked (> 0), and what a URL is opened with when code passes no RemoteOptions."""
    from seqloader.cli import build_parser
    from seqloader.read import remote, remotefs

    ap = build_parser()
    for cmd in (["info", "x"], ["verify", "x"], ["bench", "x"], ["preprocess", "a", "b"],
                ["show", "x"]):
        args = ap.parse_args([*cmd, "--remote-timeout", "2.5", "--remote-deadline", "7"])
        assert (args.remote_timeout, args.remote_deadline) == (2.5, 7.0), cmd
    out, _ = _cli("info", "x", "--remote-deadline", "0")
    assert out.returncode == 2 and "must be > 0" in out.stderr
    saved = dict(remotefs._DEFAULT_BUDGET)
    try:
        remote.set_default_budget(timeout=2.0, deadline=7.0)
        o = remote.default_options()
        assert (o.timeout, o.connect_timeout, o.deadline) == (2.0, 2.0, 7.0)
    finally:
        remotefs._DEFAULT_BUDGET.clear()
        remotefs._DEFAULT_BUDGET.update(saved)
