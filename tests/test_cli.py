"""The ``seqloader`` command itself: its version, its help, its options shared by commands."""
from __future__ import annotations

import argparse

import pytest

from seqloader import __version__
from seqloader.cli import build_parser, main


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"seqloader {__version__}"


def test_the_top_level_help_names_every_command():
    """Its description names each command (it named 6 of the 11: not show, subset,
    reshard, merge, export), and each has a one-line help in the command list."""
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(ap.description.split())
    missing = [name for name in sub.choices if name not in text]
    assert not missing, f"the top-level description leaves out {missing}"
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(helps) == set(sub.choices) and all(helps.values())


def _verify_stderr(path, *flags, tty: bool) -> str:
    """What ``seqloader verify PATH`` writes to stderr: a pipe, or a terminal (a pty)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    cmd = [sys.executable, "-m", "seqloader", "verify", str(path), "--workers", "1", *flags]
    if not tty:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stderr
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # (not 0 wide)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=child_fd)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 1 << 16)
        except OSError:  # (EIO: the child closed the terminal)
            break
        if not data:
            break
        chunks.append(data)
    os.close(main_fd)
    assert p.wait(120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_bars_only_on_a_terminal(lmdb_dir):
    """A pipe or a log file gets no bar (it got every redraw); a terminal gets one, unless
    --no-progress."""
    assert _verify_stderr(lmdb_dir, tty=False) == ""
    assert "verify: 100%" in _verify_stderr(lmdb_dir, tty=True)
    assert "verify" not in _verify_stderr(lmdb_dir, "--no-progress", tty=True)


def test_a_missing_source_or_an_image_as_source_is_one_clear_line(synth_tree, tmp_path, capsys):
    """It was "cannot tell the split of imagenett" (or "[Errno 2] ... PosixPath(...)" with
    --split); a single .JPEG was "not a readable tar" (damaged)."""
    missing = tmp_path / "imagenett"
    for extra in ([], ["--split", "train"]):
        assert main(["preprocess", str(missing), str(tmp_path / "o"), *extra]) == 2
        assert capsys.readouterr().err.strip() == \
            f"seqloader preprocess: error: no such file or folder: {missing}"
    image = next((synth_tree.root / "train").rglob("*_0.JPEG"))
    nameless = tmp_path / "picture"
    nameless.write_bytes(image.read_bytes())
    for src in (image, nameless):
        assert main(["preprocess", str(src), str(tmp_path / "o"), "--split", "train"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"seqloader preprocess: error: {src} is an image file; a source "
                              "is a folder tree"), err
        assert len(err.splitlines()) == 1 and "tar" in err and "damaged" not in err
    assert not (tmp_path / "o").exists()


_WITHOUT = """
import sys
blocked = set(sys.argv[1].split(","))

