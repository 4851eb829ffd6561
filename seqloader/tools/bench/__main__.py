"""``python -m seqloader.tools.bench`` = ``seqloader bench``."""
import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())
