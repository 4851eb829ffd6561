"""The dataset tools' subcommands: registered, every option explained."""
from __future__ import annotations

import argparse

from seqloader.cli import build_parser

COMMANDS = ("show", "subset", "reshard", "merge", "export", "info")


def test_every_option_of_the_tools_has_help():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        p = sub.choices[name]
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"seqloader {name} {action.option_strings or action.dest}: no help"
        assert p.format_help()
