"""Dataset tools: look at a database (``show``, ``info``) or check it (``verify``), cut it (``subset``), change its
layout (``reshard``, ``merge``) and hand it to other tools (``export``) -- each a
streaming pass in the database's order that copies records as stored (NOTE [ copies ]
in :mod:`.copier`).  Not imported by the core; the ``seqloader`` subcommands are in
:mod:`.commands`."""
from .export import export
from .info import describe
from .reshard import CopyReport, merge, reshard
from .show import show
from .subset import select, subset
from .verify import verify_database

__all__ = ["CopyReport", "describe", "export", "merge", "reshard", "select", "show", "subset",
           "verify_database"]
