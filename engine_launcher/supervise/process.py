"""One owner for the engine process: starting, readiness, crashes, restarts, stopping.

A single asyncio task (the owner) holds the state and the child process.
Everything else sends it a request and waits for the answer: :meth:`start`,
:meth:`ensure_ready`, :meth:`stop` and :meth:`shutdown` from callers, and
"the child answered", "the child exited" or "the backoff is over" from the
helper tasks it starts. No caller reads the state to decide what to do; they
ask for an outcome, and the owner answers from the state it alone changes.
The state is public only for health output and logs.

What :meth:`ensure_ready` answers in each state:

======== ==================================================================
stopped  start the engine, answer when it is ready (or when it fails)
starting answer when it is ready (or when it fails)
ready    answer at once
stopping answer after it has stopped and started again
failed   fail at once, with the reason and the engine's last log lines
shutdown fail at once
======== ==================================================================

The slow start (spawn, poll the readiness URL until it answers, then send
the warm-up request, all bounded by a deadline and the child's exit) runs in a
task the owner cancels when a stop arrives. The warm-up makes the engine
compute: an HTTP server that answers proves only that the model loaded, and
the first matrix multiply is where a build for another CPU, or llama.cpp's AMX
path, dies. "Ready" means it generated.

An exit by a signal is diagnosed (:mod:`engine_launcher.supervise.crash`): the reason a
failed start, a restart or a give-up reports names the signal, what the
engine was doing, and for known causes what to do. :meth:`crash_since`
hands the same diagnosis to a request the crash cut off.

Stopping sends SIGTERM to the child's process group, waits, then sends
SIGKILL. On Linux the child also gets SIGKILL if toolpair dies without
stopping it (``PR_SET_PDEATHSIG``), so the engine never outlives toolpair.

A crash after the engine was ready restarts it after an exponential backoff;
``max_restarts`` crashes in a row (a run that stays up ``stable_after`` seconds
resets the count) make the owner give up. A first start that fails gives up at
once: that is a configuration problem, and retrying only hides it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp

from engine_launcher.builder.machine import this_machine
from engine_launcher.supervise.crash import Diagnosis, diagnose

__all__ = [
    "ChildSpec",
    "EngineState",
    "EngineSupervisor",
    "EngineUnavailable",
    "RestartPolicy",
    "Warmup",
    "die_with_parent",
]

log = logging.getLogger("toolpair.engine")


class EngineState(StrEnum):
    """The engine's lifecycle, as the owner sees it."""

    STOPPED = "stopped"  # no process; the next start or ensure_ready launches one
    STARTING = "starting"  # waiting out a restart backoff, or launched and not yet answering
    READY = "ready"  # answering its readiness URL; requests may go through
    STOPPING = "stopping"  # its process group was told to exit and has not yet
    FAILED = "failed"  # gave up (first start failed, or too many crashes); ensure_ready fails fast
    SHUTDOWN = "shutdown"  # terminal: toolpair is exiting and nothing starts again


class EngineUnavailable(Exception):
    """Raised by :meth:`EngineSupervisor.ensure_ready` when the engine cannot serve."""


@dataclass(frozen=True)
class Warmup:
    """A request the engine must answer with 200 before it counts as ready: a short generation."""

    url: str
    body: bytes
    headers: Mapping[str, str]


@dataclass(frozen=True)
class ChildSpec:
    """The engine's command line, environment, the URL that answers once it loaded, and its warm-up."""

    argv: Sequence[str]
    ready_url: str
    env: Mapping[str, str] | None = None
    warmup: Warmup | None = None


@dataclass(frozen=True)
class RestartPolicy:
    start_timeout: float = 300.0
    stop_timeout: float = 10.0
    max_restarts: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    stable_after: float = 60.0
    poll_interval: float = 0.05
    log_lines: int = 200

    def backoff(self, failures: int) -> float:
        """Seconds to wait before restart number ``failures`` (1-based).

        >>> [RestartPolicy(backoff_base=0.5, backoff_max=3).backoff(n) for n in (1, 2, 3, 4)]
        [0.5, 1.0, 2.0, 3.0]
        """
        return float(min(self.backoff_base * 2.0 ** (failures - 1), self.backoff_max))


# --- messages to the owner ---------------------------------------------------------------------


@dataclass
class _Start:
    pass


@dataclass
class _EnsureReady:
    waiter: asyncio.Future[None]


@dataclass
class _Stop:
    done: asyncio.Future[None]
    final: bool


@dataclass
class _Launch:
    """The restart backoff is over."""


@dataclass
class _Answered:
    process: asyncio.subprocess.Process


