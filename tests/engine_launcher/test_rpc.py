"""llama.cpp RPC: `toolpair serve --rpc` splits the bundled model across two real `toolpair rpc-worker`s.

Everything is real and on loopback: two rpc-server processes (built by
`toolpair engine install` against this engine), `toolpair serve` in front of
the engine that uses them, the OpenAI SDK as the client. The module's tests
run in file order on one served model: it answers with its layers on the
workers; a worker that dies gets the next request a clean error in the API's
shape, and the engine comes back once the worker is started again.
"""

from __future__ import annotations

import asyncio
import io
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from engine_launcher.builder.backends import RPC_FLAG
from engine_launcher.builder.machine import Machine
from engine_launcher.builder.record import EngineRecord, read_record
from engine_launcher.inside.rpc import parse_endpoints, split_endpoint, unreachable
from engine_launcher.supervise.launch import EngineLaunch, engine_command, free_port
from engine_launcher.supervise.process import die_with_parent
from proxy import serve_plan
from proxy.banner import serve_banner
from proxy.cli import main
from proxy.config import ConfigError, Settings
from tests.support.probes import FakeProbes
from tests.support.serve import client, launch_serve, ready_status, wait_ready

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Say hi."}]


# --- decisions made before anything starts ------------------------------------------------------


def test_worker_addresses_are_checked() -> None:
    assert parse_endpoints(["127.0.0.1:5001, 10.0.0.2:5002", "[fd00::1]:5003"]) == (
        "127.0.0.1:5001",
        "10.0.0.2:5002",
        "[fd00::1]:5003",
    )
    assert split_endpoint("[fd00::1]:5003") == ("fd00::1", 5003)
    for bad in ("10.0.0.2", "10.0.0.2:http", "10.0.0.2:0", ":5001", "fd00::1:5003", "h:70000"):
        with pytest.raises(ValueError, match="is not HOST:PORT"):
            parse_endpoints([bad])
    with pytest.raises(ValueError, match="listed twice"):
        parse_endpoints(["h:1,h:1"])


def test_the_engine_starts_through_the_rpc_module_only_with_workers() -> None:
    plain = EngineLaunch(Path("m.gguf"), 1, "k", 8, python="py")
    assert engine_command(plain)[:4] == ["py", "-m", "engine_launcher.inside.engine_main", "llama_cpp.server"]
    assert "--rpc_servers" not in engine_command(plain)
    split = EngineLaunch(Path("m.gguf"), 1, "k", 8, python="py", rpc_servers=("h:1", "h:2"))
    command = engine_command(split)
    assert command[:4] == ["py", "-m", "engine_launcher.inside.engine_main", "engine_launcher.inside.rpc"]
    assert command[-2:] == ["--rpc_servers", "h:1,h:2"]


def _record(cmake_args: list[str]) -> EngineRecord:
    return EngineRecord(
        "cpu", "0.3.36", "w.whl", "0" * 64, True, cmake_args, "/v/bin/rpc-server", rpc=RPC_FLAG in cmake_args
    )


def test_serve_plans_every_layer_onto_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: _record([RPC_FLAG]))
    plan = serve_plan.plan_serve(Settings(engine_rpc=["h:1,h:2"]), out=io.StringIO(), check_machine=False)
    assert plan.launch.rpc_servers == ("h:1", "h:2") and plan.launch.n_gpu_layers == -1
    assert "RPC workers h:1,h:2" in serve_banner(Settings(), plan)
    assert serve_plan.plan_serve(Settings(), check_machine=False).launch.n_gpu_layers == 0  # CPU without workers
    with pytest.raises(ConfigError, match="engine_rpc: RPC worker 'h' is not HOST:PORT"):
        serve_plan.plan_serve(Settings(engine_rpc=["h"]), check_machine=False)
    monkeypatch.setattr(serve_plan, "read_record", lambda: _record([]))
    with pytest.raises(ConfigError, match="built without RPC: run `toolpair engine install --rebuild`"):
        serve_plan.plan_serve(Settings(engine_rpc=["h:1"]), check_machine=False)


