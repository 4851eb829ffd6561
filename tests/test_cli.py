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