@dataclass
class _Warming:
    """The engine loaded; its warm-up generation was sent."""

    process: asyncio.subprocess.Process


@dataclass
class _WarmupFailed:
    process: asyncio.subprocess.Process
    reason: str


@dataclass
class _TimedOut:
    process: asyncio.subprocess.Process


@dataclass
class _Exited:
    process: asyncio.subprocess.Process
    code: int


_Message = _Start | _EnsureReady | _Stop | _Launch | _Answered | _Warming | _WarmupFailed | _TimedOut | _Exited
Listener = Callable[[EngineState, EngineState], None]


# --- the child process -------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the kernel SIGKILL the child when its parent thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    except (OSError, AttributeError):  # pragma: no cover - every glibc and musl has prctl
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    # The child leads its own session, so its process group id is its pid; the
    # group outlives a dead leader as long as any member (a grandchild) lives.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


# llama-cpp-python prints a report for every request it fails: "Exception: <error>", a
# traceback, the error again. Its validation errors quote the request, prompt included,
# so the report is left out of the log unless ``quote_requests`` (log_bodies) allows it.
# uvicorn's next log line (its access line for that request) ends the report.
_REPORT_START = "Exception: "
_REPORT_END = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s")
_REPORT_MAX_LINES = 1000
_REPORT_LEFT_OUT = "(its report of a failed request is left out: it may quote the request; log_bodies shows it)"
# The engine's output is its loader dump (a thousand lines and more), uvicorn's access lines and
# per-request timings: debug. What says something went wrong reaches the default log level.
_LOUD = re.compile(r"(ERROR|CRITICAL|WARNING):\s|Exception: ")
# Earlier lines a failed start quotes besides the last ones: the loader says why long before the
# traceback that ends the process.
_WHY = re.compile(r"\berror\b|failed|cannot|unable|out of memory", re.IGNORECASE)
_TAIL_LINES = 15


