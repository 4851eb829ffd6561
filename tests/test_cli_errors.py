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
