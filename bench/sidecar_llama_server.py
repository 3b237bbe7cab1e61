"""What ``toolpair proxy`` adds in front of a real llama.cpp llama-server, against the floor of one aiohttp hop.

Four processes on loopback: llama-server with the bundled model (built by
``scripts/build_llama_server.sh``), ``toolpair proxy --upstream`` in front of it with no other flags
(so llama-server is detected, as a user gets it), the floor proxy of ``bench/proxy_overhead.py`` (one
pooled aiohttp client, bytes in and out, nothing parsed), and this load generator. Direct, floor and
toolpair requests are interleaved in one run, so the machine's drift hits all three alike.

- added latency per request: a one-token chat reply, whose prompt llama-server has cached, so the
  engine's own time is as small as it gets; toolpair's added median as a ratio to the floor's;
- streamed tokens per second: a reply of ``--tokens`` tokens (``ignore_eos``), through toolpair and
  direct, and their ratio;
- the route plan's cost: a Codex-sized ``/v1/responses`` request that llama-server takes whole (Codex's
  captured request without its hosted and namespace tools and its encrypted reasoning), one token,
  through toolpair on ``auto`` (each request planned, :mod:`proxy.engine.route`: it goes native) and
  through a second toolpair with ``--responses-mode native`` (no plan), interleaved; the difference
  of their added medians and of their CPU time per request is what the plan costs.

Run: ``python bench/sidecar_llama_server.py`` (after ``make llama-server``). A benchmark, not a test:
it prints figures and checks nothing. On a busy machine, compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_overhead import Contest, compare, free_port, start  # noqa: E402
from engine_launcher.builder.models import bundled_model  # noqa: E402


def llama_server() -> str:
    run = subprocess.run(["bash", str(ROOT / "scripts" / "build_llama_server.sh"), "--path"], capture_output=True)
    path = Path(run.stdout.decode().strip())
    if not path.is_file():
        raise SystemExit(f"llama-server is not built ({path}): run `make llama-server` first")
    return str(path)


async def wait_for(session: aiohttp.ClientSession, url: str, seconds: float = 180.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


ONE_TOKEN = orjson.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1, "temperature": 0}
)


async def one_request(session: aiohttp.ClientSession, url: str) -> float:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=ONE_TOKEN) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


async def stream_rate(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, int]:
    """Seconds from the request to the stream's end, and the tokens (content chunks) it carried."""
    started = time.perf_counter()
    tokens = 0
    async with session.post(url + "/v1/chat/completions", data=body) as response:
        assert response.status == 200, response.status
        async for line in response.content:
            if line.startswith(b"data: {") and b'"content":"' in line:
                tokens += 1
    return time.perf_counter() - started, tokens


def codex_whole() -> bytes:
    """Codex's captured request as llama-server's own ``/v1/responses`` takes it whole: one token, not streamed."""
    codex = orjson.loads((ROOT / "tests" / "fixtures" / "codex_0_169_request.json").read_bytes())
    tools = [tool for tool in codex["tools"] if tool["type"] == "function"]
    items = [item for item in codex["input"] if item.get("type") != "reasoning"]
    codex.update(model="m", tools=tools, input=items, stream=False, max_output_tokens=1, temperature=0)
    for dropped in ("include", "reasoning", "prompt_cache_key", "client_metadata", "store"):
        codex.pop(dropped, None)
    return orjson.dumps(codex)


