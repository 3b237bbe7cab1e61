"""The real llama-cpp-python server with the bundled Gemma 270M model, for tests.

Started once per test session as a plain subprocess on loopback, with the same
command line that ``toolpair serve`` builds (engine_launcher.supervise.launch). Tests that
need the engine's own view of a request (logprobs, tokenization) talk to it
directly; everything else goes through toolpair in front of it.

Under an interpreter whose engine is a GPU build (``.venv-vulkan``, see
scripts/vulkan_check.sh), the engine gets what ``serve`` gives such a build:
every layer on the device, its device choice and run-time libraries; and it
must say so in its log, or the session stops.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from engine_launcher.builder import models
from engine_launcher.builder.backends import Backend, engine_devices
from engine_launcher.builder.machine import this_machine
from engine_launcher.builder.record import read_record
from engine_launcher.supervise.launch import READY_PATH, EngineLaunch, engine_command, engine_env, free_port
from engine_launcher.supervise.process import die_with_parent

__all__ = ["CACHE", "TEMPLATE", "RealEngine", "bundled_model", "free_port", "start_real_engine"]

TEMPLATE = models.DEFAULT_TEMPLATE
CACHE = models.cache_root()


CPU_READ_TIMEOUT = 600.0
GPU_READ_TIMEOUT = 1800.0
"""A new batch shape on llvmpipe compiled its pipelines for 471 s cold in one measured run."""


def bundled_model() -> Path:
    return models.bundled_model(CACHE)


@dataclass
class RealEngine:
    url: str
    api_key: str
    process: subprocess.Popen[bytes]
    log: Path
    read_timeout: float = CPU_READ_TIMEOUT
    """How long toolpair in front of it waits for a response: a software Vulkan device compiles
    pipelines for each new batch shape, which takes minutes, not seconds."""

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_real_engine(
    log_dir: Path, n_ctx: int = 4096, timeout: float = 120.0, port: int | None = None, *, logprobs: bool = True
) -> RealEngine:
    """The engine as serve starts it, with logprobs on by default (tests compare distributions with it)."""
    record = read_record()
    gpu = record is not None and record.gpu
    devices = (
        engine_devices(Backend(record.backend), os.environ, this_machine(), record.cuda_architectures)
        if gpu and record
        else None
    )
    launch = EngineLaunch(
        bundled_model(),
        port or free_port(),
        "test-engine-key",
        n_ctx,
        chat_template=TEMPLATE,
        logits_all=logprobs,
        n_gpu_layers=-1 if gpu else 0,
        env=record.process_env(devices) if record else {},
    )
    log = log_dir / f"llama-{launch.port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            engine_command(launch),
            env=engine_env(launch, os.environ),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # gone with the test run, even a killed one
        )
    read_timeout = GPU_READ_TIMEOUT if gpu else CPU_READ_TIMEOUT
    engine = RealEngine(launch.url, launch.api_key, process, log, read_timeout)
    if gpu:
        timeout = max(timeout, 600.0)  # a software Vulkan device compiles its shaders at start
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-cpp-python exited early:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(launch.url + READY_PATH, timeout=2) as response:
                if response.status == 200:
                    if gpu:
                        _all_layers_offloaded(engine)
                        _warm_up(engine)
                    return engine
        except OSError:
            time.sleep(0.1)
    engine.stop()
    raise RuntimeError(f"llama-cpp-python did not come up in {timeout}s:\n{log.read_text()[-3000:]}")


def offloaded_layers(log: str) -> tuple[int, int] | None:
    """llama.cpp's ``offloaded N/M layers to GPU`` line, as (N, M).

    >>> offloaded_layers("load_tensors: offloaded 19/19 layers to GPU\\n")
    (19, 19)
    """
    found = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _all_layers_offloaded(engine: RealEngine) -> None:
    text = engine.log.read_text(errors="replace")
    layers = offloaded_layers(text)
    if layers is None or layers[0] != layers[1] or layers[0] == 0:
        engine.stop()
        raise RuntimeError(f"a GPU build must offload every layer; the engine said {layers}:\n{text[-3000:]}")


def _warm_up(engine: RealEngine) -> None:
    """One request, so tests do not pay for compiling a GPU device's pipelines (minutes on a software device)."""
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {engine.api_key}"}
    request = urllib.request.Request(engine.url + "/v1/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=GPU_READ_TIMEOUT) as response:
        response.read()
