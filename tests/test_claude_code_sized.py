"""A Claude Code-sized request through `toolpair serve` on its defaults, to a 200.

Claude Code's system prompt and 14 tools alone are about 13k tokens. `toolpair serve`
started with nothing but a port (the bundled model, the default context) must take such
a request: no "prompt is too long", no API error. The request is the 14-tool fixture
(tests/claude_code_fixture.py), streamed as Claude Code streams, with ``max_tokens``
cut to 16 because only the prompt's size is under test; its evaluation takes a minute
or more on a small CPU, so the wait is long.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import orjson

from engine_launcher.supervise.launch import free_port
from proxy.sse import EventDecoder
from tests.claude_code_fixture import claude_code_request
from tests.support.serve import launch_serve, wait_ready

PROMPT_EVALUATION_LIMIT = 1800.0
"""Seconds the whole request may take: about two minutes on an idle 2-core machine, many times that on a busy one."""


async def test_a_claude_code_sized_request_on_the_defaults_gets_a_whole_answer(tmp_path: Path) -> None:
    port = free_port()
    process, out, err = launch_serve(tmp_path, "--port", str(port))  # defaults: nothing else
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, process, within=300)
        body = {**claude_code_request(stream=True), "max_tokens": 16}
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=PROMPT_EVALUATION_LIMIT)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(
                url + "/v1/messages?beta=true",
                data=orjson.dumps(body),
                headers={"x-api-key": "any", "anthropic-version": "2023-06-01", "content-type": "application/json"},
            ) as response,
        ):
            raw = await response.read()
        took = time.monotonic() - started
        assert response.status == 200, raw[:2000]
        events = [(e.event, orjson.loads(e.data)) for e in EventDecoder().feed(raw)]
        names = [name for name, _ in events]
        assert "error" not in names, [data for name, data in events if name == "error"]
        assert names[0] == "message_start" and names[-1] == "message_stop"
        input_tokens = max(
            data.get("usage", data.get("message", {}).get("usage", {})).get("input_tokens", 0) for _, data in events
        )
        # The fixture is about 13k tokens: far past the old 8192 limit, well inside 32768.
        assert input_tokens > 10_000, input_tokens
        print(f"\nClaude Code-sized request ({input_tokens} prompt tokens) on serve's defaults: 200 in {took:.1f}s")
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 60)
    banner = out.read_text()
    assert "n_ctx 32768" in banner, banner
    assert "Traceback" not in err.read_text()
