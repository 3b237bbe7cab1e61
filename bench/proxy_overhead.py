"""What toolpair adds on the request path, against the mock engine and against the floor of one aiohttp hop.

Four processes on loopback: the mock engine, a toolpair sidecar in front of it,
a minimal aiohttp pass-through proxy in front of it (the *floor*: it reads the
body, forwards the bytes and relays the answer, whole or chunk by chunk, and
parses nothing), and this load generator. Direct, floor and toolpair requests
are interleaved in the same run, so the machine's drift hits all three alike.
Measures:

- added latency (median, p99) for a small chat request (~2 KB) and a large
  agent-like one (~250 KB: 40 tools, 120 messages, one reversed run to reorder);
- the same for a streamed reply, as the whole stream's time and per chunk;
- toolpair's added latency as a ratio to the floor's, per case: what toolpair
  costs beyond the unavoidable price of one aiohttp server and client hop
  (target: at most 1.15x);
- CPU time per request of each proxy process, and its ratio (steadier than
  wall time on a loaded machine);
- requests per second at concurrency 32: direct, floor and proxied.

``--against DIR`` also runs a toolpair sidecar from another checkout (say, the
main branch) as a fourth side, interleaved with the others, and prints its
ratios to the same floor: a before/after of a change, in one run.

Run: ``make bench`` (or ``python bench/proxy_overhead.py --help``). This is a
benchmark, not a test: it prints a table and checks nothing. Figures move a lot
on a busy machine; the ratios within one run are what to compare.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

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
    return orjson.dumps({"model": "mock", "messages": messages, "temperature": 0.2, "max_tokens": 64})


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
    body = orjson.dumps({"model": "mock", "messages": messages, "tools": tools})
    return body


def floor_app(upstream: str) -> web.Application:
    """The cheapest honest aiohttp proxy: one pooled client session, bytes in and out, no parsing.

    Non-streamed answers are read whole and sent in one response (as toolpair
    does for small plain replies); event streams are relayed chunk by chunk as
    they arrive, each write awaited.
    """
    app = web.Application(client_max_size=1 << 30)
    sessions: list[aiohttp.ClientSession] = []

    async def session_ctx(_app: web.Application) -> Any:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        sessions.append(session)
        yield
        await session.close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with sessions[0].request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            content_type = answer.headers.get("Content-Type", "application/json")
            if not content_type.startswith("text/event-stream"):
                return web.Response(
                    status=answer.status, body=await answer.read(), headers={"Content-Type": content_type}
                )
            relay = web.StreamResponse(status=answer.status, headers={"Content-Type": content_type})
            await relay.prepare(request)
            async for chunk in answer.content.iter_any():
                await relay.write(chunk)
            await relay.write_eof()
            return relay

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def serve_floor(upstream: str, port: int) -> None:
    """Run the floor proxy on the same event loop toolpair uses (uvloop where installed)."""
    from proxy.cli.common import new_event_loop

    web.run_app(floor_app(upstream), host="127.0.0.1", port=port, access_log=None, print=None, loop=new_event_loop())


def start(command: list[str], root: Path = ROOT) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def toolpair_command(upstream: str, port: int) -> list[str]:
    """The toolpair sidecar's command line, as the bench configures it (run from a checkout's root)."""
    command = [sys.executable, "-m", "proxy", "proxy", "--upstream", upstream, "--port", str(port)]
    return [*command, "--log-level", "warning"]


def floor_command(upstream: str, port: int) -> list[str]:
    """The floor proxy's command line: this script, serving the floor."""
    return [sys.executable, str(Path(__file__).resolve()), "--serve-floor", upstream, "--port", str(port)]


def start_toolpair(upstream: str, port: int, root: Path = ROOT) -> subprocess.Popen[bytes]:
    """A toolpair sidecar from the checkout at ``root``, as the bench configures it."""
    return start(toolpair_command(upstream, port), root)


