"""`toolpair serve --parallel 2` as a real process: two llama-cpp-python engines with the bundled model.

One server is shared by the module; its tests run in file order (the last one kills an
engine). Waits are for conditions (a status, a count), never fixed sleeps. Which engine
served a request is read from /toolpair/status, which counts the requests given to each.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine_launcher.supervise.launch import free_port
from tests.support.serve import children, cmdline, launch_serve, long_bias, ready_status, until_queue, wait_ready

STORY = [{"role": "user", "content": "Tell me a story."}]


@dataclass
class Parallel:
    url: str
    pid: int
    stdout: Path
    stderr: Path

    async def engines(self) -> dict[str, dict[str, Any]]:
        """Each engine's state, restarts, requests served and port, by name."""
        async with aiohttp.ClientSession() as session, session.get(self.url + "/toolpair/status") as response:
            status = await response.json()
        return {engine["name"]: engine for engine in status["engine"]["engines"]}

    async def served(self) -> dict[str, int]:
        return {name: engine["served"] for name, engine in (await self.engines()).items()}


@pytest.fixture(scope="module")
def parallel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Parallel]:
    tmp = tmp_path_factory.mktemp("parallel")
    port = free_port()
    process, out, err = launch_serve(
        tmp, "--port", str(port), "--parallel", "2", TOOLPAIR_ENGINE_CTX_SIZE="4096", TOOLPAIR_MAX_QUEUE="1"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url, process))
        # /ready answers once one engine is; these tests want both.
        asyncio.run(_both_ready(url))
    except BaseException:
        process.kill()
        raise AssertionError(f"serve --parallel 2 failed:\n{err.read_text()[-4000:]}") from None
    yield Parallel(url, process.pid, out, err)
    engines = [p for p in children(process.pid) if "llama_cpp.server" in cmdline(p)]
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    assert not any(Path(f"/proc/{pid}/cmdline").exists() for pid in engines)


async def _both_ready(url: str, within: float = 180) -> None:
    async with asyncio.timeout(within):
        while True:
            status, body = await ready_status(url)
            if status == 200 and all(e["state"] == "ready" for e in body["engine"]["engines"]):
                return
            await asyncio.sleep(0.1)


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="any", max_retries=0, timeout=300)


async def test_two_engines_each_on_its_own_port_and_the_banner_states_the_memory_cost(parallel: Parallel) -> None:
    engines = await parallel.engines()
    assert sorted(engines) == ["engine-0", "engine-1"]
    assert engines["engine-0"]["port"] != engines["engine-1"]["port"]
    banner = parallel.stdout.read_text()
    assert "engines: 2" in banner and "memory:         2 engines x ~" in banner, banner
    async with aiohttp.ClientSession() as session:
        for engine in engines.values():  # loopback only, and each engine wants its own key
            async with session.get(f"http://127.0.0.1:{engine['port']}/v1/models") as response:
                assert response.status == 401
        async with session.get(parallel.url + "/metrics") as response:
            metrics = await response.text()
    for name in engines:
        assert f'toolpair_engine_instance_state{{engine="{name}",state="ready"}} 1.0' in metrics


async def _timed_stream(api: AsyncOpenAI, bias: dict[str, int], started: float) -> tuple[float, float, str | None]:
    """(seconds to the first token, seconds to the end, finish reason), from ``started``."""
    stream = await api.chat.completions.create(
        model="any", messages=STORY, temperature=0, max_tokens=48, logit_bias=bias, stream=True
    )
    first = finish = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.monotonic() - started
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert first is not None
    return first, time.monotonic() - started, finish


async def test_two_concurrent_streams_both_get_their_first_token_before_either_finishes(parallel: Parallel) -> None:
    bias = await long_bias(parallel.url)
    before = await parallel.served()
    async with client(parallel.url) as api:
        started = time.monotonic()
        one, two = await asyncio.gather(_timed_stream(api, bias, started), _timed_stream(api, bias, started))
    after = await parallel.served()
    assert one[2] == two[2] == "length"  # both wrote all 48 tokens
    assert max(one[0], two[0]) < min(one[1], two[1]), (one, two)
    assert {name: after[name] - before[name] for name in after} == {"engine-0": 1, "engine-1": 1}
    print(
        f"\n--parallel 2, two concurrent 48-token streams: first tokens at {one[0]:.2f}s and {two[0]:.2f}s, "
        f"finished at {one[1]:.2f}s and {two[1]:.2f}s"
    )