class Block:  # as if these packages were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
from seqloader.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("blocked, argv", [
    ("fsspec,aiohttp,requests,s3fs", ["info", "http://127.0.0.1:9/db/ILSVRC-train.lmdb"]),
    ("aiohttp,requests", ["verify", "https://127.0.0.1:9/db/ILSVRC-train.lmdb"]),
    ("s3fs", ["info", "s3://bucket/db", "--split", "train"]),
    ("fsspec", ["bench", "http://127.0.0.1:9/db/ILSVRC-train.lmdb"]),
    ("s3fs", ["preprocess", "tree", "s3://bucket/db"]),
])
def test_a_url_without_the_remote_extra_is_one_line_naming_the_install(blocked, argv, tmp_path):
    """It was a 24-line traceback ending in fsspec's ImportError about requests/aiohttp."""
    import subprocess
    import sys

    (tmp_path / "tree" / "train" / "n01").mkdir(parents=True)
    p = subprocess.run([sys.executable, "-c", _WITHOUT, blocked, *argv], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    doing = f"writing to {argv[2]}" if argv[0] == "preprocess" else f"reading {argv[1]}"
    assert err[0].startswith(f"seqloader {argv[0]}: error: {doing} ") and \
        "needs seqloader's remote extra (" in err[0] and "pip install 'seqloader[remote]'" in err[0]
    assert "requests" not in err[0], err[0]


def test_the_remote_extra_installs_what_fsspec_needs_for_http_and_s3():
    """fsspec's own 'http' extra and s3fs: what `pip install 'seqloader[remote]'` gets."""
    import importlib.metadata as md
    import re
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    remote = re.search(r'"remote":\s*\[([^\]]*)\]', setup)[1]
    have = {re.split(r"[<>=!\[; ]", r.strip().strip('"'))[0].lower() for r in remote.split(",")}
    try:
        reqs = md.requires("fsspec") or []
    except md.PackageNotFoundError:
        pytest.skip("fsspec is not installed here: its extras cannot be read")
    http = {re.split(r"[<>=!\[; ]", r)[0].lower() for r in reqs if "extra == 'http'" in r}
    assert http and http <= have, f"fsspec[http] needs {http}; the remote extra has {have}"
    assert {"fsspec", "s3fs"} <= have


@pytest.fixture
def moto_db(lmdb_dir, tmp_path):
    """``lmdb_dir`` in a public bucket (public-read) of moto's S3 server on loopback:
    (server, folder URL)."""
    import boto3
    import remote_servers as rs

    server = rs.MotoServer(tmp_path)
    try:
        s3 = boto3.client("s3", aws_access_key_id=rs.KEY, aws_secret_access_key=rs.SECRET,
                          endpoint_url=server.endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="public", ACL="public-read")
        for f in sorted(lmdb_dir.iterdir()):
            if f.is_file():
                s3.upload_file(str(f), "public", f"imagenet/{f.name}",
                               ExtraArgs={"ACL": "public-read"})
        yield server, "s3://public/imagenet"
    finally:
        server.stop()


def _without_aws_settings(tmp_path, **extra) -> dict:
    """The environment with no AWS credentials, endpoint, region or config file: what the
    command line gives is all the command has."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), **extra}


@pytest.mark.slow  # (~15 s: a moto server and five commands in processes)
@pytest.mark.needs("s3fs", "moto")
def test_the_command_line_reaches_an_s3_endpoint_and_a_public_bucket(moto_db, tmp_path):
    """--endpoint-url and --anon (no way to give them before: the hint said
    storage_options, which the command line did not take)."""
    import subprocess
    import sys

    import remote_servers as rs

    server, url = moto_db
    run = lambda argv, env: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "seqloader", *argv], capture_output=True, text=True,
        timeout=120, env=env, cwd=tmp_path)
    anon = _without_aws_settings(tmp_path)
    p = run(["info", url, "--split", "val", "--endpoint-url", server.endpoint, "--anon"], anon)
    assert p.returncode == 0 and "12 records" in p.stdout, p.stderr
    keyed = _without_aws_settings(tmp_path, AWS_ACCESS_KEY_ID=rs.KEY,
                                  AWS_SECRET_ACCESS_KEY=rs.SECRET)
    p = run(["verify", url, "--endpoint-url", server.endpoint, "--no-progress",
             "--workers", "1"], keyed)
    assert p.returncode == 0 and "val: 12 records checked: OK" in p.stdout, p.stderr
    p = run(["subset", url, "sub", "--split", "val", "--per-class", "1", "--anon",
             "--endpoint-url", server.endpoint, "--no-progress"], anon)
    assert p.returncode == 0 and "val: 4 records" in p.stdout, p.stderr
    p = run(["export", url, "tree", "--split", "val", "--no-sign-request",
             "--endpoint-url", server.endpoint, "--no-progress"], anon)
    assert p.returncode == 0 and (tmp_path / "tree" / "val").is_dir(), p.stderr
    # without them: no endpoint (the real AWS, unreachable here) -- never the local server
    before = server.gets("imagenet/")
    p = run(["info", url, "--split", "val", "--remote-deadline", "2", "--remote-timeout", "1"],
            anon)
    assert p.returncode == 2 and server.gets("imagenet/") == before


def test_s3_options_on_other_paths_are_one_line(lmdb_dir, capsys):
    for argv in (["info", str(lmdb_dir), "--anon"],
                 ["info", "https://example.invalid/db/ILSVRC-val.lmdb", "--endpoint-url",
                  "http://127.0.0.1:9"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "for s3:// URLs" in err, err
    with pytest.raises(SystemExit):
        main(["info", "s3://b/x", "--endpoint-url", "127.0.0.1:9"])
    assert "expected an http:// or https:// URL" in capsys.readouterr().err
