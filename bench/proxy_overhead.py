"""What toolpair adds on the request path, against the mock engine, direct and proxied in the same run.

Three processes on loopback: the mock engine, a toolpair sidecar in front of it,
and this load generator. Measures:

- added latency (median, p99) for a small chat request (~2 KB) and a large
  agent-like one (~250 KB: 40 tools, 120 messages, one reversed run to reorder);
- requests per second at concurrency 32, direct and proxied;
- the relay cost per streamed chunk.

Run: ``make bench`` (or ``python bench/proxy_overhead.py --help``). This is a
benchmark, not a test: it prints a table and checks nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def small_request() -> bytes:
    messages = [
        {"role": "system", "content": "You are a helpful assistant. " * 36},
        {"role": "user", "content": "What is the weather in Paris and Oslo today? Answer briefly. " * 16},
    ]
    return orjson.dumps({"model": "m", "messages": messages, "temperature": 0.2, "max_tokens": 64})


def large_request() -> bytes:
    """40 tools, 120 messages, about 250 KB, with one reversed run in the last round."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool number {i}. " + "It does something useful with files and text. " * 6,
                "parameters": {
                    "type": "object",
                    "properties": {f"arg_{j}": {"type": "string", "description": "an argument " * 4} for j in range(6)},
                    "required": ["arg_0"],
                },
            },
        }
        for i in range(40)
    ]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " * 40}]
    for round_no in range(1, 30):
        ids = [f"call_{round_no}_{k}" for k in range(2)]
        messages.append({"role": "user", "content": f"Step {round_no}: look at the files. " * 10})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "tool_1", "arguments": '{"arg_0": "src/x.py"}'}}
                    for i in ids
                ],
            }
        )
        messages.extend({"role": "tool", "tool_call_id": i, "content": "line of file output\n" * 158} for i in ids)
    # The last run comes back reversed, as a parallel agent would send it.
    messages[-2], messages[-1] = messages[-1], messages[-2]
    messages.append({"role": "assistant", "content": "Both files read. " * 20})
    messages.append({"role": "user", "content": "Now fix the bug. " * 20})
    messages.append({"role": "user", "content": "And add a test. " * 20})
    body = orjson.dumps({"model": "m", "messages": messages, "tools": tools})
    return body


def start(command: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_up(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(200):
        try:
            async with session.get(url + "/v1/models") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


async def timed_post(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=body) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def latency(session: aiohttp.ClientSession, direct: str, proxied: str, body: bytes, n: int) -> dict[str, float]:
    for _ in range(20):  # warm up both paths and their connection pools
        await timed_post(session, direct, body)
        await timed_post(session, proxied, body)
    d: list[float] = []
    p: list[float] = []
    for _ in range(n):  # interleaved, so drift hits both sides alike
        d.append(await timed_post(session, direct, body))
        p.append(await timed_post(session, proxied, body))
    return {
        "direct_median_ms": statistics.median(d) * 1e3,
        "proxy_median_ms": statistics.median(p) * 1e3,
        "added_median_ms": (statistics.median(p) - statistics.median(d)) * 1e3,
        "added_p99_ms": (percentile(p, 0.99) - percentile(d, 0.99)) * 1e3,
    }


async def throughput(url: str, body: bytes, concurrency: int, seconds: float) -> float:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        done = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await timed_post(session, url, body)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


async def stream_time(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, int]:
    started = time.perf_counter()
    frames = 0
    async with session.post(url + "/v1/chat/completions", data=body) as response:
        async for _ in response.content:
            frames += 1
    return time.perf_counter() - started, frames // 2


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engine_port, proxy_port = free_port(), free_port()
    direct, proxied = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
    engine = start([sys.executable, "-m", "tests.mock_engine", "--port", str(engine_port), "--words", str(args.chunks)])
    proxy = start(
        [
            sys.executable,
            "-m",
            "proxy",
            "proxy",
            "--upstream",
            direct,
            "--port",
            str(proxy_port),
            "--log-level",
            "warning",
        ]
    )
    results: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as session:
            await wait_up(session, direct)
            await wait_up(session, proxied)
            small, large = small_request(), large_request()
            results["small_bytes"], results["large_bytes"] = len(small), len(large)
            results["small"] = await latency(session, direct, proxied, small, args.n)
            results["large_reorder"] = await latency(session, direct, proxied, large, args.n)
            stream_body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
            d_times, p_times, chunks = [], [], 0
            for _ in range(args.stream_runs):
                t, chunks = await stream_time(session, direct, stream_body)
                d_times.append(t)
                t, _ = await stream_time(session, proxied, stream_body)
                p_times.append(t)
            results["stream_chunks"] = chunks
            results["relay_us_per_chunk"] = (statistics.median(p_times) - statistics.median(d_times)) / chunks * 1e6
        results["rps_direct"] = await throughput(direct, small, args.concurrency, args.seconds)
        results["rps_proxy"] = await throughput(proxied, small, args.concurrency, args.seconds)
        results["rps_ratio"] = results["rps_proxy"] / results["rps_direct"]
    finally:
        for process in (proxy, engine):
            process.terminate()
            process.wait(10)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=400, help="sequential requests per latency case and side")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each throughput run")
    parser.add_argument("--chunks", type=int, default=500, help="chunks per streamed reply")
    parser.add_argument("--stream-runs", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print raw results as JSON")
    args = parser.parse_args()
    r = asyncio.run(run(args))
    if args.json:
        print(orjson.dumps(r, option=orjson.OPT_INDENT_2).decode())
        return
    print(f"{'case':<34}{'direct':>12}{'toolpair':>12}{'added':>12}{'target':>12}")
    for name, key, target in (
        (f"small chat ({r['small_bytes'] / 1e3:.1f} KB) median ms", "small", "<= 0.3"),
        (f"large reorder ({r['large_bytes'] / 1e3:.0f} KB) median ms", "large_reorder", "<= 1.0"),
    ):
        c = r[key]
        print(
            f"{name:<34}{c['direct_median_ms']:>12.3f}{c['proxy_median_ms']:>12.3f}{c['added_median_ms']:>12.3f}{target:>12}"
        )
        print(f"{'  added p99 ms':<34}{'':>12}{'':>12}{c['added_p99_ms']:>12.3f}")
    print(
        f"{'req/s at concurrency 32':<34}{r['rps_direct']:>12.0f}{r['rps_proxy']:>12.0f}"
        f"{r['rps_ratio'] * 100:>11.0f}%{'>= 70%':>12}"
    )
    print(
        f"{'stream relay us/chunk':<34}{'':>12}{'':>12}{r['relay_us_per_chunk']:>12.1f}  ({r['stream_chunks']} chunks)"
    )


if __name__ == "__main__":
    main()
