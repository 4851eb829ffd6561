"""What reading a file sequentially costs in CPU: through the page cache vs O_DIRECT.

    hddsim -- python benchmarks/read_cost.py FILE [--mib 1200]
        [--mode buffered|direct] [--block-mib 16] [--depth 2]

Reads the first ``--mib`` MiB of FILE in ``--block-mib`` requests into reused,
page-aligned buffers, ``--depth`` requests at a time (threads), with or without
``O_DIRECT``, and prints one JSON line: MiB/s and the process's user and system CPU
seconds.  Run it under hddsim (page cache dropped, 150 MiB/s) once per mode: the
figures behind NOTE [ direct I/O ] in ``seqloader/read/direct.py``.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import threading
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--mib", type=int, default=1200)
    ap.add_argument("--mode", choices=("buffered", "direct"), default="direct")
    ap.add_argument("--block-mib", type=int, default=16)
    ap.add_argument("--depth", type=int, default=2)
    args = ap.parse_args()
    block, limit = args.block_mib << 20, args.mib << 20
    fd = os.open(args.file, os.O_RDONLY | (os.O_DIRECT if args.mode == "direct" else 0))
    lock, state = threading.Lock(), {"next": 0, "bytes": 0}

    def reader() -> None:
        buf = mmap.mmap(-1, block, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            buf.madvise(mmap.MADV_HUGEPAGE)
        view = memoryview(buf)
        while True:
            with lock:
                off = state["next"]
                state["next"] += block
            if off >= limit:
                break
            got = os.preadv(fd, [view[:min(block, limit - off)]], off)
            with lock:
                state["bytes"] += got
            if got <= 0:
                break
        view.release()
        buf.close()

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    threads = [threading.Thread(target=reader) for _ in range(args.depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    print(json.dumps({"mode": args.mode, "mib": round(state["bytes"] / 2**20),
                      "block_mib": args.block_mib, "depth": args.depth,
                      "mib_per_s": round(state["bytes"] / 2**20 / wall, 1),
                      "user_s": round(r1.ru_utime - r0.ru_utime, 2),
                      "sys_s": round(r1.ru_stime - r0.ru_stime, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
