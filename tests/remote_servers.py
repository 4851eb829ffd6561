"""Real servers for the remote-reading tests: moto's S3 server, nginx, and a fault proxy.

Each starts on 127.0.0.1 on a free port and counts requests on the server side (moto's
and nginx's request logs); the benchmarks use them too.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
KEY, SECRET = "seqloader-test-key", "seqloader-test-secret-do-not-log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer in {timeout} s")
            time.sleep(0.05)


class MotoServer:
    """``moto_server`` (S3 in server mode) in a subprocess; ``log`` is its request log."""

    def __init__(self, workdir: Path, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"moto-{self.port}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"))
        wait_http(self.endpoint + "/moto-api/", proc=self.proc)

    def storage_options(self, endpoint: str | None = None) -> dict:
        return {"key": KEY, "secret": SECRET,
                "client_kwargs": {"endpoint_url": endpoint or self.endpoint,
                                  "region_name": "us-east-1"}}

    def env(self, endpoint: str | None = None) -> dict:
        return {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def upload(self, local: Path, bucket: str, prefix: str) -> str:
        """Put every file of the folder ``local`` under ``s3://bucket/prefix/``; the URL."""
        import boto3

        s3 = boto3.client("s3", aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          endpoint_url=self.endpoint, region_name="us-east-1")
        try:
            s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        for f in sorted(Path(local).iterdir()):
            if f.is_file():
                s3.upload_file(str(f), bucket, f"{prefix}/{f.name}")
        return f"s3://{bucket}/{prefix}"

    def gets(self, path_part: str = "") -> int:
        """GET requests the server has logged (for keys containing ``path_part``)."""
        text = self.log.read_text(errors="replace")
        return len(re.findall(r'GET /[^" ]*' + re.escape(path_part), text))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Nginx:
    """Debian's nginx serving ``root`` (tests/nginx.conf), not as a daemon."""

    def __init__(self, root: Path, workdir: Path, port: int | None = None):
        exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if exe is None:
            raise FileNotFoundError("nginx is not installed")
        self.exe, self.root, self.dir = exe, root, workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access = workdir / "access.log"
        self.conf = workdir / "nginx.conf"
        self.conf.write_text((HERE / "nginx.conf").read_text()
                             .replace("@PORT@", str(self.port)).replace("@ROOT@", str(root))
                             .replace("@DIR@", str(workdir))
                             # (as root, workers would run as nobody: unable to read tmp dirs)
                             .replace("@USER@", "user root;" if os.geteuid() == 0 else ""))
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([self.exe, "-p", str(self.dir), "-c", str(self.conf),
                                      "-e", str(self.dir / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(self.url + "/", proc=self.proc)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def gets(self, path_part: str = "") -> int:
        text = self.access.read_text(errors="replace") if self.access.exists() else ""
        return len(re.findall(r'GET /[^" ]*' + re.escape(path_part), text))


class FaultProxy:
    """A TCP proxy in front of an HTTP server, one request per connection, that can
    answer a request itself instead of forwarding it: ``fault(n, request_line)`` (n
    counts requests from 0) returns None (forward), ``"reset"`` (RST before any reply),
    ``"cut"`` (forward half the reply, then RST), ``"slow:<s>"`` (wait, then forward),
    or ``"<status>"`` (e.g. ``"503"``, ``"403"``: an S3-style error reply), ``"hang"``
    (accept, read the request, never answer), ``"flip:<offset>"`` (forward, with the byte
    at file offset ``offset`` of a ranged reply inverted), ``"drip"`` (forward the reply,
    headers included, at 1 KB/s: 100 bytes every 0.1 s), ``"length:<+-n>"`` (forward, the
    Content-Length header changed by ``n``), ``"redirect:<url>"`` (a 302 to ``url``).  ``etags``: ``"keep"``,
    ``"strip"`` (replies carry no ETag) or ``"weak"`` (ETags made weak, ``W/"..."``, and
    an ``If-Match`` with a weak tag answered 412, as RFC 9110 says).
    :meth:`down` refuses connections until :meth:`up` (a server restart)."""

    def __init__(self, upstream_port: int, fault: Callable[[int, str], str | None] = lambda n, r: None,
                 etags: str = "keep"):
        self.upstream, self.fault, self.etags = upstream_port, fault, etags
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.count = 0
        self.injected: list[str] = []
        self.lock = threading.Lock()
        self.released = threading.Event()  # ends every "hang"
        self.up()

    def up(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(64)
        self.thread = threading.Thread(target=self._accept, args=(self.sock,), daemon=True)
        self.thread.start()

    def down(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # (wakes the accept: close alone does not)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)

    def close(self) -> None:
        """Down for good, hung connections released."""
        self.released.set()
        self.down()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, _, body = head.partition(b"\r\n\r\n")
            m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if re.search(rb"(?im)^expect:\s*100-continue", head):  # (uploads: body after this)
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                head = re.sub(rb"(?im)^expect:[^\r\n]*(\r\n|$)", b"", head).rstrip(b"\r\n")
            while m and len(body) < int(m.group(1)):
                chunk = conn.recv(1 << 20)
                if not chunk:
                    return
                body += chunk
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            with self.lock:
                n, self.count = self.count, self.count + 1
            action = self.fault(n, line)
            if action is not None:
                self.injected.append(action)
            if action == "hang":
                self.released.wait(600)
                return
            if action == "reset":
                _reset(conn)
                return
            if self.etags == "weak" and re.search(rb'(?im)^if-match:\s*W/', head):
                action = "412"
            if action and action.isdigit():
                msg = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>'
                       + (b"SlowDown" if action == "503" else b"AccessDenied")
                       + b"</Code><Message>injected</Message></Error>")
                conn.sendall(f"HTTP/1.1 {action} Injected\r\nContent-Type: application/xml\r\n"
                             f"Content-Length: {len(msg)}\r\nConnection: close\r\n\r\n".encode()
                             + (b"" if line.startswith("HEAD ") else msg))  # (HEAD: no body)
                return
            if action and action.startswith("redirect:"):
                conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {action[9:]}\r\n"
                             "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
                return
            if action and action.startswith("slow:"):
                time.sleep(float(action[5:]))
            head = re.sub(rb"(?im)^connection:[^\r\n]*\r\n?", b"", head + b"\r\n")
            up = socket.create_connection(("127.0.0.1", self.upstream), timeout=30)
            with up:
                up.sendall(head + b"Connection: close\r\n\r\n" + body)
                reply = b""
                while chunk := up.recv(1 << 20):
                    reply += chunk
            reply = self._rewrite(reply, head, action)
            if action == "cut":
                conn.sendall(reply[:len(reply) // 2])
                _reset(conn)
                return
            if action == "drip":
                for k in range(0, len(reply), 100):
                    if self.released.wait(0.1):
                        return
                    conn.sendall(reply[k:k + 100])
                return
            conn.sendall(reply)
        except OSError:
            pass
        finally:
            conn.close()


    def _rewrite(self, reply: bytes, request: bytes, action: str | None) -> bytes:
        top, sep, body = reply.partition(b"\r\n\r\n")
        if self.etags == "strip":
            top = re.sub(rb"(?im)\r\netag:[^\r\n]*", b"", top)
        elif self.etags == "weak":
            top = re.sub(rb'(?im)(\r\netag:\s*)"', rb'\1W/"', top)
        if action and action.startswith("length:"):
            top = re.sub(rb"(?im)(\r\ncontent-length:\s*)(\d+)",
                         lambda m: m.group(1) + str(int(m.group(2)) + int(action[7:])).encode(),
                         top)
        if action and action.startswith("flip:"):
            m = re.search(rb"(?im)^range:\s*bytes=(\d+)-", request)
            at = int(action[5:]) - (int(m.group(1)) if m else 0)
            if 0 <= at < len(body) and top.startswith(b"HTTP/1.1 20"):
                body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:]
        return top + sep + body


def _reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
