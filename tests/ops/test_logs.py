"""Request ids, access lines, JSON logs, and secrets kept out of every log line."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from engine_launcher.supervise.launch import free_port
from proxy.config import ConfigError
from proxy.ops.logs import log_handler, setup_logging
from tests.conftest import Stack
from tests.mock_engine import MockEngine, breaks_off
from tests.support.conversations import TWO_CALLS, tool_result
from tests.support.logs import captured_logs
from tests.support.proxies import MakeProxy

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "PROMPT-SECRET-7c1e the user's private words"


def chat(**extra: Any) -> bytes:
    messages = [
        {"role": "user", "content": PROMPT},
        TWO_CALLS,
        tool_result("call_b", "RESULT-SECRET-b"),
        tool_result("call_a", "RESULT-SECRET-a"),
    ]
    return orjson.dumps({"model": "m", "messages": messages, **extra})


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """toolpair's own JSON handler on the root logger, at debug level, for one test."""
    with captured_logs("json", logging.DEBUG) as stream:
        yield stream


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = [orjson.loads(line) for line in lines]  # every line must be one JSON object
    assert all(isinstance(p, dict) for p in parsed)
    return parsed


def access_lines(text: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(text) if line["logger"] == "toolpair.access"]


async def request(url: str, path: str = "/v1/chat/completions", **kw: Any) -> tuple[int, bytes, Any]:
    method = kw.pop("method", "POST")
    async with aiohttp.ClientSession() as session, session.request(method, url + path, **kw) as response:
        return response.status, await response.read(), response.headers


# -- request ids


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("req-42", True),
        ("0af7651916cd43dd8448eb211c80319c", True),
        ("trace:abc.def/ghi+jk=", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("has space", False),
        ('quote"s', False),
        ("", False),
        ("ünïcode", False),
        (None, False),
    ],
)
async def test_request_id_round_trip(stack: Stack, captured: io.StringIO, sent: str | None, kept: bool) -> None:
    headers = {} if sent is None else {"X-Request-ID": sent}
    status, _, response_headers = await request(stack.url, data=chat(), headers=headers)
    assert status == 200
    rid = response_headers["X-Request-ID"]
    if kept:
        assert rid == sent
    else:
        assert rid != sent and len(rid) == 32 and int(rid, 16) >= 0
    assert stack.engine.last.headers["X-Request-ID"] == rid  # the engine's logs can be joined on it
    (line,) = access_lines(captured.getvalue())
    assert line["request_id"] == rid


@pytest.mark.parametrize(
    ("path", "method", "body"),
    [
        ("/v1/chat/completions", "POST", chat(stream=True)),
        ("/v1/models", "GET", None),
        ("/metrics", "GET", None),
        ("/toolpair/status", "GET", None),
        ("/v1/chat/completions", "POST", b"not json"),
    ],
    ids=["stream", "passthrough", "metrics", "status", "bad-request"],
)
async def test_every_kind_of_response_carries_the_request_id(
    stack: Stack, path: str, method: str, body: bytes | None
) -> None:
    _, _, headers = await request(stack.url, path, method=method, data=body, headers={"X-Request-ID": "rid-1"})
    assert headers["X-Request-ID"] == "rid-1"


async def test_an_uncounted_read_of_the_engines_state_is_still_logged_with_its_request_id(
    stack: Stack, captured: io.StringIO
) -> None:
    status, _, headers = await request(stack.url, "/props", method="GET", headers={"X-Request-ID": "rid-props"})
    assert status == 200 and headers["X-Request-ID"] == "rid-props"
    (line,) = access_lines(captured.getvalue())
    assert (line["method"], line["path"], line["request_id"]) == ("GET", "/props", "rid-props")


async def test_refused_request_carries_the_request_id_and_is_logged(
    engine: MockEngine, captured: io.StringIO, make_proxy: MakeProxy
) -> None:
    async with make_proxy.running(api_keys=["KEY-SECRET-1"]) as (url, _):
        status, _, headers = await request(url, "/v1/messages", data=b"{}", headers={"x-api-key": "WRONG-SECRET-9"})
    assert status == 401 and headers["X-Request-ID"]
    (line,) = access_lines(captured.getvalue())
    assert line["status"] == 401 and line["request_id"] == headers["X-Request-ID"]
    assert "WRONG-SECRET-9" not in captured.getvalue() and "KEY-SECRET-1" not in captured.getvalue()


