#!/usr/bin/env python
"""Reading from S3 and HTTP over a slow, distant link: seqloader against webdataset.

    sudo python benchmarks/remote_read.py DB WORK [--rate-mbit 1000] [--rtt-ms 20]
                                          [--seconds 20] [--workers 1] [--json OUT]

``DB`` is a seqloader database folder holding a sharded ``train`` split (e.g.
``seqloader preprocess TREE DB --splits train --shards 8 --no-verify``); ``WORK`` a
folder for the webdataset ``.tar`` shards made from the same records (as many as
``DB`` has shards, so of similar size) and the servers' logs.  Needs root: it
creates a network namespace ``slbench`` joined to this one by a veth pair and runs
in it moto's S3 server (the database uploaded to it), nginx (the ``.tar`` shards and
the database files) and, in front of each, ``delay_proxy.py`` adding ``--rtt-ms``
of round trip (this kernel has no netem).  ``tc ... tbf`` limits the veth to
``--rate-mbit`` both ways.  The servers and proxies run on CPU 1, every client on
CPU 0 (``taskset``): the servers stand in for other machines, so they must not take
the client's CPU; the local-disk baseline runs on CPU 0 too.

Measured (MB = 10^6 bytes): the link (curl of one file through the nginx proxy) and
the round trip (time to the first byte of a small file); moto alone (curl in the
namespace, no link: what the S3 server can serve); the link's bulk rate (8 files at
once); raw reading from S3 and from HTTP over ``--epochs`` whole epochs after a
warm-up epoch (payload MB/s, and the wire rate: bytes the client's veth received;
% of the link's rate); webdataset raw over HTTP (the same records, ``http://`` shard
URLs, which webdataset reads with ``curl``); the full ImageNet training pipeline
(``--workers``) from local disk and from S3, over a 20 s window (``seqloader bench
--mode full``) and over one whole epoch, and webdataset's (decode + the same,
unfused, transforms in a DataLoader); the first batch from S3 in a new process
(imports, opening, first GETs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NS, VETH_HOST, VETH_NS = "slbench", "slb0", "slb1"
IP_HOST, IP_NS = "10.213.7.1", "10.213.7.2"
MOTO_PORT, NGINX_PORT, S3_PROXY, HTTP_PROXY = 5000, 8080, 9000, 9001
KEY, SECRET = "bench-key", "bench-secret"
MB = 1e6


def sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


def in_ns(*cmd: str) -> list[str]:
    return ["ip", "netns", "exec", NS, "taskset", "-c", "1", *cmd]


def client(*cmd: str) -> list[str]:
    return ["taskset", "-c", "0", *cmd]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{IP_NS}:{S3_PROXY}"}


# ------------------------------------------------------------------ data


def make_tars(db: Path, out: Path) -> list[Path]:
    """One ``.tar`` per database shard with its records as ``<key>.jpg`` + ``<key>.cls``
    (webdataset's layout), in the database's (shuffled) order."""
    from seqloader.read.database import open_database
    from seqloader.read.reader import RangeReader
    from seqloader.format.records import unpack_record

    tars = sorted(out.glob("shard-*.tar"))
    d = open_database(db, "train")
    if len(tars) == len(d.paths):
        return tars
    out.mkdir(parents=True, exist_ok=True)
    bounds = [0]
    for n in d.shard_sizes:
        bounds.append(bounds[-1] + n)
    reader = RangeReader(d)
    try:
        for k in range(len(d.paths)):
            path = out / f"shard-{k:05d}.tar"
            with tarfile.open(str(path) + ".tmp", "w") as tar:
                for i, value in reader.read([(bounds[k], bounds[k + 1])]):
                    rec = unpack_record(value)
                    for ext, data in (("jpg", bytes(rec.image)), ("cls", str(rec.label).encode())):
                        info = tarfile.TarInfo(f"{i:08d}.{ext}")
                        info.size, info.mtime = len(data), 0
                        tar.addfile(info, __import__("io").BytesIO(data))
            os.replace(str(path) + ".tmp", path)
    finally:
        reader.close()
    return sorted(out.glob("shard-*.tar"))


# ------------------------------------------------------------------ network and servers


class Net:
    """The namespace, the veth pair with tbf, and the servers in it."""

    def __init__(self, rate_mbit: int, work: Path):
        self.procs: list[subprocess.Popen] = []
        self.work = work
        self.rate = rate_mbit
        self.down()
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS)
        sh("ip", "link", "set", VETH_NS, "netns", NS)
        sh("ip", "addr", "add", f"{IP_HOST}/24", "dev", VETH_HOST)
        sh("ip", "link", "set", VETH_HOST, "up")
        sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{IP_NS}/24", "dev", VETH_NS)
        sh("ip", "netns", "exec", NS, "ip", "link", "set", VETH_NS, "up")
        sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")

    def limit(self) -> None:
        # burst >= rate / HZ; a queue of 50 ms (tbf's latency) as a router would have
        for dev, pre in ((VETH_NS, ["ip", "netns", "exec", NS]), (VETH_HOST, [])):
            sh(*pre, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
               f"{self.rate}mbit", "burst", "1mb", "latency", "50ms")

    def start(self, *cmd: str, log: str, cwd: Path | None = None) -> subprocess.Popen:
        p = subprocess.Popen(in_ns(*cmd), stdout=subprocess.DEVNULL,
                             stderr=open(self.work / log, "ab"), env=env(), cwd=cwd)
        self.procs.append(p)
        return p

    def wait_port(self, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sh(*in_ns("curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/"),
                 check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"port {port} in {NS} did not answer")
            time.sleep(0.2)

    def down(self) -> None:
        for p in getattr(self, "procs", []):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        sh("ip", "link", "del", VETH_HOST, check=False)
        sh("ip", "netns", "del", NS, check=False)


def start_servers(net: Net, db: Path, tars: list[Path], rtt_ms: float) -> None:
    net.start(sys.executable, "-m", "moto.server", "-H", "0.0.0.0", "-p", str(MOTO_PORT),
              log="moto.log")
    www = net.work / "www"
    if www.exists():
        shutil.rmtree(www)
    (www / "wds").mkdir(parents=True)
    (www / "lmdb").mkdir()
    for t in tars:
        os.link(t, www / "wds" / t.name)
    for f in sorted(db.glob("ILSVRC-train*.lmdb")):
        os.link(f, www / "lmdb" / f.name)
    ngx = net.work / "nginx"
    (ngx / "tmp").mkdir(parents=True, exist_ok=True)
    conf = ngx / "nginx.conf"
    conf.write_text((REPO / "tests" / "nginx.conf").read_text()
                    .replace("@PORT@", str(NGINX_PORT)).replace("@ROOT@", str(www))
                    .replace("@DIR@", str(ngx)).replace("@USER@", "user root;"))
    net.start(shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(ngx), "-c", str(conf),
              log="nginx.err")
    for listen, up in ((S3_PROXY, MOTO_PORT), (HTTP_PROXY, NGINX_PORT)):
        net.start(sys.executable, str(HERE / "delay_proxy.py"), f"{IP_NS}:{listen}",
                  f"127.0.0.1:{up}", str(rtt_ms), log=f"proxy-{listen}.log")
    net.wait_port(MOTO_PORT)
    net.wait_port(NGINX_PORT)
    import boto3

    s3 = boto3.client("s3", endpoint_url=f"http://{IP_NS}:{MOTO_PORT}", aws_access_key_id=KEY,
                      aws_secret_access_key=SECRET, region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    for f in sorted(db.glob("ILSVRC-train*.lmdb")):  # (before the link is limited)
        s3.upload_file(str(f), "bench", f"imagenet/{f.name}")


# ------------------------------------------------------------------ measurements


def curl_rate(url: str, ns: bool = False) -> dict:
    cmd = in_ns if ns else client
    out = sh(*cmd("curl", "-s", "-o", "/dev/null", "-w",
                  "%{speed_download} %{time_starttransfer} %{size_download}", url)).stdout.split()
    return {"mb_per_s": round(float(out[0]) / MB, 1), "first_byte_s": round(float(out[1]), 4),
            "bytes": int(out[2])}


def bench(path: str, mode: str, seconds: float, workers: int, extra: list[str] = ()) -> dict:
    cmd = client(sys.executable, "-m", "seqloader.tools.bench", path, "--split", "train",
                 "--mode", mode, "--workers", str(workers), "--seconds", str(seconds),
                 "--json", "--no-progress", *extra)
    out = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr[-2000:]}")
    row = json.loads(out.stdout)["results"][0]
    return {k: row.get(k) for k in ("images_per_s", "mb_per_s", "first_batch_s", "cpu_percent",
                                    "images", "seconds")}


_RAW = r"""
import json, sys, time
from seqloader import Loader
url, epochs, dev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rx():
    return int(open(f"/sys/class/net/{dev}/statistics/rx_bytes").read())
loader = Loader(url, "train", batch_size=256, shuffle=True, num_workers=1)
t0 = time.perf_counter(); first = None
for epoch in range(1 + epochs):  # epoch 0 warms up; then whole epochs are timed
    loader.set_epoch(epoch)
    if epoch == 1:
        start, r0, n, nbytes = time.perf_counter(), rx(), 0, 0
    for images, labels in loader:
        if first is None:
            first = time.perf_counter() - t0
        if epoch:
            n += len(images); nbytes += sum(len(x) for x in images)
dt = time.perf_counter() - start
print(json.dumps({"images_per_s": round(n / dt, 2), "mb_per_s": round(nbytes / dt / 1e6, 3),
                  "wire_mb_per_s": round((rx() - r0) / dt / 1e6, 3), "epochs": epochs,
                  "first_batch_s": round(first, 4), "seconds": round(dt, 3)}))
"""


def raw_epochs(url: str, epochs: int) -> dict:
    """Raw reading over whole epochs (after one warm-up epoch): the payload's rate and the
    link's (bytes the client's veth received, TCP/IP headers included)."""
    out = subprocess.run(client(sys.executable, "-c", _RAW, url, str(epochs), VETH_HOST),
                         env=env(), capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"raw {url}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


_FULL = r"""
import json, sys, time
from seqloader import Loader
from seqloader.tools.bench import imagenet_train_transform
url, workers = sys.argv[1], int(sys.argv[2])
loader = Loader(url, "train", imagenet_train_transform(), batch_size=256, shuffle=True,
                num_workers=workers)
