"""FIFO admission to one or more engines that each serve a few requests at a time.

llama-cpp-python serves one completion at a time, and by default a new
request interrupts the running stream. toolpair turns interruption off and
queues instead: at most ``max_concurrency`` requests are with each engine, at
most ``max_queue`` more wait, first come first served. A request past that gets
429 with ``Retry-After``. A client that disconnects while it waits (aiohttp
cancels its handler) leaves the queue and frees its place.

With several engines (``toolpair serve --parallel N``) a request goes to a free
engine, preferring the one that last served the same conversation: that
engine still holds the conversation's KV state and prompt cache, so only the
new turn is evaluated. The conversation is named by :func:`conversation_key`.
Which engine a request gets is decided by :class:`Schedule`, plain state with
no I/O, so the policy is tested without sockets or sleeps; :class:`EnginePool`
is the asyncio shell around it.

The pool also waits for the engines: a request arriving while no engine is
ready waits up to ``ready_timeout`` seconds for one, then gets 503. Readiness
is awaited before a place in the queue is taken (so a failed start answers
every waiting request at the same time, not one timeout after another) and
again for the engine a request is given (it may have crashed meanwhile).

Used as the app's ``ADMISSION``: ``async with pool(request, conversation) as
target: ...`` around the engine call, response included. ``target`` is the
:class:`~proxy.engine.upstream.EngineTarget` to send to, or None for the app's own
upstream (:class:`EngineQueue`, one engine).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.engine.upstream import EngineTarget
from proxy.errors import EngineUnavailableError, QueueFullError
from proxy.ops.trace import current_trace

__all__ = [
    "EnginePool",
    "EngineQueue",
    "PoolEngine",
    "Schedule",
    "Ticket",
    "conversation_key",
]

Ready = Callable[[], Awaitable[None]]
"""Returns once the engine is ready; raises EngineUnavailableError when it cannot be."""

_LEADING_ROLES = ("system", "developer")


def _text_of(content: Any) -> str:
    """The text a message's content says, without per-turn markup such as cache_control."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
                elif isinstance(part.get("image_url"), (dict, str)):
                    parts.append(orjson.dumps(part["image_url"], option=orjson.OPT_SORT_KEYS).decode())
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def conversation_key(messages: Any) -> str | None:
    """A name for the conversation ``messages`` belong to, the same on every turn of it.

    A chat grows at its end, so its start names it: the leading system and
    developer messages and the first user message. Claude Code's subagents and
    side requests have system prompts or first messages of their own, so they
    get keys of their own. None when there is nothing to name it by.

    >>> first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    >>> later = first + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    >>> conversation_key(first) == conversation_key(later)
    True
    >>> conversation_key([{"role": "user", "content": "another"}]) == conversation_key(first)
    False
    >>> conversation_key([]) is None
    True
    """
    if not isinstance(messages, list):
        return None
    named: list[list[str]] = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        role = message.get("role")
        text = _text_of(message.get("content"))
        if role in _LEADING_ROLES:
            named.append([str(role), text])
            continue
        if role == "user":
            named.append(["user", text])
            break
        if named:
            break  # an assistant turn before any user message: the leading part is what there is
        return None
    if not named:
        return None
    return hashlib.blake2b(orjson.dumps(named), digest_size=12).hexdigest()


# --- the pure scheduling core ------------------------------------------------------------


@dataclass(eq=False)
class Ticket:
    """One request that waits for an engine (compared by identity)."""

    conversation: str | None = None


@dataclass
class _Engine:
    name: str
    up: bool = True
    alive: bool = True
    active: int = 0
    served: int = 0  # requests it has been given
    last_used: int = 0  # when it was last given a request, on the schedule's own clock


