#!/usr/bin/env python3
"""TCP proxy that adds a fixed one-way delay to every byte, in both directions.

The benchmark host kernel has no netem, so `tc` can shape bandwidth (HTB) but not add latency.
This proxy stands in for `netem delay`: each chunk read from one side is written to the other
side DELAY_MS later (chunks keep their order; the delay does not limit throughput, which the
HTB qdisc on the link does). A request/response exchange therefore pays 2 x DELAY_MS, as
through a link with that one-way latency.

Usage: delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS
"""
import asyncio
import sys
import time


async def pump(reader, writer, delay):
    queue = asyncio.Queue()

    async def sender():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    task = asyncio.create_task(sender())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            queue.put_nowait((time.monotonic() + delay, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((time.monotonic() + delay, None))
    try:
        await task
    except (ConnectionError, OSError):
        pass


async def handle(client_r, client_w, target, delay):
    host, port = target
    try:
        up_r, up_w = await asyncio.open_connection(host, port)
    except OSError:
        client_w.close()
        return
    await asyncio.gather(pump(client_r, up_w, delay), pump(up_r, client_w, delay))
    for w in (client_w, up_w):
        try:
            w.close()
        except OSError:
            pass


async def main():
    listen, target, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lh, lp = listen.rsplit(":", 1)
    th, tp = target.rsplit(":", 1)
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, (th, int(tp)), delay_ms / 1000.0), lh, int(lp)
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