async def one_response(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url + "/v1/responses", data=body) as response:
        await response.read()
        assert response.status == 200, response.status
        route = response.headers.get("X-Toolpair-Route")
        assert route in (None, "native; reason=whole", "native; reason=setting"), route
    return time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    engine_port, proxy_port, floor_port = free_port(), free_port(), free_port()
    native_port = free_port()
    forced = f"http://127.0.0.1:{native_port}"
    direct, proxied = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
    floor = f"http://127.0.0.1:{floor_port}"
    model = str(bundled_model())
    engine = start([
        llama_server(), "-m", model, "--jinja", "--host", "127.0.0.1", "--port", str(engine_port),
        "-c", "4096", "-np", "1", "-t", str(args.threads),
        "--alias", "m",  # the name the requests ask for: they pass as sent (no model-name rewrite)
    ])  # fmt: skip
    floor_script = str(ROOT / "bench" / "proxy_overhead.py")
    floor_proxy = start([sys.executable, floor_script, "--serve-floor", direct, "--port", str(floor_port)])
    proxy = start([
        sys.executable, "-m", "proxy", "proxy", "--upstream", direct, "--port", str(proxy_port),
        "--log-level", "warning",
    ])  # fmt: skip
    native_proxy = start([
        sys.executable, "-m", "proxy", "proxy", "--upstream", direct, "--port", str(native_port),
        "--log-level", "warning", "--responses-mode", "native",
    ])  # fmt: skip
    results: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            await wait_for(session, direct + "/health")
            await wait_for(session, proxied + "/ready")
            await wait_for(session, floor + "/health")
            await wait_for(session, forced + "/ready")
            contest = Contest((direct, floor, proxied), floor_proxy.pid, proxy.pid)

            async def measure(url: str) -> float:
                return await one_request(session, url)

            results["one_token"] = await contest.run(measure, args.n, warmup=5)

            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Tell me a story."}],
                                 "max_tokens": args.tokens, "ignore_eos": True, "temperature": 0,
                                 "stream": True})  # fmt: skip
            rates: dict[str, list[float]] = {"direct": [], "floor": [], "toolpair": []}
            times: dict[str, list[float]] = {"direct": [], "floor": [], "toolpair": []}
            for _ in range(2):  # warm-up
                for url in contest.urls:
                    await stream_rate(session, url, body)
            for round_no in range(args.stream_runs):
                for k in range(3):
                    side = (round_no + k) % 3
                    name = ("direct", "floor", "toolpair")[side]
                    seconds, tokens = await stream_rate(session, contest.urls[side], body)
                    rates[name].append(tokens / seconds)
                    times[name].append(seconds)
            results["stream_tokens"] = args.tokens
            results["stream_tokens_per_s"] = {name: statistics.median(v) for name, v in rates.items()}
            results["stream_rate_ratio"] = (
                results["stream_tokens_per_s"]["toolpair"] / results["stream_tokens_per_s"]["direct"]
            )
            results["stream"] = compare(times["direct"], times["floor"], times["toolpair"])

            codex = codex_whole()
            planned = Contest((direct, floor, proxied, forced), floor_proxy.pid, proxy.pid, native_proxy.pid)

            async def respond(url: str) -> float:
                return await one_response(session, url, codex)

            results["route_plan"] = await planned.run(respond, args.n, warmup=5)
            results["route_plan"]["body_bytes"] = len(codex)
    finally:
        for process in (proxy, native_proxy, floor_proxy, engine):
            process.terminate()
            process.wait(10)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=150, help="one-token requests per side")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per streamed reply")
    parser.add_argument("--stream-runs", type=int, default=8, help="streams per side")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads")
    parser.add_argument("--json", action="store_true", help="print raw results as JSON")
    args = parser.parse_args()
    r = asyncio.run(run(args))
    if args.json:
        print(orjson.dumps(r, option=orjson.OPT_INDENT_2).decode())
        return
    one, stream = r["one_token"], r["stream"]
    ratio = one["ratio_to_floor"]
    ratio_text = f"{ratio:.2f}x" if ratio == ratio else "n/a (the floor's added median is inside the engine's noise)"
    print("toolpair proxy in front of llama-server (bundled Gemma 3 270M), one run, interleaved")
    print(
        f"one-token request: direct {one['direct_median_ms']:.2f} ms, floor +{one['floor_added_median_ms']:.2f} ms, "
        f"toolpair +{one['added_median_ms']:.2f} ms (p99 +{one['added_p99_ms']:.2f} ms); "
        f"added latency ratio to the floor {ratio_text}; "
        f"CPU per request: floor {one['floor_cpu_ms']:.2f} ms, toolpair {one['proxy_cpu_ms']:.2f} ms "
        f"({one['cpu_ratio_to_floor']:.2f}x)"
    )
    rates = r["stream_tokens_per_s"]
    print(
        f"streamed {r['stream_tokens']} tokens: direct {rates['direct']:.1f} tok/s, floor {rates['floor']:.1f} tok/s, "
        f"toolpair {rates['toolpair']:.1f} tok/s (ratio to direct {r['stream_rate_ratio']:.3f}); "
        f"whole stream added: floor +{stream['floor_added_median_ms']:.1f} ms, "
        f"toolpair +{stream['added_median_ms']:.1f} ms"
    )
    plan = r["route_plan"]
    print(
        f"route plan, a Codex-sized /v1/responses request that goes native ({plan['body_bytes']} bytes, one token): "
        f"direct {plan['direct_median_ms']:.2f} ms; toolpair auto (planned) +{plan['added_median_ms']:.2f} ms, "
        f"--responses-mode native (no plan) +{plan['against_added_median_ms']:.2f} ms: the plan "
        f"{plan['added_median_ms'] - plan['against_added_median_ms']:+.2f} ms; CPU per request "
        f"{plan['proxy_cpu_ms']:.2f} ms vs {plan['against_proxy_cpu_ms']:.2f} ms "
        f"({plan['proxy_cpu_ms'] - plan['against_proxy_cpu_ms']:+.2f} ms)"
    )


if __name__ == "__main__":
    main()
