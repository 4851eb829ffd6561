"""A test run that leaves files in its temp folder fails, naming them (NOTE [ a test run
leaves nothing ] in tests/conftest.py); one that leaves nothing passes and removes it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_TESTS = '''
import tempfile

def test_writes_under_tmp_path(tmp_path):
    (tmp_path / "fine").write_bytes(b"x" * 1000)

def test_leaks():
    if LEAK:
        d = tempfile.mkdtemp(prefix="leaked-")
        open(d + "/big", "wb").write(b"x" * (3 << 20))
'''


def _run(tmp_path: Path, leak: bool) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "t").mkdir(exist_ok=True)
    (tmp_path / "t" / "test_it.py").write_text(f"LEAK = {leak}\n" + _TESTS)
    parent = tmp_path / f"tmp-{leak}"
    parent.mkdir()
    env = {**os.environ, "TMPDIR": str(parent),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p",
                        "no:cacheprovider", "-o", "tmp_path_retention_policy=failed",
                        "--rootdir", str(tmp_path / "t"), str(tmp_path / "t" / "test_it.py")],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path / "t")
    return p, parent


def test_a_run_that_leaves_files_fails_naming_them_and_they_are_removed(tmp_path):
    p, parent = _run(tmp_path, leak=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "the test run left 1 item(s) in its temp folder: leaked-" in p.stdout
    assert "(3.0 MiB)" in p.stdout and "2 passed" in p.stdout
    assert list(parent.iterdir()) == []  # (removed once named)


def test_a_clean_run_passes_and_leaves_nothing(tmp_path):
    p, parent = _run(tmp_path, leak=False)
    assert p.returncode == 0 and "left" not in p.stdout, p.stdout + p.stderr
    assert list(parent.iterdir()) == []
