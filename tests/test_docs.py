"""Every fenced code block of README.md and docs/**/*.md runs, so the docs cannot drift.

The rules a page follows are in docs/contributing.md ("Code blocks are tests"); in short:
``bash``/``sh`` and ``python`` blocks run, in file order, in one fresh folder per page
(python blocks share one interpreter per page, like a notebook); ``text``/``console``
blocks are shown output and do not run; an HTML comment just above a block,
``<!-- docs-test: ... -->``, marks it ``slow``, ``needs`` an optional tool, sets ``env``,
starts a local ``s3`` server, runs hidden ``setup`` commands first, or ``skip``s it
with a reason.  One test item per runnable block; when an item runs alone (``-k``,
``-m slow``, ``-m needs``), the page's earlier plain blocks run first as its set-up.
"""
from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import OPTIONAL, available

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = {"bash": "bash", "sh": "bash", "python": "python"}
SHOWN = {"text", "console", "output"}
DEFAULT_TIMEOUT = 120.0
KEYS = {"skip", "slow", "needs", "env", "timeout", "s3", "setup", "file"}

_FENCE = re.compile(r"^(\s*)(`{3,}(?=[^`]*$)|~{3,})\s*([\w+-]*)")  # (no ` after a ``` fence)
_DIRECTIVE = re.compile(r"<!--\s*docs-test(\s+page)?:(.*?)-->", re.S)


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str
    skip: str | None = None
    slow: bool = False
    needs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    s3: str | None = None
    setup: str = ""
    file: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def sets_up(self, later: "Block") -> bool:
        """Whether this block runs first when ``later`` runs without it (``-k``, ``-m``):
        not skipped, its needs met, and not slow unless ``later`` is slow too."""
        return (self.lang in RUN and self.skip is None and (not self.slow or later.slow)
                and all(available(n) for n in self.needs))


def _apply(block: Block, text: str, where: str) -> None:
    """Apply one ``docs-test`` comment's directives (``key args; key args``) to block."""
    first, _, rest = text.partition("\n")
    for part in filter(None, (p.strip() for p in first.split(";"))):
        key, _, args = part.partition(" ")
        args = args.strip()
        if key not in KEYS:
            raise ValueError(f"{where}: unknown docs-test directive {key!r} (known: "
                             f"{', '.join(sorted(KEYS))}; see docs/contributing.md)")
        if key == "skip":
            if not args:
                raise ValueError(f"{where}: 'skip' needs a reason")
            block.skip = args
        elif key == "slow":
            block.slow = True
        elif key == "needs":
            unknown = [n for n in args.split() if n not in OPTIONAL]
            if unknown or not args:
                raise ValueError(f"{where}: needs {unknown or '(nothing)'}: use names of "
                                 "tests/conftest.py's OPTIONAL")
            block.needs += tuple(args.split())
        elif key == "env":
            for tok in shlex.split(args):
                k, eq, v = tok.partition("=")
                if not eq:
                    raise ValueError(f"{where}: env wants NAME=VALUE, got {tok!r}")
                block.env[k] = v
        elif key == "timeout":
            block.timeout = float(args)
        elif key == "s3":
            block.s3 = args or "bucket"
            block.needs += ("moto", "s3fs")
        elif key == "file":
            if not args or "/" in args:
                raise ValueError(f"{where}: 'file' needs a file name (no folders)")
            block.file = args
        elif key == "setup":
            block.setup += rest.strip("\n") + "\n"
            rest = ""
    if rest.strip():
        raise ValueError(f"{where}: only 'setup' takes lines after the first")


