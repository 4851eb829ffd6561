#!/usr/bin/env python
"""A TCP proxy that delays every byte by a fixed time each way (a WAN's round trip).

    python benchmarks/delay_proxy.py LISTEN_HOST:PORT UPSTREAM_HOST:PORT RTT_MS

This kernel has no netem, so ``remote_read.py`` adds latency with this: each chunk
read from one side is written to the other ``RTT_MS / 2`` ms after it arrived, as a
delay line (chunks in flight overlap, so the delay costs no bandwidth; at most
``_INFLIGHT`` bytes are held per direction, about a TCP window).  Bandwidth is
limited elsewhere (``tc ... tbf`` on the link).  Runs until killed.
"""
from __future__ import annotations

import asyncio
import sys

_CHUNK = 256 << 10
_INFLIGHT = 16 << 20


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=max(4, _INFLIGHT // _CHUNK))

    async def take() -> None:
        while True:
            data = await reader.read(_CHUNK)
            await queue.put((loop.time() + delay, data))
            if not data:
                return

    async def give() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(take(), give())
    except (ConnectionError, OSError):
        writer.close()


async def _serve(up_host: str, up_port: int, delay: float,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(up_host, up_port), 10)
    except (OSError, asyncio.TimeoutError):
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, up_writer, delay), _pipe(up_reader, writer, delay))
    finally:
        writer.close()
        up_writer.close()


async def main(listen: str, upstream: str, rtt_ms: float) -> None:
    host, port = listen.rsplit(":", 1)
    up_host, up_port = upstream.rsplit(":", 1)
    delay = rtt_ms / 2000.0
    server = await asyncio.start_server(
        lambda r, w: _serve(up_host, int(up_port), delay, r, w), host, int(port),
        limit=_CHUNK, backlog=256)
    print(f"delay proxy {listen} -> {upstream}, {rtt_ms} ms round trip", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
