"""``toolpair proxy --upstream URL`` started before its engine: it listens at once, and finds llama-server later.

The real CLI as a user runs it, a port where nothing listens yet, then the real llama-server started on
that port; then llama-server goes away and another engine (the mock, a generic one) comes up there:
toolpair finds that too, and says so in its log.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.supervise.launch import free_port
from engine_launcher.supervise.process import die_with_parent
from tests.reliability.processes import ROOT, Process
from tests.sidecar.llama_server import llama_server_binary, skip_unless_built, start_llama_server, start_sidecar
from tests.sidecar.test_llama_server_sidecar import Answer, send

BINARY = llama_server_binary()
pytestmark = skip_unless_built(BINARY)

HELLO = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "Say hi."}]}


def _wait_ready(url: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    status = 0
    while time.monotonic() < deadline:
        status = _status(url + "/ready")
        if status == 200:
            return status
        time.sleep(0.2)
    return status


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def post(url: str, path: str, body: Any) -> Answer:
    return asyncio.run(send(url, path, body))


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in reversed(started):
        process.stop()


def test_toolpair_listens_before_llama_server_and_finds_it_then_finds_the_next_engine(
    tmp_path: Path, processes: list[Process]
) -> None:
    assert BINARY is not None
    port = free_port()
    upstream = f"http://127.0.0.1:{port}"
    began = time.monotonic()
    toolpair = start_sidecar(tmp_path, upstream, ready=False)
    processes.append(toolpair)
    listening = time.monotonic() - began  # Python's start-up included; the wait for the engine was 60 s before
    assert listening < 5, listening  # 0.6 s measured (mostly Python start-up)
    assert "engine:         not known yet" in toolpair.log.read_text()
    assert _status(toolpair.url + "/ready") == 503
    refused = post(toolpair.url, "/v1/messages", HELLO)
    assert refused.status == 503, refused.body
    error = refused.json()
    assert error["type"] == "error" and "is not reachable yet" in error["error"]["message"], error

    engine = start_llama_server(BINARY, tmp_path, port=port)
    processes.append(engine)
    assert _wait_ready(toolpair.url, 10) == 200
    log = toolpair.log.read_text()
    assert "does not answer yet" in log and "engine found at " in log, log
    assert 'engine:         llama-server (detected: /health answered with "Server: llama.cpp"' in log, log
    answered = post(toolpair.url, "/v1/messages", HELLO)
    assert answered.status == 200 and answered.json()["type"] == "message", answered.body

    engine.stop()  # llama-server goes; a generic engine comes up on its port
    mock = subprocess.Popen(
        [sys.executable, "-m", "tests.mock_engine", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent(),
    )
    processes.append(Process(mock, upstream, tmp_path / "mock.log"))
    deadline = time.monotonic() + 20  # the watch checks /health every 5 s
    while time.monotonic() < deadline and "engine found again" not in toolpair.log.read_text():
        time.sleep(0.2)
    log = toolpair.log.read_text()
    assert "engine found again at " in log and "engine:         generic (not llama-server" in log, log
    assert "/v1/messages:   translated to Chat Completions" in log.split("engine found again")[-1]
    assert _wait_ready(toolpair.url, 5) == 200
    translated = post(toolpair.url, "/v1/messages", HELLO)
    assert translated.status == 200 and translated.json()["type"] == "message", translated.body