def parse(page: Path) -> list[Block]:
    """The page's fenced blocks with their directives; ValueError on a malformed page."""
    lines = page.read_text().splitlines()
    rel = page.relative_to(ROOT)
    blocks: list[Block] = []
    page_directives: list[tuple[str, str]] = []
    pending: list[tuple[str, str]] = []   # directives waiting for the next block
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("<!--") and "docs-test" in line:
            j = i
            while "-->" not in lines[j]:
                j += 1
            m = _DIRECTIVE.search("\n".join(lines[i:j + 1]))
            if m is None:
                raise ValueError(f"{rel}:{i + 1}: write it as <!-- docs-test: ... -->")
            (page_directives if m.group(1) else pending).append((m.group(2).strip(), f"{rel}:{i + 1}"))
            i = j + 1
            continue
        m = _FENCE.match(line)
        if m is None:
            if line.strip() and pending and not line.lstrip().startswith("<!--"):
                raise ValueError(f"{pending[0][1]}: a docs-test comment must stand just "
                                 "above its code block")
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            raise ValueError(f"{rel}:{i + 1}: code block never closed")
        body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                         for ln in lines[i + 1:j]) + "\n"
        if lang not in RUN and lang not in SHOWN:
            raise ValueError(f"{rel}:{i + 1}: code block language {lang or '(none)'!r}: "
                             f"use one that runs ({', '.join(RUN)}) or shown output "
                             f"({', '.join(sorted(SHOWN))}); see docs/contributing.md")
        block = Block(page, i + 1, lang, body)
        for text, where in page_directives + pending:
            _apply(block, text, where)
        if lang in RUN and block.skip is None and re.search(r"\bpip3? install\b", body):
            raise ValueError(f"{rel}:{i + 1}: a block that runs 'pip install' must carry "
                             "<!-- docs-test: skip REASON --> (it would change the "
                             "environment the tests run in)")
        if lang in SHOWN and pending:
            raise ValueError(f"{rel}:{i + 1}: a docs-test comment above a {lang} block, "
                             "which never runs")
        pending = []
        blocks.append(block)
        i = j + 1
    if pending:
        raise ValueError(f"{pending[0][1]}: a docs-test comment with no code block after it")
    return blocks


def _all_blocks() -> list[Block]:
    """Every page's blocks; a page that does not parse has none here (test_pages_parse_and_link
    names its problem)."""
    out = []
    for page in PAGES:
        try:
            out += parse(page)
        except ValueError:
            pass
    return out


_DRIVER = r"""
def _serve(fd):
    import __main__, json, os, sys, traceback
    out = os.fdopen(fd, "w")
    for line in sys.stdin:
        msg = json.loads(line)
        os.environ.update(msg["env"])
        try:
            exec(compile(msg["code"], msg["name"], "exec"), __main__.__dict__)
            res = {"ok": True}
        except BaseException:
            res = {"ok": False, "error": traceback.format_exc()}
        sys.stdout.flush(); sys.stderr.flush()
        out.write(json.dumps(res) + "\n"); out.flush()
import sys
_fd = int(sys.argv[1])
del sys
_serve(_fd)
"""


def _descendants(pid: int) -> list[int]:
    """The pids below ``pid`` in the process tree (Linux /proc; [] elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class PageSession:
    """One page's folder, environment, python interpreter and servers."""

    def __init__(self, page: Path):
        self.page = page
        self.dir = Path(tempfile.mkdtemp(prefix="docs-" + page.stem + "-"))
        for entry in ROOT.iterdir():   # commands written for a clone's root work here
            if entry.name not in (".git",):
                (self.dir / entry.name).symlink_to(entry)
        self.log = self.dir / ".docs-test.log"
        self.env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                 os.environ.get("PYTHONPATH")])),
                        PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                              os.environ.get("PATH", "")]))
        self.python: subprocess.Popen | None = None
        self.results = None
        self.servers: list = []
        self.attempted: dict[int, str | None] = {}   # line -> None (ran) or why it failed

    def _start_s3(self, bucket: str) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        import remote_servers as rs
        import boto3

        server = rs.MotoServer(self.dir)
        self.servers.append(server)
        self.env.update(server.env())
        boto3.client("s3", aws_access_key_id=rs.KEY, aws_secret_access_key=rs.SECRET,
                     endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)

    def _kill(self, proc: subprocess.Popen) -> None:
        """Kill proc's process group and every descendant (some start their own groups)."""
        victims = _descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def _bash(self, code: str, name: str, timeout: float, env: dict) -> str | None:
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=self.dir,
                                    env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                return f"{name}: timed out after {timeout:.0f} s"
        return None if rc == 0 else f"{name}: exit status {rc}"

    def _python(self, code: str, name: str, timeout: float, env: dict) -> str | None:
        if self.python is None or self.python.poll() is not None:
            r, w = os.pipe()
            self.python = subprocess.Popen(
                [sys.executable, "-c", _DRIVER, str(w)], cwd=self.dir, env=self.env,
                stdin=subprocess.PIPE, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                pass_fds=(w,), start_new_session=True, text=True)
            os.close(w)
            self.results = os.fdopen(r)
        self.python.stdin.write(json.dumps({"code": code, "name": name, "env": env}) + "\n")
        self.python.stdin.flush()
        ready, _, _ = select.select([self.results], [], [], timeout)
        if not ready:
            self._kill(self.python)
            return f"{name}: timed out after {timeout:.0f} s"
        line = self.results.readline()
        if not line:
            return f"{name}: the python session died (exit status {self.python.wait()})"
        res = json.loads(line)
        return None if res["ok"] else res["error"]

    def run(self, block: Block) -> str | None:
        """Run block (its setup first); None or why it failed."""
        if block.s3 and not any(True for _ in self.servers):
            self._start_s3(block.s3)
        self.env.update(block.env)
        env = dict(self.env)
        with open(self.log, "a") as log:
            log.write(f"\n===== {block.name} ({block.lang})\n")
        start = self.log.stat().st_size
        err = None
        if block.setup:
            err = self._bash(block.setup, block.name + " (setup)", block.timeout, env)
        if err is None and block.file:
            (self.dir / block.file).write_text(block.code)
            (self.dir / block.file).chmod(0o755)
        elif err is None:
            run = self._bash if RUN[block.lang] == "bash" else self._python
            err = run(block.code, block.name, block.timeout, env)
        if err is not None:
            with open(self.log, "rb") as log:
                log.seek(start)
                out = log.read().decode(errors="replace")[-6000:]
            err = f"{err}\n--- output ---\n{out}"
        self.attempted[block.line] = err
        return err

    def close(self) -> None:
        if self.python is not None:
            self.python.stdin.close()
            try:
                self.python.wait(10)
            except subprocess.TimeoutExpired:
                self._kill(self.python)
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def sessions():
    opened: dict[Path, PageSession] = {}
    yield opened
    for session in opened.values():
        session.close()