def test_rpc_worker_refuses_every_interface_unless_told(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-worker", "--host", "0.0.0.0"]) == 2
    assert "refusing --host '0.0.0.0': RPC has no authentication" in capsys.readouterr().err


def test_rpc_worker_without_rpc_server_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("proxy.cli.rpc_worker.read_record", lambda: None)
    assert main(["rpc-worker"]) == 1
    assert "rpc-server is not installed in this environment: run `toolpair engine install`" in capsys.readouterr().err


def test_rpc_worker_on_a_cuda_build_for_another_gpu_stops_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Like serve: rpc-server would start, then fail at the first kernel a client sends it."""
    server = tmp_path / "rpc-server"
    server.write_text("#!/bin/sh\nexit 0\n")
    server.chmod(0o755)
    flags = [RPC_FLAG, "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=86-real"]
    built = EngineRecord(
        "cuda", "0.3.36", "w.whl", "0" * 64, True, flags, rpc_server=str(server), cuda_architectures=["86-real"]
    )
    monkeypatch.setattr("proxy.cli.rpc_worker.read_record", lambda: built)
    h200 = FakeProbes({"nvidia-smi --query-gpu": "0, NVIDIA H200, GPU-1, 9.0\n"})
    monkeypatch.setattr("proxy.cli.rpc_worker.this_machine", lambda: Machine(h200))

    def started(*args: object) -> None:
        raise AssertionError(f"rpc-server was started: {args}")

    monkeypatch.setattr("os.execve", started)  # a regression must fail here, not replace pytest
    assert main(["rpc-worker"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith("toolpair rpc-worker: the engine was built for CUDA architectures 86-real, which GPU 0")


# --- two real workers on loopback ---------------------------------------------------------------


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Worker:
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Worker:
        command = [sys.executable, "-m", "proxy", "rpc-worker", "--port", str(self.port), "--threads", "1"]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=die_with_parent()
            )
        deadline = time.monotonic() + 30
        while not _listening(self.port) or "Devices:" not in self.log.read_text(errors="replace"):
            assert self.process.poll() is None, self.log.read_text()
            # rpc-server's own lines (endpoint, devices) reach a log file as they are said, not at exit
            assert time.monotonic() < deadline, f"the RPC worker did not start and say so:\n{self.log.read_text()}"
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@dataclass
class Split:
    process: subprocess.Popen[bytes]
    url: str
    stderr: Path
    workers: list[Worker]

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    record = read_record()
    assert record is not None and record.rpc_server, "rpc-server is missing: run `toolpair engine install`"
    tmp = tmp_path_factory.mktemp("rpc")
    workers = [Worker(free_port(), tmp / f"worker-{n}.log").start() for n in range(2)]
    port = free_port()
    endpoints = ",".join(w.endpoint for w in workers)
    process, _, err = launch_serve(
        # debug: the engine's loader lines (where llama.cpp names the remote buffers) are debug output
        tmp,
        "--port",
        str(port),
        "--rpc",
        endpoints,
        "--log-level",
        "debug",
        TOOLPAIR_ENGINE_CTX_SIZE="2048",
        TOOLPAIR_ENGINE_MAX_RESTARTS="50",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url, process))
    except BaseException:
        process.kill()
        for worker in workers:
            worker.kill()
        raise AssertionError(f"serve --rpc failed:\n{err.read_text()[-4000:]}") from None
    yield Split(process, url, err, workers)
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    for worker in workers:
        worker.kill()


async def test_the_model_is_split_across_both_workers_and_answers(split: Split) -> None:
    async with client(split.url) as api:
        reply = await api.chat.completions.create(model="any", messages=HI, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content
    log = split.log()
    for worker in split.workers:
        # llama.cpp names each remote buffer after the worker's device and address.
        assert re.search(rf"RPC\d+\[{re.escape(worker.endpoint)}\] model buffer size = +[\d.]+ MiB", log), log
    assert "RPC workers registered: " in log
    print(f"\nanswer with layers on two RPC workers: {reply.choices[0].message.content!r}")


async def test_a_dead_worker_gets_a_clean_error_and_the_engine_returns_with_it(split: Split) -> None:
    dead = split.workers[1]
    dead.kill()
    async with client(split.url) as api:
        with pytest.raises(openai.APIStatusError) as failed:
            await api.chat.completions.create(model="any", messages=HI, max_tokens=8, temperature=0)
        error = failed.value
        assert error.status_code in (502, 503), error
        assert isinstance(error.body, dict) and error.body.get("message"), error.body  # the OpenAI error shape
        # While the worker is gone, the supervisor keeps trying; each try names the worker and the fix.
        async with asyncio.timeout(60):
            while True:
                if f"RPC worker {dead.endpoint} is not reachable" in split.log():
                    break
                await asyncio.sleep(0.1)
        down = time.monotonic()
        dead.start()
        async with asyncio.timeout(180):
            while True:
                if (await ready_status(split.url))[0] == 200:
                    break
                await asyncio.sleep(0.1)
        back_in = time.monotonic() - down
        reply = await api.chat.completions.create(model="any", messages=HI, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content
    log = split.log()
    assert f"toolpair rpc-worker --host 127.0.0.1 --port {dead.port}" in log
    assert "restarting in" in log and "Traceback" not in log
    print(f"\nworker killed: HTTP {error.status_code} {error.body}; engine back {back_in:.1f}s after the worker")


async def test_a_worker_down_at_start_stops_serve_with_one_clear_reason(tmp_path: Path) -> None:
    port, nobody = free_port(), free_port()
    process, _, err = launch_serve(tmp_path, "--port", str(port), "--rpc", f"127.0.0.1:{nobody}")
    assert process.wait(120) != 0
    log = err.read_text()
    assert f"RPC worker 127.0.0.1:{nobody} is not reachable (Connection refused)" in log
    assert f"toolpair rpc-worker --host 127.0.0.1 --port {nobody}" in log and "Traceback" not in log


def test_unreachable_names_only_the_workers_that_are_down() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = f"127.0.0.1:{listening.getsockname()[1]}"
        down = f"127.0.0.1:{free_port()}"
        problems = unreachable([up, down], timeout=2)
    assert len(problems) == 1 and problems[0].startswith(f"RPC worker {down} is not reachable")
