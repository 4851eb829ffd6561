"""``python -m seqloader`` = the ``seqloader`` command."""
import sys

from .cli import main

sys.exit(main())
