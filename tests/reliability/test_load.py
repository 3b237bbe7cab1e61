"""Load: 200 concurrent streaming clients for 30 s, the three APIs mixed, through toolpair to the mock engine.

toolpair and the mock engine each run as their own process (``python -m proxy
proxy --engine-kind llama-cpp-python``, as ``toolpair serve`` configures it), so
toolpair's memory can be read from ``/proc``. The test fails on any error, any
stream that is not complete and well-formed, any request lost, prompt text in the
log, or memory that grows more than 20% from the first 10 s to the last 10 s.
Requests per second and time to first byte are measured and reported, never
asserted: speed is the benchmarks' business, and CI machines are shared.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import aiohttp

from tests.reliability.figures import record
from tests.reliability.processes import rss_kib, running, start_mock_engine, start_toolpair
from tests.reliability.streams import Malformed, check_stream
from tests.reliability.workload import APIS, PATHS, PROMPT_MARK, encoded

CLIENTS = int(os.environ.get("TOOLPAIR_LOAD_CLIENTS", "200"))
SECONDS = float(os.environ.get("TOOLPAIR_LOAD_SECONDS", "30"))
WINDOW = SECONDS / 3  # the first and the last third are compared for memory growth
MAX_GROWTH = 0.20
HEADERS = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}


class Tally:
    def __init__(self) -> None:
        self.sent = {api: 0 for api in APIS}
        self.complete = {api: 0 for api in APIS}
        self.failures: list[str] = []
        self.ttfb: list[float] = []


async def _client(session: aiohttp.ClientSession, url: str, number: int, deadline: float, tally: Tally) -> None:
    serial = number
    while time.monotonic() < deadline:
        api = APIS[serial % len(APIS)]
        tally.sent[api] += 1
        started = time.monotonic()
        first: float | None = None
        raw = bytearray()
        try:
            async with session.post(url + PATHS[api], data=encoded(api, serial), headers=HEADERS) as response:
                async for chunk in response.content.iter_any():
                    if first is None:
                        first = time.monotonic()
                    raw += chunk
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.failures.append(f"{api} #{serial}: {type(exc).__name__}: {exc}")
            serial += CLIENTS
            continue
        try:
            if status != 200:
                raise Malformed(f"status {status}: {bytes(raw[:300])!r}")
            stream = check_stream(api, bytes(raw))
            if stream.outcome != "complete" or "w0" not in stream.text:
                raise Malformed(f"outcome {stream.outcome}, text {stream.text!r}, error {stream.error}")
        except Malformed as exc:
            tally.failures.append(f"{api} #{serial}: {exc}")
        else:
            tally.complete[api] += 1
            tally.ttfb.append((first or time.monotonic()) - started)
        serial += CLIENTS


async def _sample_rss(pid: int, deadline: float, samples: list[tuple[float, int]]) -> None:
    start = time.monotonic()
    while time.monotonic() < deadline:
        samples.append((time.monotonic() - start, rss_kib(pid)))
        await asyncio.sleep(0.25)


def _requests_total(metrics: str) -> dict[str, int]:
    """``toolpair_requests_total`` by status, summed over routes."""
    totals: dict[str, int] = {}
    for match in re.finditer(r"^toolpair_requests_total\{([^}]*)\} ([0-9.e+]+)$", metrics, re.MULTILINE):
        status = re.search(r'status="(\d+)"', match.group(1))
        if status is not None:
            totals[status.group(1)] = totals.get(status.group(1), 0) + int(float(match.group(2)))
    return totals


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def test_200_streaming_clients_for_30_seconds(tmp_path: Path) -> None:
    engine = start_mock_engine(tmp_path, "--words", "8", "--tokenizer")
    toolpair = start_toolpair(
        tmp_path, "proxy", "--upstream", engine.url, "--engine-kind", "llama-cpp-python", "--log-format", "json"
    )
    with running(toolpair, engine):
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=60)
        tally = Tally()
        samples: list[tuple[float, int]] = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            started = time.monotonic()
            deadline = started + SECONDS
            sampler = asyncio.create_task(_sample_rss(toolpair.pid, deadline, samples))
            await asyncio.gather(*(_client(session, toolpair.url, n, deadline, tally) for n in range(CLIENTS)))
            elapsed = time.monotonic() - started
            await sampler
            async with session.get(toolpair.url + "/metrics") as response:
                served = _requests_total(await response.text())
        log = toolpair.tail(size=1 << 30)

    sent, complete = sum(tally.sent.values()), sum(tally.complete.values())
    first = max(rss for at, rss in samples if at < WINDOW)
    last = max(rss for at, rss in samples if at >= SECONDS - WINDOW)
    growth = last / first - 1
    record(
        "load",
        clients=CLIENTS,
        seconds=round(elapsed, 1),
        requests=sent,
        complete=complete,
        by_api=tally.complete,
        lost=sent - complete,
        errors=len(tally.failures),
        requests_per_second=round(complete / elapsed, 1),
        ttfb_p50_ms=round(_percentile(tally.ttfb, 0.50) * 1000, 1),
        ttfb_p99_ms=round(_percentile(tally.ttfb, 0.99) * 1000, 1),
        rss_first_window_mib=round(first / 1024, 1),
        rss_last_window_mib=round(last / 1024, 1),
        rss_growth_percent=round(growth * 100, 1),
        cpus=os.cpu_count(),
    )
    print(f"load: {complete}/{sent} streams complete in {elapsed:.1f}s; RSS {first} -> {last} KiB")

    assert tally.failures == [], f"{len(tally.failures)} failed, first: {tally.failures[:5]}"
    assert complete == sent and min(tally.complete.values()) > 0
    # Every request toolpair answered, it answered 200: none was refused or lost on its side.
    assert served.get("200", 0) >= complete
    assert set(served) == {"200"}, served
    assert growth <= MAX_GROWTH, f"RSS grew {growth:.0%}: {first} KiB in the first {WINDOW:.0f}s, {last} KiB last"
    assert PROMPT_MARK not in log, "prompt text reached the log with log_bodies off"
    assert '"level":"error"' not in log and '"level":"warning"' not in log, log[-3000:]
