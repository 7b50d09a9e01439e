#!/usr/bin/env python3
"""Publish and consume rates of the Python client against a running berthd.

    python3 clients/python/bench.py --addr 127.0.0.1:7400 --count 200000 --size 100

It declares its own queue (bench-py-<pid>-<n>), publishes --count messages
pipelined (up to the window in flight, completions awaited), consumes them
with --prefetch credit and batched accepts, then deletes the queue. With
--sync it also times --sync messages published one at a time, each awaited.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import berth  # noqa: E402
from berth import AckMode  # noqa: E402


async def main(a) -> None:
    c = await berth.connect(a.addr, client_name="bench.py")
    q = f"bench-py-{os.getpid()}-{time.monotonic_ns() % 1_000_000}"
    await c.declare_queue(q, durable=a.persistent)
    payload = b"x" * a.size
    try:
        if a.sync:
            t0 = time.perf_counter()
            for _ in range(a.sync):
                await c.publish("", q, payload, persistent=a.persistent)
            dt = time.perf_counter() - t0
            print(f"publish, one at a time: {a.sync} msgs in {dt:.2f} s = {a.sync / dt:,.0f} msg/s")
            await c.purge(q)

        t0 = time.perf_counter()
        futs = [await c.publish_async("", q, payload, persistent=a.persistent) for _ in range(a.count)]
        await asyncio.gather(*futs)
        dt = time.perf_counter() - t0
        print(f"publish, pipelined:     {a.count} msgs of {a.size} B in {dt:.2f} s = "
              f"{a.count / dt:,.0f} msg/s ({a.count * a.size / dt / 1e6:.1f} MB/s payload)"
              f"{' persistent, durable queue' if a.persistent else ''}")

        mode = AckMode.NONE if a.no_ack else AckMode.EXPLICIT
        t0 = time.perf_counter()
        cons = await c.subscribe(q, prefetch=a.prefetch, ack_mode=mode)
        got = 0
        acks = []
        while got < a.count:
            batch = cons.get_nowait() or [await cons.get(30)]
            got += len(batch)
            if mode == AckMode.EXPLICIT:
                acks.append(asyncio.ensure_future(cons.accept(*batch)))
        await asyncio.gather(*acks)
        dt = time.perf_counter() - t0
        print(f"consume, prefetch {a.prefetch}{', no acks' if a.no_ack else ', accepted'}: "
              f"{got} msgs in {dt:.2f} s = {got / dt:,.0f} msg/s")
        await cons.cancel()
    finally:
        await c.delete_queue(q)
        await c.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:7400", help="berthd client address(es), comma-separated")
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100, help="payload bytes")
    p.add_argument("--persistent", action="store_true", help="persistent messages on a durable queue")
    p.add_argument("--prefetch", type=int, default=5000)
    p.add_argument("--no-ack", action="store_true", help="consume in ack mode none")
    p.add_argument("--sync", type=int, default=0, metavar="N", help="also time N awaited publishes")
    asyncio.run(main(p.parse_args()))