async def wait_up(session: aiohttp.ClientSession, url: str, seconds: float = 10.0) -> None:
    """Waits until ``url`` answers ``/v1/models`` (a proxy under valgrind needs minutes, not seconds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare(
    d: list[float], f: list[float], p: list[float], *others: list[float], unit: float = 1e3
) -> dict[str, float]:
    """Medians of direct, floor and toolpair times; what each hop adds; toolpair's added time over the floor's.

    ``others`` (the ``--against`` checkout) get the same figures, their keys prefixed with ``against_``.
    """
    dm, fm = statistics.median(d), statistics.median(f)
    result = {"direct_median_ms": dm * unit, "floor_median_ms": fm * unit, "floor_added_median_ms": (fm - dm) * unit}
    for prefix, times in zip(("", "against_"), (p, *others), strict=False):
        pm = statistics.median(times)
        result[f"{prefix}proxy_median_ms"] = pm * unit
        result[f"{prefix}added_median_ms"] = (pm - dm) * unit
        result[f"{prefix}added_p99_ms"] = (percentile(times, 0.99) - percentile(d, 0.99)) * unit
        result[f"{prefix}ratio_to_floor"] = (pm - dm) / (fm - dm) if fm > dm else float("nan")
    return result


@dataclass
class Contest:
    """Direct, floor, toolpair (and the ``--against`` toolpair) side by side: URLs, and the proxies' processes."""

    urls: tuple[str, ...]
    floor_pid: int
    proxy_pid: int
    against_pid: int | None = None

    async def times(self, measure: Callable[[str], Awaitable[float]], rounds: int) -> tuple[list[float], ...]:
        """Time ``measure(url)`` on each side per round, in a rotating order so no side always goes first."""
        sides = len(self.urls)
        times: tuple[list[float], ...] = tuple([] for _ in range(sides))
        for round_no in range(rounds):
            for k in range(sides):
                side = (round_no + k) % sides
                times[side].append(await measure(self.urls[side]))
        return times

    async def run(self, measure: Callable[[str], Awaitable[float]], rounds: int, warmup: int) -> dict[str, float]:
        """Wall times as :func:`compare` gives them, plus each proxy's CPU time per call.

        CPU time barely moves with the machine's load, unlike wall time, so its ratio is the steadier
        figure on a shared machine; wall time is what a client sees.
        """
        await self.times(measure, warmup)  # warm up every path and its connection pool
        pids = [self.floor_pid, self.proxy_pid, *([] if self.against_pid is None else [self.against_pid])]
        cpu_before = [cpu_seconds(pid) for pid in pids]
        result = compare(*await self.times(measure, rounds))
        floor_cpu, *proxies_cpu = [
            (cpu_seconds(pid) - before) / rounds for pid, before in zip(pids, cpu_before, strict=True)
        ]
        result["floor_cpu_ms"] = floor_cpu * 1e3
        for prefix, proxy_cpu in zip(("", "against_"), proxies_cpu, strict=False):
            result[f"{prefix}proxy_cpu_ms"] = proxy_cpu * 1e3
            result[f"{prefix}cpu_ratio_to_floor"] = proxy_cpu / floor_cpu if floor_cpu > 0 else float("nan")
        return result