n, start = 0, None
for images, labels in loader:  # one whole epoch, timed from its first batch
    if start is None:
        start = time.perf_counter()
    else:
        n += len(labels)
dt = time.perf_counter() - start
print(json.dumps({"images_per_s": round(n / dt, 2), "seconds": round(dt, 3), "images": n}))
"""


def full_epoch(url: str, workers: int) -> dict:
    """The full training pipeline over one whole epoch (a shuffle buffer's fill, at the
    epoch's start, counts as often as it happens in training: once per epoch)."""
    out = subprocess.run(client(sys.executable, "-c", _FULL, url, str(workers)), env=env(),
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"full {url}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def link_bulk(urls: list[str]) -> dict:
    """What the link carries: ``len(urls)`` files fetched at once with curl (MB/s of
    payload) and the veth's received bytes over the same time."""
    rx = lambda: int(Path(f"/sys/class/net/{VETH_HOST}/statistics/rx_bytes").read_text())  # noqa: E731
    r0, t = rx(), time.perf_counter()
    procs = [subprocess.Popen(client("curl", "-s", "-o", "/dev/null", "-w", "%{size_download}",
                                     u), stdout=subprocess.PIPE, text=True) for u in urls]
    total = sum(int(p.communicate()[0] or 0) for p in procs)
    dt = time.perf_counter() - t
    return {"mb_per_s": round(total / dt / MB, 1), "wire_mb_per_s": round((rx() - r0) / dt / MB, 1),
            "files": len(urls)}


_WDS = r"""
import json, sys, time
import numpy as np, torch, webdataset as wds
mode, seconds, workers, urls = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
if mode == "raw":
    ds = wds.WebDataset(urls, shardshuffle=False).to_tuple("jpg", "cls")
    batches = wds.WebLoader(ds, batch_size=None, num_workers=0)
else:
    from seqloader.transforms import decode_rgb
    from seqloader.tools.bench import imagenet_train_transform
    from seqloader.tools.bench.filesloader import worker_init
    tf = imagenet_train_transform()
    def prep(sample):
        jpg, cls = sample
        return np.ascontiguousarray(tf(decode_rgb(jpg))), int(cls), len(jpg)
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node)
          .shuffle(5000).to_tuple("jpg", "cls").map(prep).batched(256, partial=False))
    batches = wds.WebLoader(ds, batch_size=None, num_workers=workers, worker_init_fn=worker_init,
                            persistent_workers=True)
t0 = time.perf_counter(); first = None; n = nbytes = 0; start = None
while True:
    for item in batches:
        now = time.perf_counter()
        if first is None:
            first = now - t0
        if mode == "raw":
            n += 1; nbytes += len(item[0])
        else:
            n += len(item[1]); nbytes += int(sum(item[2]))
        if start is None and (n >= 256 * 2 if mode != "raw" else n >= 512):
            start, n0, b0 = now, n, nbytes
        if start is not None and now - start >= seconds:
            break
    else:
        continue
    break
dt = now - start
print(json.dumps({"images_per_s": round((n - n0) / dt, 2), "mb_per_s": round((nbytes - b0) / dt / 1e6, 3),
                  "first_batch_s": round(first, 4), "seconds": round(dt, 3)}))
"""


def wds_run(urls: list[str], mode: str, seconds: float, workers: int) -> dict:
    cmd = client(sys.executable, "-c", _WDS, mode, str(seconds), str(workers), *urls)
    out = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"webdataset {mode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


_FIRST = r"""
import time, sys
t0 = time.perf_counter()
from seqloader import Loader
t1 = time.perf_counter()
loader = Loader(sys.argv[1], "train", batch_size=256, shuffle=True, num_workers=0)
t2 = time.perf_counter()
next(iter(loader))
t3 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} {t3 - t0:.3f}")
"""


def first_batch(url: str) -> dict:
    start = time.perf_counter()
    out = subprocess.run(client(sys.executable, "-c", _FIRST, url), env=env(),
                         capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    imp, opening, batch, total = map(float, out.stdout.split())
    return {"import_s": imp, "open_s": opening, "first_batch_s": batch, "in_process_s": total,
            "process_wall_s": round(wall, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", type=Path, help="seqloader database folder with a sharded train split")
    ap.add_argument("work", type=Path, help="folder for the .tar shards, logs and the report")
    ap.add_argument("--rate-mbit", type=int, default=1000)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=1, help="full-pipeline workers (client CPUs)")
    ap.add_argument("--epochs", type=int, default=2, help="raw runs: timed whole epochs")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespace, tc)")
    args.work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    tars = make_tars(args.db, args.work / "tars")
    shards = sorted(args.db.glob("ILSVRC-train*.lmdb"))
    net = Net(args.rate_mbit, args.work)
    res: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                 "rate_mbit": args.rate_mbit, "rtt_ms": args.rtt_ms, "seconds": args.seconds,
                 "workers": args.workers, "db_bytes": sum(f.stat().st_size for f in shards),
                 "tar_bytes": sum(t.stat().st_size for t in tars), "shards": len(shards),
                 "loadavg_start": os.getloadavg()[0]}
    link = args.rate_mbit * 1e6 / 8 / MB
    try:
        start_servers(net, args.db, tars, args.rtt_ms)
        res["moto_alone"] = curl_rate(f"http://127.0.0.1:{MOTO_PORT}/bench/imagenet/{shards[0].name}",
                                      ns=True)
        res["nginx_alone"] = curl_rate(f"http://127.0.0.1:{NGINX_PORT}/lmdb/{shards[0].name}",
                                       ns=True)
        net.limit()
        http = f"http://{IP_NS}:{HTTP_PROXY}"
        res["link"] = curl_rate(f"{http}/lmdb/{shards[1].name}")
        res["link_bulk"] = link_bulk([f"{http}/lmdb/{f.name}" for f in shards[2:10]])
        res["rtt"] = curl_rate(f"{http}/wds/")  # (a small listing: first byte = one round trip)
        s3 = "s3://bench/imagenet"
        steps = [
            ("s3_raw", lambda: raw_epochs(s3, args.epochs)),
            ("http_raw", lambda: raw_epochs(f"{http}/lmdb/{shards[0].name}", args.epochs)),
            ("wds_http_raw", lambda: wds_run([f"{http}/wds/{t.name}" for t in tars], "raw",
                                             args.seconds, 1)),
            ("s3_first_batch", lambda: first_batch(s3)),
            ("local_full", lambda: bench(str(args.db), "full", args.seconds, args.workers)),
            ("s3_full", lambda: bench(s3, "full", args.seconds, args.workers)),
            ("local_full_epoch", lambda: full_epoch(str(args.db), args.workers)),
            ("s3_full_epoch", lambda: full_epoch(s3, args.workers)),
            ("wds_http_full", lambda: wds_run([f"{http}/wds/{t.name}" for t in tars], "full",
                                              args.seconds, args.workers)),
        ]
        for name, fn in steps:
            print(f"{name} ...", file=sys.stderr, flush=True)
            res[name] = fn()
            print(f"  {res[name]}", file=sys.stderr, flush=True)
    finally:
        net.down()
    res["link_mb_per_s_nominal"] = link
    for k in ("s3_raw", "http_raw", "wds_http_raw"):
        res[k]["pct_of_link"] = round(100 * res[k]["mb_per_s"] / link, 1)
        res[k]["pct_of_link_bulk"] = round(100 * res[k]["mb_per_s"] / res["link_bulk"]["mb_per_s"], 1)
        if "wire_mb_per_s" in res[k]:
            res[k]["wire_pct_of_link"] = round(100 * res[k]["wire_mb_per_s"] / link, 1)
    res["s3_full_pct_of_local"] = round(100 * res["s3_full"]["images_per_s"]
                                        / res["local_full"]["images_per_s"], 1)
    res["s3_full_epoch_pct_of_local"] = round(100 * res["s3_full_epoch"]["images_per_s"]
                                              / res["local_full_epoch"]["images_per_s"], 1)
    res["loadavg_end"] = os.getloadavg()[0]
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
