"""Starting ``toolpair serve`` for a test, as a real process: one way, used by every test that runs it.

``launch_serve`` starts it (logs to files, gone with the test run); ``start_serve`` also waits for
/ready; ``run_serve`` runs it to its exit (a start-up refusal, ``--check``, ``--help``). The /proc
helpers read the process tree it makes, the HTTP helpers the server it becomes.

Each serves the suite's model, the bundled Gemma 270M with the ChatML template (``--model`` and
``--chat-template-file``, unless the test names a model or a template itself), which the session's
``real_engine`` serves too, so their outputs compare; ``default_model=True`` leaves both out, for
the tests of what ``toolpair serve`` runs by default.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from openai import AsyncOpenAI

from engine_launcher.builder.models import DEFAULT_TEMPLATE, bundled_model, cache_root
from engine_launcher.supervise.launch import free_port
from engine_launcher.supervise.process import die_with_parent

__all__ = [
    "ROOT",
    "Serving",
    "alive",
    "children",
    "client",
    "cmdline",
    "launch_serve",
    "long_bias",
    "ready_status",
    "run_serve",
    "start_serve",
    "until_queue",
    "wait_ready",
]

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:  # gone, possibly between open and read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def suite_model_args(args: Sequence[str]) -> list[str]:
    """The suite's model and template, for ``serve ARGS`` that name neither."""
    added = [] if "--model" in args else ["--model", str(bundled_model(cache_root()))]
    if added and "--chat-template-file" not in args:
        added += ["--chat-template-file", str(DEFAULT_TEMPLATE)]
    return added


def _command(python: str | Path, args: Sequence[str], default_model: bool = False) -> list[str]:
    model = [] if default_model or "--help" in args else suite_model_args(args)
    return [str(python), "-m", "proxy", "serve", *args, *model]


def _environment(env: dict[str, str], without: Sequence[str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in without}, **env}


def launch_serve(
    tmp: Path,
    *args: str,
    python: str | Path = sys.executable,
    without: Sequence[str] = (),
    default_model: bool = False,
    **env: str,
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``toolpair serve ARGS`` started, its stdout and stderr in files under ``tmp``.

    ``python`` runs it (another engine build's environment); ``without`` names variables of this
    process's environment it must not inherit, ``env`` adds its own.
    """
    out, err = tmp / "serve.out", tmp / "serve.err"
    process = subprocess.Popen(
        _command(python, args, default_model),
        stdout=out.open("wb"),
        stderr=err.open("wb"),
        env=_environment(env, without),
        cwd=ROOT,
        preexec_fn=die_with_parent(),  # gone with the test run, even a killed one
    )
    return process, out, err


async def wait_ready(url: str, process: subprocess.Popen[bytes], within: float = 180) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            assert process.poll() is None, "toolpair serve exited early"
            try:
                async with session.get(url + "/ready") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("toolpair serve did not become ready")


class Serving(NamedTuple):
    """A ``toolpair serve`` that is ready: its process, its URL, and the files its stdout and stderr go to."""

    process: subprocess.Popen[bytes]
    url: str
    stdout: Path
    stderr: Path


def start_serve(
    tmp: Path,
    *args: str,
    python: str | Path = sys.executable,
    without: Sequence[str] = (),
    within: float = 180,
    default_model: bool = False,
    **env: str,
) -> Serving:
    """``toolpair serve`` on a free port, returned once /ready answers 200 (or killed, with its log)."""
    port = free_port()
    process, out, err = launch_serve(
        tmp, "--port", str(port), *args, python=python, without=without, default_model=default_model, **env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url, process, within=within))
    except BaseException:
        process.kill()
        raise AssertionError(f"serve failed:\n{err.read_text()[-4000:]}") from None
    return Serving(process, url, out, err)


def run_serve(
    *args: str,
    timeout: float,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    check: bool = False,
    default_model: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``toolpair serve ARGS`` run to its exit, its output captured; ``prefix`` runs it as another user."""
    return subprocess.run(
        [*prefix, *_command(sys.executable, args, default_model)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=_environment(env or {}, ()),
        check=check,
    )


def client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="whatever-the-client-has", max_retries=0, timeout=120)


async def long_bias(url: str) -> dict[str, int]:
    """logit_bias that bans every way the bundled model ends a turn, so it writes until max_tokens."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/extras/tokenize", json={"input": "<|im_end|>"}) as response,
    ):
        assert response.status == 200
        tokens = (await response.json())["tokens"]
    return {str(t): -100 for t in {*tokens, 1, 106}}


async def ready_status(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url + "/ready") as response:
        return response.status, await response.json()


async def until_queue(url: str, waiting: int, within: float = 30) -> None:
    """Poll /ready until the queue holds ``waiting`` requests."""
    async with asyncio.timeout(within):
        while True:
            if (await ready_status(url))[1]["engine"]["queue"]["waiting"] == waiting:
                return
            await asyncio.sleep(0.02)
