"""A real llama.cpp ``llama-server``, a recording hop in front of it, and ``toolpair proxy`` as a user runs it.

The binary is built once per machine by ``scripts/build_llama_server.sh`` (``make test`` runs it);
tests skip, saying so, only when it is absent. The model is the bundled Gemma 3 270M GGUF.

:class:`RecordingHop` is a plain HTTP forwarder between toolpair and llama-server that keeps every
request exactly as it left toolpair (method, path, headers, body) and relays llama-server's answer
unchanged, headers included: what llama-server received, byte for byte, without a mock anywhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiohttp
import pytest
from aiohttp import web

from engine_launcher.builder.models import bundled_model
from engine_launcher.supervise.launch import free_port
from engine_launcher.supervise.process import die_with_parent
from tests.reliability.processes import ROOT, Process

__all__ = [
    "MODEL_ALIAS",
    "RecordingHop",
    "Sent",
    "SidecarStack",
    "TINY_BODIES",
    "llama_server_binary",
    "models_dir",
    "skip_unless_built",
    "start_llama_router",
    "start_llama_server",
    "start_sidecar",
]

BUILD_SCRIPT = ROOT / "scripts" / "build_llama_server.sh"
MODEL_ALIAS = "m"
"""The name llama-server serves the bundled model under in these tests."""


def llama_server_binary() -> Path | None:
    """Where the build script puts llama-server, if it is there."""
    run = subprocess.run(["bash", str(BUILD_SCRIPT), "--path"], capture_output=True, text=True, check=True)
    path = Path(run.stdout.strip())
    return path if path.is_file() and os.access(path, os.X_OK) else None


def skip_unless_built(binary: Path | None) -> pytest.MarkDecorator:
    """The mark for a module that needs llama-server (``binary``): skipped, saying how to build it, where it is not."""
    return pytest.mark.skipif(
        binary is None, reason="llama-server is not built: run scripts/build_llama_server.sh (make test builds it)"
    )


NEEDS_LLAMA_SERVER = skip_unless_built(llama_server_binary())
"""The mark for a module whose tests all run on the built llama-server (through :func:`module_stack`)."""


def _status(url: str, headers: dict[str, str] | None = None) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
        preexec_fn=die_with_parent(),  # gone with the test run, even a killed one
    )


def start_llama_server(
    binary: Path, log_dir: Path, *extra: str, timeout: float = 180.0, port: int | None = None
) -> Process:
    """llama-server with the bundled model and ``--jinja`` on ``port`` (else a free one); ready at ``/health`` 200.

    It serves the model as ``m`` (``--alias``), the name the tests' requests ask for: with one model
    listed, toolpair sends a name the engine does not know as that model (:mod:`proxy.engine.model_names`),
    so a request naming ``m`` reaches it as the client's bytes.
    """
    return _start_engine(binary, log_dir, ["-m", str(bundled_model()), "--alias", MODEL_ALIAS], extra, timeout, port)


def models_dir(where: Path, *names: str) -> Path:
    """A ``--models-dir`` holding the bundled model under each of ``names`` (``NAME.gguf``, symlinks)."""
    where.mkdir(parents=True, exist_ok=True)
    for name in names:
        (where / f"{name}.gguf").symlink_to(bundled_model())
    return where


def start_llama_router(binary: Path, log_dir: Path, models: Path, *extra: str, timeout: float = 180.0) -> Process:
    """llama-server's router (``--models-dir``): no model loaded until a request names one, each in its own child.

    The children take the router's other arguments (``--jinja``, the context, the threads).
    """
    return _start_engine(binary, log_dir, ["--models-dir", str(models)], extra, timeout, None)


def _start_engine(
    binary: Path, log_dir: Path, model: list[str], extra: tuple[str, ...], timeout: float, port: int | None
) -> Process:
    port = port or free_port()
    log = log_dir / f"llama-server-{port}.log"
    command = [str(binary), *model, "--jinja", "--host", "127.0.0.1", "--port", str(port)]
    command += ["-c", "4096", "-np", "2", "-t", "2", *extra]
    return _when_ready(_spawn(command, log), f"http://127.0.0.1:{port}", "/health", log, timeout, "llama-server")


def start_sidecar(
    log_dir: Path, upstream: str, *args: str, env: dict[str, str] | None = None, ready: bool = True
) -> Process:
    """``toolpair proxy --upstream URL`` as a new user runs it (no other flags unless given).

    Returned once ``/ready`` is 200 (the engine found), or with ``ready`` false once ``/health`` is.
    """
    port = free_port()
    log = log_dir / f"toolpair-{port}.log"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPAIR_")}
    base_env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **(env or {}))
    command = [sys.executable, "-m", "proxy", "proxy", "--upstream", upstream, "--port", str(port), *args]
    probe = "/ready" if ready else "/health"
    return _when_ready(_spawn(command, log, base_env), f"http://127.0.0.1:{port}", probe, log, 60, "toolpair")


def _when_ready(
    process: subprocess.Popen[bytes], url: str, probe: str, log: Path, timeout: float, name: str
) -> Process:
    """``process`` once ``url + probe`` answers 200; killed, with the end of its log raised, if it exits first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if _status(url + probe) == 200:
            return Process(process, url, log)
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
    process.wait()
    raise RuntimeError(f"{name} did not start:\n{log.read_text(errors='replace')[-3000:]}")


