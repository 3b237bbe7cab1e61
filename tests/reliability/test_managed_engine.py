"""The managed engine (``toolpair serve``) under faults, for each API, as a real process tree.

One ``toolpair serve`` (the CPU build, the bundled model) is shared by the module;
its tests run in file order and the last one stops it:

- the engine listens on 127.0.0.1 only, with a random key of its own that is not on
  its command line, and refuses any request without that key;
- SIGKILL of the engine in the middle of a stream, for each API: a clean in-band
  error in the client's dialect, then the supervisor restarts it and the next request
  is served;
- a client that leaves while it waits in the queue frees its place, and its request
  never reaches the engine;
- an engine's own error report quoting a refused request stays out of toolpair's log;
- when toolpair stops (SIGTERM), and when it is killed outright (SIGKILL), no engine
  process is left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine_launcher.supervise.launch import free_port
from proxy.config import Settings
from proxy.serve_plan import plan_serve
from tests.real_engine import bundled_model
from tests.reliability.client import HEADERS, post
from tests.reliability.figures import count, record
from tests.reliability.processes import ROOT
from tests.reliability.streams import check_error_body, check_stream
from tests.reliability.workload import APIS, PATHS, PROMPT_MARK
from tests.support.serve import alive, children, cmdline, launch_serve


def _engine_installed() -> bool:
    try:
        import llama_cpp  # noqa: F401

        bundled_model()
    except Exception:  # pragma: no cover - `make test` installs both
        return False
    return True


pytestmark = pytest.mark.skipif(not _engine_installed(), reason="needs llama-cpp-python and the bundled model")


def environ(pid: int) -> dict[str, str]:
    raw = (Path("/proc") / str(pid) / "environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def listening(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def engine(self) -> int:
        engines = [p for p in children(self.process.pid) if "llama_cpp.server" in cmdline(p)]
        assert len(engines) == 1, engines
        return engines[0]

    def engine_port(self) -> int:
        argv = cmdline(self.engine())
        return int(argv[argv.index("--port") + 1])

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def launch(tmp: Path, **env: str) -> Served:
    port = free_port()
    settings = {"PYTHONPATH": str(ROOT), "TOOLPAIR_ENGINE_CTX_SIZE": "2048", **env}
    process, _, log = launch_serve(tmp, "--port", str(port), **settings)
    return Served(process, f"http://127.0.0.1:{port}", log)


async def wait_ready(served: Served, restarts: int = 0, within: float = 120) -> float:
    started = time.monotonic()
    async with asyncio.timeout(within), aiohttp.ClientSession() as session:
        while True:
            assert served.process.poll() is None, served.text()[-3000:]
            try:
                async with session.get(served.url + "/ready") as response:
                    ready = await response.json()
                    if response.status == 200 and ready["engine"]["restarts"] == restarts:
                        return time.monotonic() - started
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = launch(tmp_path_factory.mktemp("managed"), TOOLPAIR_MAX_QUEUE="2")
    try:
        record("managed_engine", start_to_ready_s=round(asyncio.run(wait_ready(served)), 1))
        yield served
    finally:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()


async def _bias(url: str) -> dict[str, int]:
    """logit_bias banning every way the bundled model ends a turn, so it writes until max_tokens."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/extras/tokenize", json={"input": "<|im_end|>"}) as r,
    ):
        tokens = (await r.json())["tokens"]
    return {str(t): -100 for t in {*tokens, 1, 106}}


def _long(api: str, bias: dict[str, int], tokens: int) -> dict[str, Any]:
    """A streamed request whose answer runs to ``tokens`` tokens."""
    prompt = f"{PROMPT_MARK}: tell me a story."
    if api == "responses":
        # Responses has no logit_bias; its generation is long enough once begun.
        return {"model": "m", "input": prompt, "max_output_tokens": tokens, "stream": True, "store": False}
    request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True}
    request.update(max_tokens=tokens, logit_bias=bias)
    return request


# --- the engine's listener and key -------------------------------------------------------------


async def test_the_engine_listens_on_loopback_only_with_a_random_key_of_its_own(served: Served) -> None:
    engine = served.engine()
    port = served.engine_port()
    assert listening(port) == ["0100007F"]  # 127.0.0.1, and nothing else (no 0.0.0.0, no ::)
    key = environ(engine)["API_KEY"]
    assert len(key) >= 32 and key not in " ".join(cmdline(engine))
    assert key not in served.text()
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {key[:-1]}"}):
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": []}, headers=headers
            ) as response:
                assert response.status == 401, headers
        async with session.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 200  # the key is what opens it
    # Each serve picks a new key.
    keys = {plan_serve(Settings(), check_machine=False).launch.api_key for _ in range(3)}
    assert len(keys) == 3 and key not in keys
    count("managed_engine", "security_checks")