async def latency(session: aiohttp.ClientSession, contest: Contest, body: bytes, n: int) -> dict[str, float]:
    async def measure(url: str) -> float:
        return await timed_post(session, url, body)

    return await contest.run(measure, n, warmup=20)


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
    engine_port, proxy_port, floor_port, against_port = free_port(), free_port(), free_port(), free_port()
    direct, proxied = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
    floor, against = f"http://127.0.0.1:{floor_port}", f"http://127.0.0.1:{against_port}"
    engine = start([sys.executable, "-m", "tests.mock_engine", "--port", str(engine_port), "--words", str(args.chunks)])
    floor_proxy = start(floor_command(direct, floor_port))
    proxy = start_toolpair(direct, proxy_port)
    other = start_toolpair(direct, against_port, args.against.resolve()) if args.against else None
    results: dict[str, Any] = {"against": str(args.against) if args.against else None}
    try:
        async with aiohttp.ClientSession() as session:
            urls = (direct, floor, proxied, *([against] if other else []))
            contest = Contest(urls, floor_proxy.pid, proxy.pid, other.pid if other else None)
            for url in contest.urls:
                await wait_up(session, url)
            small, large = small_request(), large_request()
            results["small_bytes"], results["large_bytes"] = len(small), len(large)
            results["small"] = await latency(session, contest, small, args.n)
            results["large_reorder"] = await latency(session, contest, large, args.n)
            hi = [{"role": "user", "content": "hi"}]
            stream_body = orjson.dumps({"model": "mock", "messages": hi, "stream": True})
            chunks = 0

            async def measure_stream(url: str) -> float:
                nonlocal chunks
                seconds, chunks = await stream_time(session, url, stream_body)
                return seconds

            results["stream"] = await contest.run(measure_stream, args.stream_runs, warmup=2)
            results["stream_chunks"] = chunks
            results["relay_us_per_chunk"] = results["stream"]["added_median_ms"] / chunks * 1e3
            results["floor_relay_us_per_chunk"] = results["stream"]["floor_added_median_ms"] / chunks * 1e3
        results["rps_direct"] = await throughput(direct, small, args.concurrency, args.seconds)
        results["rps_floor"] = await throughput(floor, small, args.concurrency, args.seconds)
        results["rps_proxy"] = await throughput(proxied, small, args.concurrency, args.seconds)
        results["rps_ratio"] = results["rps_proxy"] / results["rps_direct"]
        results["rps_ratio_to_floor"] = results["rps_proxy"] / results["rps_floor"]
    finally:
        for process in (proxy, *([other] if other else []), floor_proxy, engine):
            process.terminate()
            process.wait(10)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=400, help="sequential requests per latency case and side")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each throughput run")
    parser.add_argument("--chunks", type=int, default=500, help="chunks per streamed reply")
    parser.add_argument("--stream-runs", type=int, default=40, help="streams per side (CPU is read in 10 ms ticks)")
    parser.add_argument("--json", action="store_true", help="print raw results as JSON")
    parser.add_argument("--against", type=Path, help="another checkout whose toolpair runs as a fourth side")
    parser.add_argument("--serve-floor", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor(args.serve_floor, args.port)
        return
    r = asyncio.run(run(args))
    if args.json:
        print(orjson.dumps(r, option=orjson.OPT_INDENT_2).decode())
        return
    print(
        f"{'case (median ms)':<24}{'direct':>8}{'floor':>8}{'toolpair':>9}{'floor +':>9}{'toolpair +':>11}"
        f"{'x floor':>9}{'cpu floor':>10}{'cpu tp':>8}{'x floor':>9}"
    )
    for name, key in (
        (f"small chat ({r['small_bytes'] / 1e3:.1f} KB)", "small"),
        (f"large reorder ({r['large_bytes'] / 1e3:.0f} KB)", "large_reorder"),
        (f"stream ({r['stream_chunks']} chunks)", "stream"),
    ):
        c = r[key]
        print(
            f"{name:<24}{c['direct_median_ms']:>8.3f}{c['floor_median_ms']:>8.3f}{c['proxy_median_ms']:>9.3f}"
            f"{c['floor_added_median_ms']:>9.3f}{c['added_median_ms']:>11.3f}{c['ratio_to_floor']:>8.2f}x"
            f"{c['floor_cpu_ms']:>10.3f}{c['proxy_cpu_ms']:>8.3f}{c['cpu_ratio_to_floor']:>8.2f}x"
        )
        if r["against"]:
            print(
                f"{'  against ' + r['against']:<24}{'':>25}{c['against_added_median_ms']:>20.3f}"
                f"{c['against_ratio_to_floor']:>8.2f}x{'':>10}{c['against_proxy_cpu_ms']:>8.3f}"
                f"{c['against_cpu_ratio_to_floor']:>8.2f}x"
            )
    print("target: toolpair's added time at most 1.15x the floor's (x floor)")
    for name, key in (("small", "small"), ("large reorder", "large_reorder")):
        print(f"{name + ': toolpair added p99 ms':<38}{r[key]['added_p99_ms']:>9.3f}")
    print(
        f"{'stream relay us/chunk, floor':<38}{r['floor_relay_us_per_chunk']:>9.1f}"
        f"{'toolpair':>10}{r['relay_us_per_chunk']:>8.1f}"
    )
    print(
        f"{'req/s at concurrency 32, direct':<38}{r['rps_direct']:>9.0f}  floor {r['rps_floor']:.0f}"
        f"  toolpair {r['rps_proxy']:.0f} ({r['rps_ratio'] * 100:.0f}% of direct, "
        f"{r['rps_ratio_to_floor'] * 100:.0f}% of floor)"
    )


if __name__ == "__main__":
    main()
