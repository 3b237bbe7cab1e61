"""What a long chain of continuations costs in the Redis Responses store, against a real redis-server.

One conversation of TURNS turns, each adding about 1 KiB of items, stored as toolpair stores
it (each response's new items plus a link to its parent), compared in the same run with what
storing each response's whole conversation would take. Prints Redis memory used and the time
to read the last response's conversation back, next to one response's; checks nothing.

Run: ``python bench/responses_store_chain.py [--turns 200]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.responses_store import RedisResponseStore, StoredResponse  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402


async def used_memory(url: str) -> int:
    db = redis.asyncio.Redis.from_url(url)
    try:
        info = await db.info("memory")
        return int(info["used_memory"])
    finally:
        await db.aclose()


async def median_read_ms(store: RedisResponseStore, response_id: str, rounds: int = 50) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await store.get(response_id)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def run(turns: int) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(Path(workdir)).start()
        try:
            base = await used_memory(server.url)
            for chained in (True, False):
                store = RedisResponseStore(server.url, 100_000, 1 << 40, prefix=f"bench:{chained}:")
                items: list[Any] = []
                previous: StoredResponse | None = None
                for turn in range(turns):
                    items = [*items, {"type": "message", "role": "user", "content": f"t{turn} " + "x" * 1000}]
                    response = {"id": f"resp_{turn}", "output": []}
                    await store.put(response["id"], items, response, size=1100, previous=previous if chained else None)
                    previous = StoredResponse(items, response, 1100)
                memory = await used_memory(server.url) - base
                last, first = await median_read_ms(store, f"resp_{turns - 1}"), await median_read_ms(store, "resp_0")
                name = "new items + parent" if chained else "whole conversation each"
                print(f"{name:<24} memory {memory / 1e6:7.2f} MB, read last {last:5.2f} ms, first {first:5.2f} ms")
                db = redis.asyncio.Redis.from_url(server.url)
                await db.flushdb()
                await db.aclose()
                await store.close()
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    print(f"one conversation of {args.turns} turns, about 1 KiB of new items per turn")
    asyncio.run(run(args.turns))


if __name__ == "__main__":
    main()