class EngineSupervisor:
    """Owns one engine process. Methods are requests to the owner task."""

    def __init__(
        self,
        spec: ChildSpec,
        policy: RestartPolicy | None = None,
        *,
        on_give_up: Callable[[str], None] | None = None,
        quote_requests: bool = False,
        cpu: frozenset[str] | None = None,
    ) -> None:
        self.spec = spec
        self._cpu = this_machine().cpu_flags if cpu is None else cpu
        """This CPU's feature flags, for diagnosing a crash (``amx_int8``, ...)."""
        self._quote_requests = quote_requests
        self._hidden: int | None = None  # lines of a failed-request report left out so far
        self.policy = policy or RestartPolicy()
        self._on_give_up = on_give_up
        self._listeners: list[Listener] = []
        self._inbox: asyncio.Queue[_Message] = asyncio.Queue()
        self._owner: asyncio.Task[None] | None = None
        # Everything below is read and written by the owner task only.
        self._state = EngineState.STOPPED
        self._process: asyncio.subprocess.Process | None = None
        self._helpers: set[asyncio.Task[None]] = set()
        self._backoff: asyncio.Task[None] | None = None
        self._poll: asyncio.Task[None] | None = None
        self._killer: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._stop_waiters: list[asyncio.Future[None]] = []
        self._final = False
        self._ever_ready = False
        self._failures = 0
        self._restarts = 0
        self._launched_at = 0.0
        self._ready_at = 0.0
        self._exit_reason: str | None = None
        self._phase = ""
        self._reason = ""
        self._crash: tuple[float, Diagnosis] | None = None
        self._warm_from = 0.0
        self._warmup_seconds: float | None = None
        self._lines: deque[str] = deque(maxlen=self.policy.log_lines)

    # --- read-only views, for health output and logs ---

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def reason(self) -> str:
        """Why the engine failed, when it did."""
        return self._reason

    @property
    def warmup_seconds(self) -> float | None:
        """How long the last start's warm-up generation took, once it answered."""
        return self._warmup_seconds

    async def crash_since(self, since: float, wait: float = 2.0) -> str | None:
        """The diagnosis of a crash at or after ``since`` (``time.monotonic()``), waiting up to ``wait`` seconds.

        A request cut off by the engine's death sees the broken connection
        before the owner sees the exit: this lets its error say why.
        """
        deadline = time.monotonic() + wait
        while True:
            crash = self._crash
            if crash is not None and crash[0] >= since:
                return crash[1].what
            if time.monotonic() >= deadline or self._state in (EngineState.SHUTDOWN, EngineState.STOPPING):
                return None
            await asyncio.sleep(0.05)

    def recent_log(self, lines: int = 20) -> list[str]:
        """The engine's last output lines, from its latest run."""
        return list(self._lines)[-lines:]

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(old, new)`` on every state change, from the owner task."""
        self._listeners.append(listener)

    # --- requests ---

    def _post(self, message: _Message) -> None:
        if self._owner is None:
            self._owner = asyncio.get_running_loop().create_task(self._own(), name="engine-owner")
        elif self._owner.done():
            self._answer_after_shutdown(message)  # nobody reads the inbox any more
            return
        self._inbox.put_nowait(message)

    @staticmethod
    def _answer_after_shutdown(message: _Message) -> None:
        if isinstance(message, _EnsureReady) and not message.waiter.done():
            message.waiter.set_exception(EngineUnavailable("toolpair is shutting down"))
        elif isinstance(message, _Stop) and not message.done.done():
            message.done.set_result(None)

    async def start(self) -> None:
        """Ask for the engine to start; returns at once (see :meth:`ensure_ready`)."""
        self._post(_Start())

    async def ensure_ready(self) -> None:
        """Return once the engine is ready; raise :class:`EngineUnavailable` if it cannot be."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._post(_EnsureReady(waiter))
        await waiter

    async def stop(self) -> None:
        """Stop the engine (a later ensure_ready starts it again); return once it has exited."""
        await self._stop(final=False)

    async def shutdown(self) -> None:
        """Stop the engine for good and end the owner task."""
        if self._owner is None:
            self._state = EngineState.SHUTDOWN
            return
        await self._stop(final=True)
        await self._owner

    async def _stop(self, *, final: bool) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._post(_Stop(done, final))
        await done

    # --- the owner ---

    async def _own(self) -> None:
        while True:
            message = await self._inbox.get()
            try:
                await self._handle(message)
            except Exception:  # pragma: no cover - a bug here must not leave callers hanging forever
                log.exception("engine supervisor: error while handling %s", type(message).__name__)
            if self._state is EngineState.SHUTDOWN:
                self._settle_waiters(EngineUnavailable(self._unavailable()))
                while not self._inbox.empty():  # requests that arrived with the shutdown
                    self._answer_after_shutdown(self._inbox.get_nowait())
                for task in list(self._helpers):
                    task.cancel()
                return

    async def _handle(self, message: _Message) -> None:
        state = self._state
        if isinstance(message, _Start):
            if state is EngineState.STOPPED:
                await self._begin_start(0.0)
        elif isinstance(message, _EnsureReady):
            await self._on_ensure_ready(message.waiter)
        elif isinstance(message, _Stop):
            await self._on_stop(message)
        elif isinstance(message, _Launch):
            if state is EngineState.STARTING and self._process is None:
                await self._spawn()
        elif isinstance(message, _Warming):
            if message.process is self._process and state is EngineState.STARTING:
                self._phase = "during its warm-up generation"
                self._warm_from = time.monotonic()
        elif isinstance(message, _WarmupFailed):
            if message.process is self._process and state is EngineState.STARTING:
                self._exit_reason = message.reason
                _signal_group(message.process, signal.SIGKILL)
        elif isinstance(message, _Answered):
            if message.process is self._process and state is EngineState.STARTING:
                self._ready_at = time.monotonic()
                self._ever_ready = True
                self._phase = "while serving requests"
                warm = ""
                if self.spec.warmup is not None:
                    self._warmup_seconds = self._ready_at - self._warm_from
                    warm = f", warm-up generation {self._warmup_seconds:.1f}s"
                log.info(
                    "engine ready in %.1fs (pid %d%s)", self._ready_at - self._launched_at, message.process.pid, warm
                )
                self._transition(EngineState.READY)
                self._settle_waiters(None)
        elif isinstance(message, _TimedOut):
            if message.process is self._process and state is EngineState.STARTING:
                waited = (
                    "its warm-up generation did not finish"
                    if self._phase == "during its warm-up generation"
                    else f"did not answer {self.spec.ready_url}"
                )
                self._exit_reason = f"{waited} within {self.policy.start_timeout:g}s"
                _signal_group(message.process, signal.SIGKILL)
        elif message.process is self._process:
            await self._on_exit(message.process, message.code)

    async def _on_ensure_ready(self, waiter: asyncio.Future[None]) -> None:
        state = self._state
        if state is EngineState.READY:
            if not waiter.done():
                waiter.set_result(None)
        elif state in (EngineState.FAILED, EngineState.SHUTDOWN):
            if not waiter.done():
                waiter.set_exception(EngineUnavailable(self._unavailable()))
        else:
            self._waiters.append(waiter)
            if state is EngineState.STOPPED:
                await self._begin_start(0.0)

    def _unavailable(self) -> str:
        return self._reason if self._state is EngineState.FAILED else "toolpair is shutting down"

    async def _on_stop(self, message: _Stop) -> None:
        self._final = self._final or message.final
        state = self._state
        if state is EngineState.STOPPING:
            self._stop_waiters.append(message.done)
            return
        if state is EngineState.SHUTDOWN or self._process is None:
            self._cancel(self._backoff)
            self._settle_waiters(EngineUnavailable("the engine was stopped"))
            if self._final:
                self._transition(EngineState.SHUTDOWN)
            elif state is EngineState.STARTING:
                self._transition(EngineState.STOPPED)
            message.done.set_result(None)
            return
        self._stop_waiters.append(message.done)
        self._settle_waiters(EngineUnavailable("the engine is stopping"))
        self._cancel(self._poll)
        self._transition(EngineState.STOPPING)
        _signal_group(self._process, signal.SIGTERM)
        self._killer = self._helper(self._kill_after(self._process, self.policy.stop_timeout))

    async def _on_exit(self, process: asyncio.subprocess.Process, code: int) -> None:
        self._process = None
        _signal_group(process, signal.SIGKILL)  # anything it left behind in its group
        self._cancel(self._poll)
        self._cancel(self._killer)
        state = self._state
        if state is EngineState.STOPPING:
            log.info("engine stopped (pid %d, exit status %d)", process.pid, code)
            if self._final:
                self._transition(EngineState.SHUTDOWN)
                self._settle_waiters(EngineUnavailable(self._unavailable()))
            else:
                self._transition(EngineState.STOPPED)
                if self._waiters:  # ensure_ready arrived while it was stopping
                    await self._begin_start(0.0)
            for done in self._stop_waiters:
                if not done.done():
                    done.set_result(None)
            self._stop_waiters.clear()
            return
        if self._exit_reason is not None:
            # toolpair killed it (a failed warm-up, a start that timed out): that is the reason, and
            # the SIGKILL it died of says nothing about the engine.
            reason, fix = self._exit_reason, ""
        else:
            diagnosis = diagnose(code, list(self._lines), self._cpu, when=self._phase)
            self._crash = (time.monotonic(), diagnosis)
            reason, fix = diagnosis.what, diagnosis.fix
        self._exit_reason = None
        await self._crashed(reason, was_ready=state is EngineState.READY, fix=fix)

    def _last_output(self) -> list[str]:
        """The engine's last lines, after any earlier ones that say what went wrong."""
        lines = list(self._lines)
        earlier = [line for line in lines[:-_TAIL_LINES] if _WHY.search(line)][-5:]
        return [*earlier, "...", *lines[-_TAIL_LINES:]] if earlier else lines[-_TAIL_LINES:]

    async def _crashed(self, reason: str, *, was_ready: bool, fix: str = "") -> None:
        # A known cause is said in two lines (what, and what to do); the engine's own last lines
        # follow only where no cause is known, since they would bury the two that matter.
        reason = reason.removeprefix("engine ")
        tail = "" if fix else "\n".join(f"  | {line}" for line in self._last_output())
        said = reason + (f"\n  {fix}" if fix else "") + (f"; its last output:\n{tail}" if tail else "")
        detail = f"engine {said}"
        if not self._ever_ready:
            self._give_up(f"the engine failed to start: {said}")
            return
        if was_ready and time.monotonic() - self._ready_at >= self.policy.stable_after:
            self._failures = 0
        self._failures += 1
        if self._failures > self.policy.max_restarts:
            self._give_up(f"gave up after {self._failures} engine failures in a row; the last: {detail}")
            return
        delay = self.policy.backoff(self._failures)
        log.warning(
            "%s; restarting in %.1fs (attempt %d of %d)", detail, delay, self._failures, self.policy.max_restarts
        )
        self._restarts += 1
        await self._begin_start(delay)

    def _give_up(self, reason: str) -> None:
        self._reason = reason
        log.error("%s", reason)
        self._transition(EngineState.FAILED)
        self._settle_waiters(EngineUnavailable(reason))
        if self._on_give_up is not None:
            self._on_give_up(reason)

    async def _begin_start(self, delay: float) -> None:
        self._transition(EngineState.STARTING)
        if delay > 0:
            self._backoff = self._helper(self._after(delay))
        else:
            await self._spawn()

    async def _after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._inbox.put_nowait(_Launch())

    async def _spawn(self) -> None:
        self._launched_at = time.monotonic()
        self._phase = "while loading the model"
        self._warmup_seconds = None
        self._lines.clear()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=None if self.spec.env is None else dict(self.spec.env),
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        except OSError as exc:
            await self._crashed(f"could not be launched: {exc}", was_ready=False)
            return
        self._process = process
        log.info("engine launched (pid %d)", process.pid)
        log.debug("engine command line: %s", " ".join(self.spec.argv))
        self._helper(self._watch(process))
        self._poll = self._helper(self._wait_ready(process))

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """Relay the child's output to the log, then report its exit."""
        reader = asyncio.ensure_future(self._relay_output(process))
        code = await process.wait()
        with contextlib.suppress(TimeoutError):
            # A grandchild may hold the pipe open; do not wait for it forever.
            await asyncio.wait_for(asyncio.shield(reader), 1.0)
        reader.cancel()
        self._inbox.put_nowait(_Exited(process, code))

    async def _relay_output(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        pending = b""
        while chunk := await process.stdout.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > 8192:  # progress dots without a newline: show them anyway
                lines.append(pending)
                pending = b""
            for raw in lines:
                self._log_line(raw)
        if pending:
            self._log_line(pending)

    def _log_line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line.strip() or self._left_out(line):
            return
        loud = _LOUD.match(line) is not None
        if not self._quote_requests and line.startswith(_REPORT_START):
            self._hidden = 0
            line = _REPORT_LEFT_OUT
        self._lines.append(line)  # kept whatever the level: a failed start quotes them
        log.log(logging.WARNING if loud else logging.DEBUG, "engine: %s", line)

    def _left_out(self, line: str) -> bool:
        """Whether ``line`` belongs to a failed-request report that is being left out."""
        if self._hidden is None:
            return False
        if _REPORT_END.match(line) or self._hidden >= _REPORT_MAX_LINES:
            self._hidden = None
            return False
        self._hidden += 1
        return True

    async def _wait_ready(self, process: asyncio.subprocess.Process) -> None:
        deadline = time.monotonic() + self.policy.start_timeout
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < deadline:
                try:
                    async with session.get(self.spec.ready_url) as response:
                        if response.status == 200:
                            break
                except (aiohttp.ClientError, OSError, TimeoutError):
                    pass
                await asyncio.sleep(self.policy.poll_interval)
            else:
                self._inbox.put_nowait(_TimedOut(process))
                return
            outcome: _Message | None = _Answered(process)
            if self.spec.warmup is not None:
                self._inbox.put_nowait(_Warming(process))
                outcome = await self._warm_up(session, self.spec.warmup, process, deadline - time.monotonic())
        if outcome is not None:
            self._inbox.put_nowait(outcome)

    @staticmethod
    async def _warm_up(
        session: aiohttp.ClientSession, warmup: Warmup, process: asyncio.subprocess.Process, budget: float
    ) -> _Message | None:
        """Send the warm-up generation and say how it went; None when the engine died (its exit tells)."""
        try:
            async with session.post(
                warmup.url, data=warmup.body, headers=dict(warmup.headers), timeout=aiohttp.ClientTimeout(total=budget)
            ) as response:
                text = await response.text(errors="replace")
        except (TimeoutError, aiohttp.ServerTimeoutError):
            return _TimedOut(process)
        except (aiohttp.ClientError, OSError):
            # The connection broke, most likely because the engine died: wait for its exit,
            # which says how (bounded, in case it lives on with its server broken).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), timeout=max(budget, 1.0))
            if process.returncode is None:
                return _WarmupFailed(process, "its warm-up generation broke off the connection")
            return None
        if response.status == 200:
            return _Answered(process)
        return _WarmupFailed(process, f"its warm-up generation answered HTTP {response.status}: {text[:300]}")

    async def _kill_after(self, process: asyncio.subprocess.Process, delay: float) -> None:
        await asyncio.sleep(delay)
        log.warning("engine (pid %d) ignored SIGTERM for %gs; sending SIGKILL", process.pid, delay)
        _signal_group(process, signal.SIGKILL)

    # --- small helpers ---

    def _transition(self, new: EngineState) -> None:
        old = self._state
        if old is new:
            return
        self._state = new
        log.info("engine state: %s -> %s", old.value, new.value)
        for listener in self._listeners:
            listener(old, new)

    def _settle_waiters(self, error: EngineUnavailable | None) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if waiter.done():
                continue  # the caller gave up waiting
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _helper(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)
        return task

    @staticmethod
    def _cancel(task: asyncio.Task[None] | None) -> None:
        if task is not None and not task.done():
            task.cancel()