def _params():
    out = []
    for b in _all_blocks():
        if b.lang not in RUN:
            continue
        marks = []
        if b.skip:
            marks.append(pytest.mark.skip(reason=b.skip))
        if b.slow:
            marks.append(pytest.mark.slow)
        if b.needs:
            marks.append(pytest.mark.needs(*dict.fromkeys(b.needs)))
        out.append(pytest.param(b, id=b.name, marks=marks))
    return out


@pytest.mark.parametrize("block", _params())
def test_block(block: Block, sessions):
    for page in [p for p in sessions if p != block.page]:   # (items come page by page)
        sessions.pop(page).close()
    session = sessions.get(block.page)
    if session is None:
        session = sessions[block.page] = PageSession(block.page)
    for earlier in parse(block.page):
        if earlier.line >= block.line:
            break
        if earlier.line not in session.attempted and earlier.sets_up(block):
            session.run(earlier)
        if session.attempted.get(earlier.line):
            pytest.fail(f"an earlier block of the page failed:\n{session.attempted[earlier.line]}",
                        pytrace=False)
    t0 = time.monotonic()
    err = session.run(block)
    if err is not None:
        pytest.fail(f"{block.name} ({time.monotonic() - t0:.1f} s):\n{err}", pytrace=False)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_pages_parse_and_link():
    """Every page parses (languages, directives) and its relative links and images exist."""
    problems = []
    for page in PAGES:
        try:
            parse(page)
        except ValueError as e:
            problems.append(str(e))
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path, _, anchor = target.partition("#")
            if re.match(r"[a-z]+:", path):
                continue
            file = page.parent / path if path else page
            if not file.exists():
                problems.append(f"{page.relative_to(ROOT)}: link to {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                problems.append(f"{page.relative_to(ROOT)}: link to {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_every_cli_option_is_documented():
    """Every subcommand of ``seqloader`` and each of its options appears in docs/*.md."""
    import argparse

    from seqloader.cli import build_parser

    text = "\n".join(p.read_text() for p in PAGES)
    missing = []
    for action in build_parser()._actions:             # (argparse has no public walk)
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            if f"seqloader {name}" not in text and f"`{name}`" not in text:
                missing.append(name)
            for opt in (o for a in sub._actions for o in a.option_strings):
                if opt.startswith("--") and opt != "--help" and not re.search(
                        re.escape(opt) + r"(?![\w-])", text):
                    missing.append(f"{name} {opt}")
    assert not missing, f"not in README.md or docs/*.md: {', '.join(missing)}"
