#!/usr/bin/env python
"""Serialize an ImageNet-style folder tree into LMDB files for sequential reading.

    python preprocess_sequential.py <imagenet dir> <lmdb dir> [options]

writes <lmdb dir>/ILSVRC-train.lmdb and ILSVRC-val.lmdb for the train/ and val/
folders present.  Same as `seqloader preprocess`; `--help` lists the options.
"""
import sys

from seqloader.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess", *sys.argv[1:]]))