_HI = [{"role": "user", "content": "Hi"}]
TINY_BODIES = {
    "/v1/chat/completions": {"messages": _HI, "max_tokens": 3, "temperature": 0},
    "/v1/messages": {"messages": _HI, "max_tokens": 3, "temperature": 0},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 3, "temperature": 0},
}
"""The least request of each API: ``Hi``, three tokens of answer."""


class SidecarStack:
    """llama-server started with ``engine_args``, a :class:`RecordingHop` in front of it, and the sidecars that
    :meth:`start_sidecars` puts in front of the hop; stopped in reverse order, also when a start fails.

    A test module subclasses it with what its tests need and holds one for the module (``with``).
    """

    def __init__(self, binary: Path, tmp: Path, *engine_args: str) -> None:
        self.binary, self.tmp = binary, tmp
        self.processes: list[Process] = []
        self.hop: RecordingHop | None = None
        try:
            self.engine = self.keep(self.start_engine(*engine_args))
            self.hop = RecordingHop(self.engine.url)
            self.hop.start()
            self.start_sidecars(self.hop.url)
        except BaseException:
            self.stop()
            raise

    def start_engine(self, *engine_args: str) -> Process:
        """The engine behind the hop: llama-server with ``engine_args`` by default."""
        return start_llama_server(self.binary, self.tmp, *engine_args)

    def start_sidecars(self, upstream: str) -> None:
        """Starts (and :meth:`keep` s) what stands in front of the hop at ``upstream``; nothing by default."""

    def keep(self, process: Process) -> Process:
        """``process``, to be stopped with the stack."""
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        if self.hop is not None:
            self.hop.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def module_stack(stack: type[SidecarStack], name: str, *engine_args: str) -> Any:
    """A module-scoped ``stack`` fixture: one ``stack`` on the built llama-server with ``engine_args``, for all
    of a module's tests (assign it to ``stack`` in the module)."""

    @pytest.fixture(scope="module", name="stack")
    def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarStack]:
        binary = llama_server_binary()
        assert binary is not None
        with stack(binary, tmp_path_factory.mktemp(name), *engine_args) as started:
            yield started

    return running


@dataclass(frozen=True)
class Sent:
    """One request as it reached llama-server."""

    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass
class RecordingHop:
    """Forwards everything to ``upstream`` on its own event loop thread, keeping what it forwarded."""

    upstream: str
    sent: list[Sent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-hop", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self.url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def paths(self) -> list[str]:
        return [s.path_qs for s in self.sent]

    def last(self, path: str) -> Sent:
        return [s for s in self.sent if s.path_qs.split("?")[0] == path][-1]

    async def _start(self) -> str:
        # A new connection per forward: a kept-alive one that llama-server closes just as the next request
        # goes out fails that request in the hop ("Server disconnected"), which is not what the tests test.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=300),
        )
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def _stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        self.sent.append(Sent(request.method, request.path_qs, headers, body))
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None, allow_redirects=False
        ) as answer:
            kept = [(name, value) for name, value in answer.headers.items() if name.lower() not in _HOP]
            if answer.content_length is not None:  # keep the framing too: a sized body stays sized
                whole = web.Response(status=answer.status, reason=answer.reason, body=await answer.read())
                for name, value in kept:
                    whole.headers.add(name, value)
                return whole
            out = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in kept:
                out.headers.add(name, value)
            await out.prepare(request)
            async for chunk in answer.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
