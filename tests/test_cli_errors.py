"""The CLI's one error boundary: user-input failures are one line and exit 2; a bug in
seqloader keeps its traceback."""
import pytest

from seqloader import cli
from seqloader.errors import RecordError


def _fail_with(monkeypatch, exc):
    def fail(args):
        raise exc
    monkeypatch.setattr(cli, "run_preprocess", fail)  # (build_parser binds it when called)


def test_a_workers_error_is_one_line(monkeypatch, capsys, tmp_path):
    err = RecordError("record 3 (a/b.JPEG): ValueError: bad\n[in seqloader worker 1]\n\n"
                      "Worker traceback:\nTraceback (most recent call last):\n  ...", 3)
    _fail_with(monkeypatch, err)
    assert cli.main(["preprocess", str(tmp_path), str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["seqloader preprocess: error: record 3 (a/b.JPEG): ValueError: bad"]


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    _fail_with(monkeypatch, KeyError("internal"))
    with pytest.raises(KeyError):
        cli.main(["preprocess", str(tmp_path), str(tmp_path / "out")])


@pytest.mark.parametrize("verify", [[], ["--no-verify"]])
def test_a_clean_run_leaves_nothing_on_stderr(tmp_path, verify):
    """No ``ResourceWarning: unclosed file`` at exit (the decoders' scratch file, kept
    for the process's life, was left to the garbage collector with --no-verify)."""
    import subprocess
    import sys

    from seqloader.tools.synth import make_synthetic_imagenet

    make_synthetic_imagenet(tmp_path / "tree", classes=2, per_class=3, val_per_class=0,
                            size="small", progress=False)
    p = subprocess.run([sys.executable, "-W", "error::ResourceWarning", "-m", "seqloader",
                        "preprocess", str(tmp_path / "tree"), str(tmp_path / "out"),
                        "--no-progress", "--workers", "1", *verify],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""


def test_bench_on_its_own_has_the_same_boundary(monkeypatch, capsys, tmp_path):
    """``python -m seqloader.tools.bench`` fails like ``seqloader bench``: a remote error (an
    OSError, not a FileNotFoundError) is one line without the URL's password, exit 2."""
    from seqloader.errors import RemoteAccessError
    from seqloader.tools.bench import command

    def fail(args):
        raise RemoteAccessError("https://user:secret@example.invalid/db.lmdb: HTTP 403; "
                                "check the credentials\nmore detail")
    monkeypatch.setattr(command, "run_bench", fail)
    assert command.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("seqloader bench: error: ")
    assert "secret" not in err[0] and "HTTP 403" in err[0]


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_missing_database_names_the_installed_command(command, tmp_path, capsys):
    """preprocess_sequential.py is a script of the source tree, not installed by pip: the
    fix a pip user is told is ``seqloader preprocess``."""
    assert cli.main([command, str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err, err
    assert "seqloader preprocess <imagenet dir> " in err, err