# -- access lines


async def test_one_access_line_per_request_with_what_ordering_did(stack: Stack, captured: io.StringIO) -> None:
    await request(stack.url, data=chat())
    await request(stack.url, "/v1/models?limit=5", method="GET")
    chat_line, models_line = access_lines(captured.getvalue())
    assert chat_line["method"] == "POST" and chat_line["path"] == "/v1/chat/completions"
    assert chat_line["route"] == "/v1/chat/completions" and chat_line["status"] == 200
    assert chat_line["runs_reordered"] == 1 and chat_line["runs_kept"] == {}
    assert chat_line["duration_ms"] >= chat_line["upstream_ttfb_ms"] > 0
    assert chat_line["prompt_tokens"] == 5 and chat_line["completion_tokens"] == 1
    assert chat_line["level"] == "info" and chat_line["message"].startswith("POST /v1/chat/completions 200 ")
    assert models_line["route"] == "passthrough" and models_line["path"] == "/v1/models"  # no query string
    assert models_line["runs_reordered"] == 0


async def test_probe_and_metrics_lines_are_debug_only(stack: Stack, captured: io.StringIO) -> None:
    await request(stack.url, "/metrics", method="GET")
    await request(stack.url, "/health", method="GET")
    assert [line["level"] for line in access_lines(captured.getvalue())] == ["debug", "debug"]


async def test_log_lines_inside_a_request_carry_its_id(stack: Stack, captured: io.StringIO) -> None:
    stack.engine.then(breaks_off(b'data: {"half": '))
    await request(stack.url, data=chat(stream=True), headers={"X-Request-ID": "rid-broken"})
    warnings = [line for line in json_lines(captured.getvalue()) if line["level"] == "warning"]
    assert warnings and all(line["request_id"] == "rid-broken" for line in warnings)


def test_text_format() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    first = setup_logging("info", "text", stream)
    try:
        logging.getLogger("toolpair.access").info(
            "GET /x 200 1.0ms",
            extra={
                "fields": {"method": "GET", "route": "r", "runs_kept": {"unknown_id": 1}, "upstream_ttfb_ms": None},
                "summarized": ("method",),
                "request_id": "rid",
            },
        )
        second = setup_logging("info", "text", stream)
        assert first not in root.handlers and second in root.handlers  # replaced, so no line is written twice
        logging.getLogger("toolpair").info("second")
    finally:
        root.removeHandler(second)
        root.setLevel(level)
    line_one, line_two = stream.getvalue().splitlines()
    assert line_one.endswith("INFO toolpair.access: GET /x 200 1.0ms [rid] route=r runs_kept=unknown_id:1")
    assert line_two.endswith("INFO toolpair: second")


def test_unknown_log_format_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log_format"):
        log_handler("xml")


async def test_bodies_are_logged_only_when_asked(
    engine: MockEngine, captured: io.StringIO, make_proxy: MakeProxy
) -> None:
    for log_bodies in (False, True):
        async with make_proxy.running(log_bodies=log_bodies) as (url, _):
            await request(url, data=chat())
        text = captured.getvalue()
        bodies = [line for line in json_lines(text) if line["logger"] == "toolpair.body"]
        if not log_bodies:
            assert bodies == [] and "PROMPT-SECRET" not in text and "RESULT-SECRET" not in text
    sent, received = bodies
    assert "PROMPT-SECRET-7c1e" in sent["message"] and sent["message"].startswith("to engine: ")
    assert sent["message"].index("RESULT-SECRET-a") < sent["message"].index("RESULT-SECRET-b")  # as reordered
    assert received["message"].startswith("from engine: ") and '"content":"ok"' in received["message"]


# -- the real command: JSON lines on stderr, no secret anywhere


def read(path: Path) -> str:
    return path.read_text()


