"""FIFO admission to an engine that serves a few requests at a time.

llama-cpp-python serves one completion at a time, and by default a new
request interrupts the running stream. toolpair turns interruption off and
queues instead: at most ``max_concurrency`` requests are with the engine, at
most ``max_queue`` more wait, first come first served. A request past that gets
429 with ``Retry-After``. A client that disconnects while it waits (aiohttp
cancels its handler) leaves the queue and frees its place.

The queue also waits for the engine: a request arriving while the engine
starts or restarts waits up to ``ready_timeout`` seconds for it, then gets 503.
Readiness is awaited before a slot is taken (so a failed start answers every
waiting request at the same time, not one timeout after another) and again once
the slot is held (the engine may have crashed meanwhile).

Used as the app's ``ADMISSION``: ``async with queue(request): ...`` around the
upstream call, response included.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from aiohttp import web

from proxy.errors import EngineUnavailableError, QueueFullError
from proxy.ops.trace import current_trace

__all__ = ["EngineQueue"]

Ready = Callable[[], Awaitable[None]]
"""Returns once the engine is ready; raises EngineUnavailableError when it cannot be."""


class EngineQueue:
    """Admission for one engine: readiness wait, concurrency limit, bounded FIFO queue."""

    def __init__(
        self,
        ready: Ready,
        *,
        max_concurrency: int = 1,
        max_queue: int = 64,
        ready_timeout: float = 60.0,
    ) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError("max_concurrency must be at least 1 and max_queue at least 0")
        self._ready = ready
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.ready_timeout = ready_timeout
        self._active = 0
        self._pending = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._mean_hold = 1.0  # seconds a request keeps its slot; a moving average

    @property
    def active(self) -> int:
        """Requests with the engine now."""
        return self._active

    @property
    def waiting(self) -> int:
        """Requests admitted but not yet with the engine."""
        return self._pending

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the queue ahead times the mean service time, 1 to 60."""
        ahead = (self._active + self._pending) / self.max_concurrency
        return max(1, min(60, math.ceil(ahead * self._mean_hold)))

    def __call__(self, request: web.Request) -> AbstractAsyncContextManager[None]:
        return self._admit()

    @asynccontextmanager
    async def _admit(self) -> AsyncIterator[None]:
        if self._active + self._pending >= self.max_concurrency + self.max_queue:
            raise QueueFullError(
                f"the engine is busy and its queue is full ({self.max_queue} waiting); retry later",
                retry_after=self.retry_after(),
            )
        self._pending += 1
        arrived = time.monotonic()
        try:
            await self._wait_ready()
            await self._take_slot()
        finally:
            self._pending -= 1
            trace = current_trace()
            if trace is not None:
                trace.queued(time.monotonic() - arrived)
        held = time.monotonic()
        try:
            await self._wait_ready()
            yield
        finally:
            self._mean_hold = 0.8 * self._mean_hold + 0.2 * (time.monotonic() - held)
            self._release()

    async def _wait_ready(self) -> None:
        try:
            await asyncio.wait_for(self._ready(), self.ready_timeout)
        except TimeoutError:
            raise EngineUnavailableError(
                f"the engine did not become ready within {self.ready_timeout:g}s", retry_after=5
            ) from None

    async def _take_slot(self) -> None:
        if self._active < self.max_concurrency and not self._waiters:
            self._active += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot came just as the client left: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes straight to the next in line
                return
        self._active -= 1
