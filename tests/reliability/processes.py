"""toolpair and the mock engine as separate processes, the way they run in production.

A separate process is what lets a test read toolpair's memory from
``/proc/<pid>/status`` and kill one side without the other noticing in-process.
Each process gets its own log file in the test's temp dir (read it when a test
fails), runs from the checkout (``python -m proxy``, ``python -m tests.mock_engine``)
and is stopped with SIGTERM, then SIGKILL, by the test that started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine_launcher.supervise.launch import free_port
from engine_launcher.supervise.process import die_with_parent
from tests.mock_engine import MockEngine

__all__ = ["ROOT", "EngineThread", "Process", "rss_kib", "running", "start_mock_engine", "start_toolpair"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Process:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def tail(self, size: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPAIR_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` in KiB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")  # pragma: no cover - Linux always has it


def start_mock_engine(log_dir: Path, *args: str, timeout: float = 30.0) -> Process:
    """``python -m tests.mock_engine --port 0 ARGS``; its first line of output is its URL."""
    log = log_dir / f"mock-engine-{time.monotonic_ns()}.log"
    command = [sys.executable, "-m", "tests.mock_engine", "--port", "0", *args]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        start_new_session=True,
        preexec_fn=die_with_parent(),  # gone with the test run, even a killed one
    )
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline and not line:
        line = process.stdout.readline().strip()
        if process.poll() is not None:
            break
    process.stdout.close()
    if not line.startswith(b"http://"):
        process.kill()
        raise RuntimeError(f"the mock engine did not start: {line!r}\n{log.read_text()[-3000:]}")
    return Process(process, line.decode(), log)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_toolpair(log_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> Process:
    """``python -m proxy ARGS --port P`` on a free port; ready once ``/metrics`` answers."""
    for _ in range(3):  # a free port may be taken by someone else before toolpair binds it
        port = free_port()
        log = log_dir / f"toolpair-{port}.log"
        command = [sys.executable, "-m", "proxy", *args, "--host", "127.0.0.1", "--port", str(port)]
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**_env(), **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            if _answers(url + "/metrics"):
                return Process(process, url, log)
            time.sleep(0.1)
        if process.poll() is None:
            process.kill()
        process.wait()
        if "address already in use" not in log.read_text(errors="replace").lower():
            break
    raise RuntimeError(f"toolpair did not start:\n{log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def running(*processes: Process) -> Iterator[None]:
    """Stop every process on the way out, whatever happened."""
    try:
        yield
    finally:
        for process in processes:
            process.stop()


class EngineThread:
    """A :class:`~tests.mock_engine.MockEngine` on its own event loop in a thread.

    For module-scoped fixtures: each test has its own event loop, but the
    engine (and what it received) must outlive them.
    """

    def __init__(self, engine: MockEngine) -> None:
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mock-engine", daemon=True)

    def start(self) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.engine.start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.engine.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