# --- SIGKILL of the engine, for each API ---------------------------------------------------------


async def test_sigkill_of_the_engine_mid_stream_is_a_clean_error_then_it_comes_back(served: Served) -> None:
    bias = await _bias(served.url)
    recovered_in: list[float] = []
    for restarts, api in enumerate(APIS, start=1):
        engine = served.engine()
        async with (
            asyncio.timeout(120),
            aiohttp.ClientSession() as session,
            session.post(served.url + PATHS[api], json=_long(api, bias, 300), headers=HEADERS) as response,
        ):
            assert response.status == 200
            head = await response.content.readany()
            killed = time.monotonic()
            os.kill(engine, signal.SIGKILL)
            raw = head + await response.read()  # the body ends cleanly
        stream = check_stream(api, raw)
        assert stream.outcome == "error" and stream.error is not None, raw[-400:]
        await wait_ready(served, restarts)
        recovered_in.append(time.monotonic() - killed)
        answer = await post(served.url, api, _long(api, bias, 3), deadline=120)
        assert check_stream(api, answer.body).outcome == "complete"
        count("engine_faults", "survived_sigkill_managed_engine")
        count("engine_faults", "cases_survived")
    record("managed_engine", sigkill_to_ready_s=[round(s, 1) for s in recovered_in])


# --- leaving the queue ----------------------------------------------------------------------------


async def test_a_client_that_leaves_the_queue_frees_its_place_for_each_api(served: Served) -> None:
    bias = await _bias(served.url)
    async with aiohttp.ClientSession() as session:
        for api in APIS:
            # A long chat stream holds the engine's only slot (max_concurrency 1); the queue is shared by the APIs.
            running = await session.post(served.url + PATHS["chat"], json=_long("chat", bias, 400), headers=HEADERS)
            await running.content.readany()
            waiting = asyncio.create_task(post(served.url, api, _long(api, bias, 2), deadline=120))
            await _until_waiting(served.url, 1)
            waiting.cancel()  # the client leaves while it waits
            await asyncio.gather(waiting, return_exceptions=True)
            await _until_waiting(served.url, 0)
            # Its place is free: two more can wait (max_queue 2), a third is refused.
            queued = [asyncio.create_task(post(served.url, api, _long(api, bias, 2), deadline=120)) for _ in range(2)]
            await _until_waiting(served.url, 2)
            refused = await post(served.url, api, _long(api, bias, 2))
            assert refused.status == 429 and refused.toolpairs
            check_error_body(api, refused.body)
            running.close()  # the running stream's client leaves too: the queue moves on
            for answer in await asyncio.gather(*queued):
                assert check_stream(api, answer.body).outcome == "complete"
            await _until_waiting(served.url, 0)
            count("vanishing_clients", "managed_queue_cases")


async def _until_waiting(url: str, waiting: int, within: float = 60) -> None:
    async with asyncio.timeout(within), aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + "/ready") as response:
                if (await response.json())["engine"]["queue"]["waiting"] == waiting:
                    return
            await asyncio.sleep(0.02)


# --- the engine's own words stay out of toolpair's log ---------------------------------------------


async def test_an_engine_report_quoting_a_refused_request_stays_out_of_the_log(served: Served) -> None:
    # A function message without a name passes toolpair and fails llama-cpp-python's validation,
    # whose report (printed by the engine, relayed by the supervisor) quotes the whole request.
    request = {"model": "m", "messages": [{"role": "function", "content": f"{PROMPT_MARK} secret"}], "max_tokens": 2}
    answer = await post(served.url, "chat", request)
    assert answer.status == 500 and PROMPT_MARK in answer.body.decode()  # the client sees the engine's answer
    await asyncio.sleep(0.5)  # the engine's output has been relayed
    log = served.text()
    assert "its report of a failed request is left out" in log  # the report happened
    assert PROMPT_MARK not in log, [line for line in log.splitlines() if PROMPT_MARK in line][:3]


# --- nothing left behind ------------------------------------------------------------------------------


async def test_sigterm_leaves_no_engine(served: Served) -> None:
    engine = served.engine()
    served.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(served.process.wait, 60) == 0
    assert not alive(engine)
    count("managed_engine", "stops_without_an_orphan")


async def test_sigkill_of_toolpair_leaves_no_engine(tmp_path: Path) -> None:
    """Killed outright, toolpair cannot stop its engine: the kernel does (PR_SET_PDEATHSIG)."""
    served = launch(tmp_path)
    try:
        await wait_ready(served)
        engine = served.engine()
        served.process.send_signal(signal.SIGKILL)
        served.process.wait()
        async with asyncio.timeout(10):
            while True:
                if not alive(engine):
                    break
                await asyncio.sleep(0.05)
    finally:
        if served.process.poll() is None:
            served.process.kill()
    count("managed_engine", "stops_without_an_orphan")
