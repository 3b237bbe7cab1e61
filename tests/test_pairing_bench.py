"""bench/pairing.py's machinery: on the mock engine playing a position-pairing model, and on the real engine.

The bundled 270M model cannot answer these questions (it gets a few right even in call order), so the
real-engine test checks the run, not the model: every request answered, every condition measured, the
shuffled requests through toolpair reordered. The mock engine answers the way a model behind a
position-only template does: the k-th call gets the k-th result. Then the accuracies are known in advance
from the cases alone, and the benchmark must report exactly them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.mock_engine import MockEngine, Received, completion
from tests.real_engine import RealEngine
from tests.support.proxies import MakeProxy
from tests.support.serve import start_serve

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_pairing", ROOT / "bench" / "pairing.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _bench()


def position_model_answer(body: dict[str, Any]) -> str:
    """What a model reads off a position-only prompt: the asked-for call's position picks the result."""
    messages = body["messages"]
    asked = messages[0]["content"].split("tell me the reading of ")[1].split(".")[0]
    calls = messages[1]["tool_calls"]
    position = [json.loads(c["function"]["arguments"])["meter"] for c in calls].index(asked)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    return f"The reading is {results[position]}."


async def position_model(request: web.Request, received: Received) -> web.StreamResponse:
    reply = completion(position_model_answer(received.json()))
    return web.json_response(reply, dumps=lambda v: orjson.dumps(v).decode())


def rows_by(result: Any) -> dict[tuple[Any, str], tuple[int, int]]:
    return {(r["shape"], r["condition"]): (r["right"], r["total"]) for r in bench.summary(result)}


async def test_the_benchmark_scores_a_position_model_as_it_must_be_scored(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    cases = bench.make_cases([2, 3, 4], 6, random.Random(5))
    for _ in range(len(cases) * len(bench.CONDITIONS)):
        engine.then(position_model)
    toolpair = await make_proxy()
    result = await bench.run(cases, bench.Target(toolpair), bench.Target(engine.url))

    rows = rows_by(result)
    # a shuffled result lands on the asked-for call's position only where the shuffle left it in place
    lucky = sum(c.finish_order[c.target] == c.target for c in cases)
    assert rows["all", "call order, direct"] == (len(cases), len(cases))
    assert rows["all", "finish order, direct"] == (lucky, len(cases))
    assert lucky < len(cases)  # the shuffles do move results
    assert rows["all", "finish order, toolpair"] == (len(cases), len(cases))
    for shape in (2, 3, 4):
        assert rows[shape, "finish order, toolpair"] == (6, 6)
    assert not result.skipped and not any(o.error for o in result.outcomes)
    # the engine got exactly one request per case and condition, and none through toolpair out of order
    assert len(engine.received) == len(cases) * 3
    table = bench.table(result)
    assert "| all | finish order, toolpair | 18/18 | 100% |" in table


async def test_without_an_engine_url_call_order_goes_through_toolpair_and_finish_order_direct_is_not_measured(
    engine: MockEngine, make_proxy: MakeProxy
) -> None:
    cases = bench.make_cases([2], 4, random.Random(9))
    for _ in range(len(cases) * 2):
        engine.then(position_model)
    result = await bench.run(cases, bench.Target(await make_proxy()), None)
    rows = rows_by(result)
    assert rows["all", "call order, direct"] == (4, 4)
    assert rows["all", "finish order, toolpair"] == (4, 4)
    assert ("all", "finish order, direct") not in rows
    assert "finish order, direct" in result.skipped
    assert "not measured" in bench.table(result)


async def test_a_failing_engine_is_counted_as_errors_not_a_crash(engine: MockEngine, make_proxy: MakeProxy) -> None:
    cases = bench.make_cases([2], 2, random.Random(3))
    for _ in range(len(cases) * 3):
        engine.reply_json({"error": {"message": "boom"}}, status=500)
    result = await bench.run(cases, bench.Target(await make_proxy()), bench.Target(engine.url))
    assert all(o.error and "HTTP 500" in o.error and not o.right for o in result.outcomes)
    assert "| all | call order, direct | 0/2 | 0% | 0% - 66% | 2 |" in bench.table(result)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``toolpair serve`` with the bundled model, as its docs tell users to run it."""
    process, url, _, _ = start_serve(tmp_path_factory.mktemp("serve"), "--ctx-size", "4096")
    yield url
    process.terminate()
    process.wait(60)


async def _reordered(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url + "/toolpair/status") as response:
        counters: dict[str, int] = (await response.json())["counters"]
        return counters["runs_reordered"]


async def test_the_benchmark_runs_against_toolpair_serve_and_the_real_engine(
    served: str, real_engine: RealEngine, tmp_path: Path
) -> None:
    """The command line a user runs: toolpair serve, and the same model and template served directly."""
    before = await _reordered(served)
    out = tmp_path / "pairing.json"
    command = [
        sys.executable,
        str(ROOT / "bench" / "pairing.py"),
        "--base-url",
        served,
        "--engine-url",
        real_engine.url,
        "--engine-api-key",
        real_engine.api_key,
        "--cases",
        "1",
        "--shapes",
        "2,4",
        "--max-tokens",
        "8",
        "--concurrency",
        "2",
        "--out",
        str(out),
    ]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for condition in ("call order, direct", "finish order, direct", "finish order, toolpair"):
        assert f"| all | {condition} |" in done.stdout
    report = json.loads(out.read_text())
    assert len(report["outcomes"]) == 2 * 3
    assert all(o["error"] is None and isinstance(o["answer"], str) for o in report["outcomes"])
    assert {row["total"] for row in report["summary"] if row["shape"] == "all"} == {2}
    assert {row["shape"] for row in report["summary"]} == {2, 4, "all"}
    # every shuffled request through toolpair reached the engine in call order
    assert await _reordered(served) - before == 2