@dataclass
class Schedule:
    """Which engine each request gets, and who waits: state and decisions only, no I/O.

    - A request goes to a free engine that is up; among free engines, the one
      that last served its conversation, else the least loaded and then the one
      used longest ago (its cached conversation is the least likely to return).
    - Requests that find no free engine wait in arrival order. A freed engine
      goes to the first in line, even when that request's own engine is busy:
      waiting for it could take a whole generation.
    - An engine that is down (starting, restarting) gets nothing until it is up.

    Each method returns the assignments it made, as (ticket, engine name), for
    the shell to hand out.
    """

    names: Sequence[str]
    max_concurrency: int = 1
    remembered: int = 4096
    """Conversations whose engine is remembered; the oldest is forgotten first."""
    _engines: dict[str, _Engine] = field(init=False)
    _waiting: list[Ticket] = field(init=False, default_factory=list)
    _affinity: OrderedDict[str, str] = field(init=False, default_factory=OrderedDict)
    _clock: itertools.count[int] = field(init=False, default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        if not self.names or len(set(self.names)) != len(self.names):
            raise ValueError("a schedule needs one or more engines with distinct names")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._engines = {name: _Engine(name) for name in self.names}

    # --- views ---

    @property
    def active(self) -> int:
        """Requests with an engine now."""
        return sum(engine.active for engine in self._engines.values())

    @property
    def waiting(self) -> int:
        """Requests in line for an engine."""
        return len(self._waiting)

    @property
    def capacity(self) -> int:
        """Requests all engines together work on at once."""
        return len(self._engines) * self.max_concurrency

    def active_on(self, name: str) -> int:
        """Requests with engine ``name`` now."""
        return self._engines[name].active

    def served_by(self, name: str) -> int:
        """Requests engine ``name`` has been given so far."""
        return self._engines[name].served

    def engine_of(self, conversation: str) -> str | None:
        """The engine that last served ``conversation``, if remembered."""
        return self._affinity.get(conversation)

    def any_alive(self) -> bool:
        """Whether some engine is up or may come up again."""
        return any(engine.alive for engine in self._engines.values())

    # --- events ---

    def arrive(self, ticket: Ticket) -> list[tuple[Ticket, str]]:
        """A request wants an engine: it gets one now, or waits in line."""
        self._waiting.append(ticket)
        return self._drain()

    def leave(self, ticket: Ticket) -> bool:
        """A waiting request gave up; False when it was not waiting (it already has an engine)."""
        try:
            self._waiting.remove(ticket)
        except ValueError:
            return False
        return True

    def release(self, name: str) -> list[tuple[Ticket, str]]:
        """A request is done with engine ``name``."""
        engine = self._engines[name]
        if engine.active < 1:
            raise ValueError(f"{name} has no request to release")
        engine.active -= 1
        return self._drain()

    def set_up(self, name: str, up: bool, *, alive: bool = True) -> list[tuple[Ticket, str]]:
        """Engine ``name`` became ready (up) or stopped serving; ``alive=False``: it will not come back."""
        engine = self._engines[name]
        engine.up = up and alive
        engine.alive = alive
        return self._drain() if engine.up else []

    def abandon_all(self) -> list[Ticket]:
        """Empty the line (no engine will serve it); the tickets, for the shell to refuse."""
        tickets, self._waiting = self._waiting, []
        return tickets

    # --- decisions ---

    def _drain(self) -> list[tuple[Ticket, str]]:
        given: list[tuple[Ticket, str]] = []
        while self._waiting:
            ticket = self._waiting[0]
            name = self._choose(ticket.conversation)
            if name is None:
                break
            self._waiting.pop(0)
            self._assign(ticket, name)
            given.append((ticket, name))
        return given

    def _choose(self, conversation: str | None) -> str | None:
        free = [e for e in self._engines.values() if e.up and e.active < self.max_concurrency]
        if not free:
            return None
        if conversation is not None:
            own = self._affinity.get(conversation)
            if own is not None and any(e.name == own for e in free):
                return own
        return min(free, key=lambda e: (e.active, e.last_used)).name

    def _assign(self, ticket: Ticket, name: str) -> None:
        engine = self._engines[name]
        engine.active += 1
        engine.served += 1
        engine.last_used = next(self._clock)
        if ticket.conversation is not None:
            self._affinity[ticket.conversation] = name
            self._affinity.move_to_end(ticket.conversation)
            while len(self._affinity) > self.remembered:
                self._affinity.popitem(last=False)


# --- the asyncio shell -------------------------------------------------------------------


@dataclass(frozen=True)
class PoolEngine:
    """One engine of a pool: where requests go, and how to wait until it is ready."""

    name: str
    target: EngineTarget | None
    ready: Ready


class EnginePool:
    """Admission for one or more engines: readiness wait, per-engine concurrency, one bounded FIFO queue.

    Engines start as up; whoever watches them calls :meth:`set_up` when one
    stops or comes back (``toolpair serve`` does so from each supervisor's
    state changes), so requests go only to engines that can serve them.
    """

    def __init__(
        self,
        engines: Sequence[PoolEngine],
        *,
        max_concurrency: int = 1,
        max_queue: int = 64,
        ready_timeout: float = 60.0,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError("max_concurrency must be at least 1 and max_queue at least 0")
        self.engines = {engine.name: engine for engine in engines}
        self.schedule = Schedule([engine.name for engine in engines], max_concurrency)
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.ready_timeout = ready_timeout
        self._pending = 0
        self._granted: dict[Ticket, asyncio.Future[str]] = {}
        self._mean_hold = 1.0  # seconds a request keeps its engine; a moving average

    @property
    def active(self) -> int:
        """Requests with an engine now."""
        return self.schedule.active

    @property
    def waiting(self) -> int:
        """Requests admitted but not yet with an engine."""
        return self._pending

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the queue ahead times the mean service time, 1 to 60."""
        ahead = (self.active + self._pending) / self.schedule.capacity
        return max(1, min(60, math.ceil(ahead * self._mean_hold)))

    def set_up(self, name: str, up: bool, *, alive: bool = True) -> None:
        """Engine ``name`` is ready (``up``) or not; ``alive=False`` when it will not be again."""
        self._hand_out(self.schedule.set_up(name, up, alive=alive))
        if not self.schedule.any_alive():
            error = EngineUnavailableError("no engine is available: every engine has stopped")
            for ticket in self.schedule.abandon_all():
                future = self._granted.pop(ticket, None)
                if future is not None and not future.done():
                    future.set_exception(error)

    def __call__(
        self, request: web.Request, conversation: str | None = None
    ) -> AbstractAsyncContextManager[EngineTarget | None]:
        return _Admitted(self, conversation)

    async def _enter(self, conversation: str | None) -> tuple[str, float]:
        """Wait for a place and a ready engine: its name, held until :meth:`_leave`, and when it was taken."""
        if self.active + self._pending >= self.schedule.capacity + self.max_queue:
            raise QueueFullError(
                f"the engine is busy and its queue is full ({self.max_queue} waiting); retry later",
                retry_after=self.retry_after(),
            )
        self._pending += 1
        arrived = time.monotonic()
        try:
            await self._wait_any_ready()
            name = await self._take(Ticket(conversation))
        finally:
            self._pending -= 1
            trace = current_trace()
            if trace is not None:
                trace.queued(time.monotonic() - arrived)
        held = time.monotonic()
        try:
            await self._wait_ready(self.engines[name].ready())
        except BaseException:
            self._leave(name, held)
            raise
        return name, held

    def _leave(self, name: str, held: float) -> None:
        """Give engine ``name`` back; ``held`` is when the request got it."""
        self._mean_hold = 0.8 * self._mean_hold + 0.2 * (time.monotonic() - held)
        self._release(name)

    async def _wait_any_ready(self) -> None:
        """Return once some engine is ready; 503 when none is within ``ready_timeout``, or none can be."""
        if len(self.engines) == 1:
            (engine,) = self.engines.values()
            await self._wait_ready(engine.ready())
            return
        tasks = [asyncio.ensure_future(engine.ready()) for engine in self.engines.values()]
        try:
            async with asyncio.timeout(self.ready_timeout):
                failure: BaseException | None = None
                for next_done in asyncio.as_completed(tasks):
                    try:
                        await next_done
                        return
                    except EngineUnavailableError as exc:
                        failure = failure or exc
                assert failure is not None
                raise failure
        except TimeoutError:
            raise self._not_ready() from None
        finally:
            for task in tasks:
                task.add_done_callback(_collect)
                task.cancel()

    async def _wait_ready(self, ready: Awaitable[None]) -> None:
        try:
            await asyncio.wait_for(ready, self.ready_timeout)
        except TimeoutError:
            raise self._not_ready() from None

    def _not_ready(self) -> EngineUnavailableError:
        return EngineUnavailableError(f"the engine did not become ready within {self.ready_timeout:g}s", retry_after=5)

    async def _take(self, ticket: Ticket) -> str:
        granted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._granted[ticket] = granted
        self._hand_out(self.schedule.arrive(ticket))
        try:
            return await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self._release(granted.result())  # the engine came just as the client left: pass it on
            else:
                self.schedule.leave(ticket)
            raise
        finally:
            self._granted.pop(ticket, None)

    def _hand_out(self, given: list[tuple[Ticket, str]]) -> None:
        for ticket, name in given:
            future = self._granted.get(ticket)
            if future is not None and not future.done():
                future.set_result(name)
            else:  # its client left (the wait was cancelled) just as the engine came: pass it on
                self._hand_out(self.schedule.release(name))

    def _release(self, name: str) -> None:
        self._hand_out(self.schedule.release(name))


class _Admitted:
    """One request's hold on an engine of ``pool``, from admission to the end of its block.

    A class rather than a generator-based context manager: entered on every request, where the
    generator's machinery costs more than the bookkeeping it wraps.
    """

    __slots__ = ("_conversation", "_held", "_name", "_pool")

    def __init__(self, pool: EnginePool, conversation: str | None) -> None:
        self._pool = pool
        self._conversation = conversation
        self._name = ""
        self._held = 0.0

    async def __aenter__(self) -> EngineTarget | None:
        pool = self._pool
        self._name, self._held = await pool._enter(self._conversation)
        return pool.engines[self._name].target

    async def __aexit__(self, *exc_info: object) -> None:
        self._pool._leave(self._name, self._held)


def _collect(task: asyncio.Future[None]) -> None:
    """Read a finished readiness wait's outcome, so asyncio does not warn that nobody did."""
    if not task.cancelled():
        task.exception()


class EngineQueue(EnginePool):
    """Admission for one engine, the app's own upstream: ``async with queue(request)`` gives None."""

    def __init__(
        self,
        ready: Ready,
        *,
        max_concurrency: int = 1,
        max_queue: int = 64,
        ready_timeout: float = 60.0,
    ) -> None:
        super().__init__(
            [PoolEngine("engine", None, ready)],
            max_concurrency=max_concurrency,
            max_queue=max_queue,
            ready_timeout=ready_timeout,
        )