async def run_toolpair(args: list[str], env: dict[str, str], log: Path, requests: Any) -> str:
    """Run ``toolpair proxy`` as a real process, drive it with ``requests(url)``, stop it, return its output."""
    port = free_port()
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *["-m", "proxy", "proxy", "--port", str(port), *args],
            cwd=ROOT,
            env={"PATH": os.environ.get("PATH", "/usr/bin"), **env},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if process.returncode is not None:
                raise AssertionError(f"toolpair exited early:\n{read(log)}")
            try:
                async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
        await requests(url)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
    return read(log)


SECRETS = {
    "TOOLPAIR_API_KEYS": "CLIENT-KEY-SECRET-a1,CLIENT-KEY-SECRET-b2",
    "TOOLPAIR_UPSTREAM_API_KEY": "UPSTREAM-KEY-SECRET-c3",
}


async def test_cli_json_logs_parse_and_hold_no_secret(engine: MockEngine, tmp_path: Path) -> None:
    async def drive(url: str) -> None:
        ok = {"Authorization": "Bearer CLIENT-KEY-SECRET-a1", "X-Request-ID": "rid-ok"}
        assert (await request(url, data=chat(), headers=ok))[0] == 200
        stream_headers = {"x-api-key": "CLIENT-KEY-SECRET-b2", "X-Request-ID": "rid-stream"}
        assert (await request(url, data=chat(stream=True), headers=stream_headers))[0] == 200
        wrong = {"x-api-key": "WRONG-KEY-SECRET-d4", "X-Request-ID": "rid-wrong"}
        assert (await request(url, "/v1/messages", data=b"{}", headers=wrong))[0] == 401
        query = {"x-api-key": "CLIENT-KEY-SECRET-b2", "X-Request-ID": "rid-query"}
        assert (await request(url, "/v1/models?api_key=QUERY-SECRET-e5", method="GET", headers=query))[0] == 200

    output = await run_toolpair(
        ["--upstream", engine.url, "--log-format", "json", "--log-level", "debug"], SECRETS, tmp_path / "log", drive
    )
    lines = json_lines(output)
    access = {line["request_id"]: line for line in lines if line["logger"] == "toolpair.access"}
    assert access["rid-ok"]["status"] == 200 and access["rid-ok"]["runs_reordered"] == 1
    assert access["rid-stream"]["status"] == 200
    assert access["rid-wrong"]["status"] == 401 and access["rid-wrong"]["route"] == "/v1/messages"
    assert access["rid-query"]["path"] == "/v1/models"
    assert any("listening on" in line["message"] for line in lines)
    # the engine did get the prompt, with toolpair's upstream key in place of the client's
    (first, *_) = [r for r in engine.received if r.path == "/v1/chat/completions"]  # after the start-up probes
    assert PROMPT in first.body.decode()
    assert first.headers["Authorization"] == "Bearer UPSTREAM-KEY-SECRET-c3"
    for secret in ("CLIENT-KEY-SECRET", "UPSTREAM-KEY-SECRET", "WRONG-KEY-SECRET", "QUERY-SECRET", "PROMPT-SECRET"):
        assert secret not in output, secret
    assert "RESULT-SECRET" not in output


async def test_cli_warns_when_exposed_without_keys(engine: MockEngine, tmp_path: Path) -> None:
    async def nothing(url: str) -> None:
        return None

    output = await run_toolpair(["--upstream", engine.url, "--host", "0.0.0.0"], {}, tmp_path / "log", nothing)
    assert "WARNING toolpair: toolpair listens on 0.0.0.0, beyond loopback, and asks for no API key" in output


async def test_cli_key_file_flag(engine: MockEngine, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("FILE-KEY-SECRET-f6\n")

    async def drive(url: str) -> None:
        assert (await request(url, "/v1/models", method="GET"))[0] == 401
        assert (await request(url, "/v1/models", method="GET", headers={"x-api-key": "FILE-KEY-SECRET-f6"}))[0] == 200

    output = await run_toolpair(
        ["--upstream", engine.url, "--api-keys-file", str(keys), "--host", "0.0.0.0"], {}, tmp_path / "log", drive
    )
    assert "beyond loopback" not in output and "FILE-KEY-SECRET" not in output