def conversation(system: str, first: str, *later: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for text in later:
        messages += [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": text}]
    return messages


async def test_a_conversations_follow_up_goes_to_the_engine_that_served_it(parallel: Parallel) -> None:
    async def turn(messages: list[dict[str, str]]) -> str:
        before = await parallel.served()
        async with client(parallel.url) as api:
            await api.chat.completions.create(model="any", messages=messages, max_tokens=2, temperature=0)  # type: ignore[arg-type]
        after = await parallel.served()
        (engine,) = [name for name in after if after[name] != before[name]]
        return engine

    first_a = await turn(conversation("You help with cooking.", "How do I boil an egg?"))
    first_b = await turn(conversation("You help with gardening.", "When do I plant tulips?"))
    assert first_a != first_b  # a fresh conversation takes the engine used longest ago
    # B again: the engine used longest ago is now A's, but B's prompt is cached on its own engine.
    assert await turn(conversation("You help with gardening.", "When do I plant tulips?", "And roses?")) == first_b
    assert await turn(conversation("You help with cooking.", "How do I boil an egg?", "And fry one?")) == first_a


async def test_the_queue_covers_both_engines(parallel: Parallel) -> None:
    bias = await long_bias(parallel.url)
    async with client(parallel.url) as api, aiohttp.ClientSession() as session:
        running = []
        for _ in range(2):  # one long stream on each engine
            stream = await api.chat.completions.create(
                model="any", messages=STORY, temperature=0, max_tokens=400, logit_bias=bias, stream=True
            )
            await stream.__anext__()
            running.append(stream)
        waiting = asyncio.create_task(api.chat.completions.create(model="any", messages=STORY, max_tokens=2))
        await until_queue(parallel.url, 1)  # max_queue 1: full
        async with session.post(
            parallel.url + "/v1/chat/completions", json={"model": "any", "messages": STORY, "max_tokens": 2}
        ) as refused:
            assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
        await running[0].close()  # one engine frees up: the waiting request gets it
        assert (await waiting).choices[0].finish_reason in ("length", "stop")
        await running[1].close()


async def test_a_killed_engine_restarts_while_the_other_keeps_serving(parallel: Parallel) -> None:
    engines = await parallel.engines()
    port = str(engines["engine-0"]["port"])
    victims = [
        pid
        for pid in children(parallel.pid)
        if (argv := cmdline(pid)) and "--port" in argv and argv[argv.index("--port") + 1] == port
    ]
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    killed = time.monotonic()
    async with asyncio.timeout(30):
        while True:  # the supervisor has seen the exit: engine-0 is restarting
            if (await parallel.engines())["engine-0"]["state"] != "ready":
                break
            await asyncio.sleep(0.02)
    # While engine-0 restarts, every request is answered, by engine-1. (A request is counted
    # only when engine-0 was down both before it and after it.)
    during: list[str] = []
    async with client(parallel.url) as api:
        for attempt in range(100):
            before = await parallel.engines()
            if before["engine-0"]["state"] == "ready":
                break
            reply = await api.chat.completions.create(
                model="any", messages=[{"role": "user", "content": f"Say {attempt}."}], max_tokens=2, temperature=0
            )
            assert reply.choices[0].finish_reason in ("length", "stop")
            after = await parallel.engines()
            if after["engine-0"]["state"] != "ready":
                (engine,) = [name for name in after if after[name]["served"] != before[name]["served"]]
                during.append(engine)
    assert during and set(during) == {"engine-1"}, during
    async with asyncio.timeout(180):
        while True:
            engine = (await parallel.engines())["engine-0"]
            if engine["state"] == "ready" and engine["restarts"] == 1:
                break
            await asyncio.sleep(0.05)
    back = time.monotonic() - killed
    print(f"\n--parallel 2: engine-0 SIGKILLed, back in {back:.2f}s; engine-1 served {len(during)} requests meanwhile")
    assert (await parallel.engines())["engine-1"]["restarts"] == 0
