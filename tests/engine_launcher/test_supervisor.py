"""The engine supervisor's state machine, driven through its requests with a scripted child process.

No sleeps synchronise these tests: each waits for the state change it expects,
which the supervisor reports to a listener.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from engine_launcher.supervise.launch import free_port
from engine_launcher.supervise.process import (
    ChildSpec,
    EngineState,
    EngineSupervisor,
    EngineUnavailable,
    RestartPolicy,
    Warmup,
)
from tests.support.serve import alive

CHILD = Path(__file__).with_name("fake_engine_child.py")
FAST = RestartPolicy(start_timeout=20, stop_timeout=5, max_restarts=3, backoff_base=0.01, backoff_max=0.05)


class Watched:
    """A supervisor plus the queue of states it moved to."""

    def __init__(
        self,
        mode: str,
        policy: RestartPolicy = FAST,
        on_give_up: Callable[[str], None] | None = None,
        warmup: bool = False,
        cpu: frozenset[str] = frozenset(),
    ):
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        warm = Warmup(base + "/v1/completions", b'{"prompt": "hi", "max_tokens": 2}', {}) if warmup else None
        spec = ChildSpec([sys.executable, str(CHILD), str(port), mode], base + "/docs", warmup=warm)
        self.engine = EngineSupervisor(spec, policy, on_give_up=on_give_up, cpu=cpu)
        self.states: asyncio.Queue[EngineState] = asyncio.Queue()
        self.seen: list[EngineState] = []
        self.engine.add_listener(lambda old, new: (self.seen.append(new), self.states.put_nowait(new)))

    async def until(self, state: EngineState, within: float = 20.0) -> None:
        """Wait for the next change to ``state`` (changes reported so far are consumed in order)."""
        async with asyncio.timeout(within):
            while (await self.states.get()) is not state:
                pass

    def forget(self) -> None:
        """Drop the changes reported so far, so that until() waits for new ones."""
        while not self.states.empty():
            self.states.get_nowait()


@pytest.fixture
async def supervised() -> AsyncIterator[Callable[..., Watched]]:
    made: list[Watched] = []

    def make(mode: str, policy: RestartPolicy = FAST, **kw: object) -> Watched:
        made.append(Watched(mode, policy, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for watched in made:
        await watched.engine.shutdown()


async def test_ensure_ready_starts_the_engine_and_stop_ends_it(supervised: Callable[..., Watched]) -> None:
    w = supervised("serve")
    assert w.engine.state is EngineState.STOPPED
    await w.engine.ensure_ready()
    assert w.engine.state is EngineState.READY and w.seen == [EngineState.STARTING, EngineState.READY]
    pid = w.engine.pid
    assert pid is not None and alive(pid)
    await w.engine.ensure_ready()  # ready: answered at once, nothing new starts
    assert w.engine.pid == pid
    await w.engine.stop()
    assert w.seen[2:] == [EngineState.STOPPING, EngineState.STOPPED]
    assert not alive(pid) and w.engine.pid is None


async def test_concurrent_callers_share_one_start(supervised: Callable[..., Watched]) -> None:
    w = supervised("serve")
    await asyncio.gather(*(w.engine.ensure_ready() for _ in range(5)))
    assert w.seen == [EngineState.STARTING, EngineState.READY]


async def test_a_stopped_engine_starts_again_on_demand(supervised: Callable[..., Watched]) -> None:
    w = supervised("serve")
    await w.engine.ensure_ready()
    first = w.engine.pid
    await w.engine.stop()
    await w.engine.ensure_ready()
    assert w.engine.state is EngineState.READY and w.engine.pid not in (None, first)


async def test_a_first_start_that_fails_gives_up_with_the_engines_last_lines(
    supervised: Callable[..., Watched],
) -> None:
    reasons: list[str] = []
    w = supervised("exit", on_give_up=reasons.append)
    with pytest.raises(EngineUnavailable) as failure:
        await w.engine.ensure_ready()
    message = str(failure.value)
    assert "exited with status 3 while loading the model" in message
    assert "the model file is corrupt" in message
    assert w.engine.state is EngineState.FAILED and reasons == [message]
    # Failed is final: no new start, the same answer at once.
    with pytest.raises(EngineUnavailable, match="corrupt"):
        await w.engine.ensure_ready()
    assert w.seen == [EngineState.STARTING, EngineState.FAILED]


async def test_ready_means_it_generated_and_a_crash_in_the_warm_up_is_named(
    supervised: Callable[..., Watched],
) -> None:
    w = supervised("serve", warmup=True)
    await w.engine.ensure_ready()
    assert w.engine.warmup_seconds is not None  # it answered /docs, and then generated
    # A build for another CPU: the HTTP server answers, the first generation dies with SIGILL.
    reasons: list[str] = []
    w = supervised("SIGILL", warmup=True, on_give_up=reasons.append)
    with pytest.raises(EngineUnavailable) as failure:
        await w.engine.ensure_ready()
    first, fix = str(failure.value).splitlines()[:2]
    assert first == (
        "the engine failed to start: crashed with SIGILL (illegal instruction) during its warm-up generation: "
        "it was built for another CPU and used an instruction this one lacks"
    )
    assert "toolpair engine install --rebuild" in fix and "--portable" in fix
    assert w.engine.state is EngineState.FAILED and reasons == [str(failure.value)] and w.engine.pid is None
    assert "its last output" not in reasons[0]  # a known cause is said in two lines, without the log dump


@pytest.mark.parametrize("cpu", [frozenset({"amx_int8", "amx_tile"}), frozenset({"avx2"})])
async def test_an_amx_crash_is_named_only_on_an_amx_cpu_with_amx_weights(
    supervised: Callable[..., Watched], cpu: frozenset[str]
) -> None:
    w = supervised("SIGSEGV-amx", warmup=True, cpu=cpu)
    with pytest.raises(EngineUnavailable) as failure:
        await w.engine.ensure_ready()
    message = str(failure.value)
    assert "crashed with SIGSEGV (segmentation fault) during its warm-up generation" in message
    if "amx_int8" in cpu:
        assert "llama.cpp's AMX weight path crashes on this CPU (llama.cpp #20824)" in message
        assert "TOOLPAIR_ENGINE_AMX" in message.splitlines()[1]
    else:  # no known cause: the engine's own last lines follow
        assert "AMX weight path" not in message and "its last output" in message


async def test_a_warm_up_the_engine_refuses_fails_the_start(supervised: Callable[..., Watched]) -> None:
    w = supervised("refuse", warmup=True)
    with pytest.raises(EngineUnavailable, match=r"warm-up generation answered HTTP 500: .*no generation here") as e:
        await w.engine.ensure_ready()
    assert "--ctx-size" not in str(e.value)  # no out-of-memory advice: toolpair sent the SIGKILL itself
    assert w.engine.state is EngineState.FAILED and w.engine.pid is None


async def test_a_crash_while_serving_is_diagnosed_for_the_request_it_cut_off(
    supervised: Callable[..., Watched],
) -> None:
    w = supervised("serve")
    await w.engine.ensure_ready()
    pid = w.engine.pid
    assert pid is not None
    w.forget()
    before = time.monotonic()
    assert await w.engine.crash_since(before, wait=0.05) is None  # nothing crashed
    os.kill(pid, signal.SIGSEGV)
    said = await w.engine.crash_since(before)
    assert said == "engine crashed with SIGSEGV (segmentation fault) while serving requests"
    await w.until(EngineState.READY)  # restarted after it
    assert await w.engine.crash_since(time.monotonic(), wait=0.05) is None


async def test_a_stop_during_a_slow_start_cancels_it_and_kills_the_child(supervised: Callable[..., Watched]) -> None:
    w = supervised("hang")
    waiting = asyncio.create_task(w.engine.ensure_ready())
    async with asyncio.timeout(20):
        while True:  # until the child runs and has said so (its output has no event to wait on)
            if w.engine.recent_log():
                break
            await asyncio.sleep(0.01)
    pid = w.engine.pid
    assert pid is not None and alive(pid)
    await w.engine.start()  # a start request while starting changes nothing
    await w.engine.stop()
    with pytest.raises(EngineUnavailable, match="stopping"):
        await waiting
    assert w.seen == [EngineState.STARTING, EngineState.STOPPING, EngineState.STOPPED]
    assert not alive(pid)


async def test_a_start_that_never_answers_times_out(supervised: Callable[..., Watched]) -> None:
    w = supervised("hang", RestartPolicy(start_timeout=0.5, stop_timeout=5))
    with pytest.raises(EngineUnavailable, match=r"did not answer .*/docs within 0.5s"):
        await w.engine.ensure_ready()
    assert w.engine.state is EngineState.FAILED and w.engine.pid is None


async def test_a_crash_restarts_the_engine(supervised: Callable[..., Watched]) -> None:
    w = supervised("serve")
    await w.engine.ensure_ready()
    first = w.engine.pid
    assert first is not None
    w.forget()
    os.kill(first, signal.SIGKILL)
    await w.until(EngineState.STARTING)
    # Requests that arrive during the restart wait for it.
    await w.engine.ensure_ready()
    assert w.engine.state is EngineState.READY
    assert w.engine.pid not in (None, first) and w.engine.restarts == 1


async def test_repeated_crashes_make_it_give_up(supervised: Callable[..., Watched]) -> None:
    reasons: list[str] = []
    w = supervised(
        "serve", RestartPolicy(max_restarts=2, backoff_base=0.01, backoff_max=0.02), on_give_up=reasons.append
    )
    await w.engine.ensure_ready()
    w.forget()
    for crash in (1, 2, 3):
        pid = w.engine.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        if crash < 3:
            await w.until(EngineState.STARTING)
            await w.until(EngineState.READY)
    await w.until(EngineState.FAILED)
    assert w.engine.state is EngineState.FAILED
    assert "gave up after 3 engine failures in a row" in reasons[0]
    with pytest.raises(EngineUnavailable, match="gave up"):
        await w.engine.ensure_ready()


async def test_a_child_that_ignores_sigterm_is_killed(supervised: Callable[..., Watched]) -> None:
    w = supervised("stubborn", RestartPolicy(stop_timeout=0.3))
    await w.engine.ensure_ready()
    pid = w.engine.pid
    assert pid is not None
    await w.engine.stop()
    assert w.engine.state is EngineState.STOPPED and not alive(pid)


async def test_ensure_ready_while_stopping_waits_for_the_next_start(supervised: Callable[..., Watched]) -> None:
    w = supervised("stubborn", RestartPolicy(stop_timeout=0.3))
    await w.engine.ensure_ready()
    first = w.engine.pid
    w.forget()
    stopping = asyncio.create_task(w.engine.stop())
    await w.until(EngineState.STOPPING)
    await w.engine.ensure_ready()
    await stopping
    assert w.engine.state is EngineState.READY and w.engine.pid not in (None, first)


async def test_shutdown_is_final(supervised: Callable[..., Watched]) -> None:
    w = supervised("serve")
    await w.engine.ensure_ready()
    pid = w.engine.pid
    assert pid is not None
    await w.engine.shutdown()
    assert w.engine.state is EngineState.SHUTDOWN and not alive(pid)
    with pytest.raises(EngineUnavailable, match="shutting down"):
        await w.engine.ensure_ready()
    await w.engine.stop()  # answered, not hung


async def test_engine_output_goes_to_the_log_with_a_prefix(
    supervised: Callable[..., Watched], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="toolpair.engine")
    w = supervised("serve")
    await w.engine.ensure_ready()
    assert any(r.getMessage() == "engine: fake engine: loading model" for r in caplog.records)
    assert "fake engine: loading model" in w.engine.recent_log()
    assert any("engine state: starting -> ready" in r.getMessage() for r in caplog.records)


async def test_a_command_that_cannot_be_launched_fails_clearly() -> None:
    engine = EngineSupervisor(ChildSpec(["/nonexistent/engine"], "http://127.0.0.1:9/docs"), FAST)
    with pytest.raises(EngineUnavailable, match="could not be launched"):
        await engine.ensure_ready()
    await engine.shutdown()


PARENT = """
import asyncio, sys
from engine_launcher.supervise.process import ChildSpec, EngineSupervisor

async def main():
    engine = EngineSupervisor(ChildSpec([sys.executable, *sys.argv[1:4]], sys.argv[4]))
    await engine.ensure_ready()
    print(engine.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_the_engine_dies_with_a_killed_toolpair() -> None:
    """SIGKILL gives toolpair no chance to stop the engine; the kernel's parent-death signal does it."""
    port = free_port()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(CHILD), str(port), "serve", f"http://127.0.0.1:{port}/docs"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the kernel to deliver the signal
    survived = alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)  # leave nothing behind, then fail
    assert not survived


async def test_requests_that_race_a_shutdown_are_answered(supervised: Callable[..., Watched]) -> None:
    w = supervised("serve")
    await w.engine.ensure_ready()
    results = await asyncio.gather(
        w.engine.shutdown(), w.engine.stop(), w.engine.ensure_ready(), return_exceptions=True
    )
    assert results[0] is None and results[1] is None and isinstance(results[2], EngineUnavailable)
    assert w.engine.state is EngineState.SHUTDOWN
