"""A pytest plugin for llama.cpp's server test suite (tools/server/tests): toolpair between the tests and llama-server.

Loaded with ``-p toolpair_interpose`` (this folder on ``PYTHONPATH``) by ``scripts/llama_server_suite_check.py``,
which runs the suite twice, once straight at llama-server and once through toolpair, and compares outcomes.

The suite starts its server through ``utils.ServerProcess.start`` and talks to ``server_host:server_port``.
With ``TOOLPAIR_SUITE_PROXY`` set (the ``toolpair`` command), :func:`_start` starts llama-server as the suite
would but on a free loopback port, then ``toolpair proxy --upstream`` it on the address and port the tests
talk to, and returns once toolpair's ``/ready`` says it found the engine. Everything else in the suite is
left as it is: its requests, its assertions, its own checks of llama-server's answers.

In both runs, with ``TOOLPAIR_SUITE_MODEL`` set (a local GGUF), every server the suite starts from a model
hub repository serves that file instead, since no hub is reachable here; and the suite's session-wide
model download (``ServerPreset.load_all``) is skipped. ``TOOLPAIR_SUITE_LOGS`` is where toolpair's logs go.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

PROXY = "TOOLPAIR_SUITE_PROXY"
MODEL = "TOOLPAIR_SUITE_MODEL"
LOGS = "TOOLPAIR_SUITE_LOGS"
READY_SECONDS = 60.0


def pytest_configure(config: pytest.Config) -> None:
    sys.path.insert(0, str(config.rootpath))  # where the suite's utils.py is, as its conftest imports it
    import utils  # type: ignore[import-not-found]

    server_class = utils.ServerProcess
    start, stop = server_class.start, server_class.stop
    model = os.environ.get(MODEL)
    proxy = os.environ.get(PROXY)

    def interposed_start(server: Any, *args: Any, **kwargs: Any) -> None:
        if model:
            _local_model(server, model)
        if not proxy:
            start(server, *args, **kwargs)
            return
        host, port = server.server_host, server.server_port
        server.server_host, server.server_port = "127.0.0.1", _free_port()
        try:
            start(server, *args, **kwargs)
            engine = f"http://127.0.0.1:{server.server_port}"
        finally:
            server.server_host, server.server_port = host, port
        server.toolpair = _start_toolpair(shlex.split(proxy), engine, host, port)

    def interposed_stop(server: Any) -> None:
        front = getattr(server, "toolpair", None)
        if front is not None:
            server.toolpair = None
            _stop(front)
        stop(server)

    server_class.start = interposed_start
    server_class.stop = interposed_stop
    if model:
        utils.ServerPreset.load_all = staticmethod(lambda: None)


def _local_model(server: Any, model: str) -> None:
    """``server`` serves ``model`` where it would have fetched one from a hub repository."""
    if server.model_hf_repo or server.model_url:
        server.model_file = model
        server.model_hf_repo = server.model_hf_file = server.model_url = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_toolpair(command: list[str], engine: str, host: str, port: int) -> subprocess.Popen[bytes]:
    logs = Path(os.environ.get(LOGS) or ".")
    logs.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPAIR_")}
    argv = [*command, "proxy", "--upstream", engine, "--host", host, "--port", str(port)]
    log = logs / f"toolpair-{port}-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    ready = f"http://{_loopback(host)}:{port}/ready"
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(ready, timeout=2) as answer:
                if answer.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"toolpair did not get ready: {' '.join(argv)}\n{log.read_text(errors='replace')[-3000:]}")


def _loopback(host: str) -> str:
    """An address of ``host`` (one address or a comma-separated list) to reach it from here."""
    first = host.split(",")[0].strip()
    if first in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{first}]" if ":" in first else first


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
