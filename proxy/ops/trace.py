"""What one request did, noted as it happens and read once when it ends.

The access middleware (:mod:`proxy.ops.access`) opens a :class:`Trace` for every
request and, when the handler returns, turns it into one access log line and
the Prometheus samples. Everything in between only *notes* facts on it:

- handlers: ``trace_of(request).order(api, report)`` for each ordering pass;
- the admission seam: ``trace_of(request).queued(seconds)``;
- tool-call extraction: ``note_toolcalls(extracted, failed)``;
- the upstream client: :meth:`Trace.upstream_request` and
  :meth:`Trace.watch`, for time to first byte, token usage and (only with
  ``log_bodies``) the bodies.

The upstream client is shared by all requests and never sees the aiohttp
request, so the middleware also publishes the trace in a context variable,
:func:`current_trace`. It is read for observation only, never to decide what
a request does.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field

from aiohttp import web

from proxy.ops.usage import Usage, UsageScanner
from proxy.order import OrderReport

__all__ = [
    "BODY_LOG_LIMIT",
    "TRACE",
    "ResponseWatch",
    "Trace",
    "bind",
    "current_trace",
    "note_toolcalls",
    "trace_of",
    "unbind",
]

BODY_LOG_LIMIT = 64 * 1024
"""Bytes of each body kept for the log when ``log_bodies`` is on."""


class ResponseWatch:
    """Observes one upstream response body: first byte, usage, and optionally the body itself."""

    __slots__ = ("_body", "_scanner", "_trace")

    def __init__(self, trace: Trace, scan_usage: bool, keep_body: bool) -> None:
        self._trace = trace
        self._scanner = UsageScanner() if scan_usage else None
        self._body = bytearray() if keep_body else None

    def feed(self, chunk: bytes) -> None:
        if self._trace.first_byte_at is None:
            self._trace.first_byte_at = time.monotonic()
        if self._scanner is not None:
            self._scanner.feed(chunk)
        if self._body is not None and len(self._body) < BODY_LOG_LIMIT:
            self._body += chunk[: BODY_LOG_LIMIT - len(self._body)]

    def usage(self) -> Usage | None:
        return self._scanner.result() if self._scanner is not None else None

    @property
    def body(self) -> bytes | None:
        return bytes(self._body) if self._body is not None else None


@dataclass(slots=True)
class Trace:
    """Facts about one request; see the module docstring for who notes what."""

    request_id: str
    keep_bodies: bool = False
    started: float = field(default_factory=time.monotonic)
    orders: list[tuple[str, OrderReport]] = field(default_factory=list)
    queue_wait: float | None = None
    toolcalls_extracted: int = 0
    toolcalls_failed: int = 0
    upstream_sent_at: float | None = None
    first_byte_at: float | None = None
    sent_body: bytes | None = None
    watches: list[ResponseWatch] = field(default_factory=list)

    def order(self, api: str, report: OrderReport) -> None:
        """Note one ordering pass; ``api`` is ``chat``, ``anthropic`` or ``responses``."""
        self.orders.append((api, report))

    def queued(self, seconds: float) -> None:
        """Note how long the request waited for admission (queue or engine start)."""
        self.queue_wait = (self.queue_wait or 0.0) + seconds

    def toolcalls(self, extracted: int, failed: int = 0) -> None:
        """Note tool calls parsed out of model text, and call texts that could not be parsed."""
        self.toolcalls_extracted += extracted
        self.toolcalls_failed += failed

    def upstream_request(self, body: bytes | None) -> None:
        """Note that a request is going upstream now (the first one starts the TTFB clock)."""
        if self.upstream_sent_at is None:
            self.upstream_sent_at = time.monotonic()
        if self.keep_bodies and body is not None and self.sent_body is None:
            self.sent_body = body[:BODY_LOG_LIMIT]

    def watch(self, content_type: str, content_encoding: str | None) -> ResponseWatch:
        """Start observing an upstream response body; usage is read from uncompressed JSON and SSE."""
        readable = content_encoding in (None, "", "identity")
        scan = readable and (content_type == "text/event-stream" or content_type.endswith("json"))
        watch = ResponseWatch(self, scan, self.keep_bodies)
        self.watches.append(watch)
        return watch

    @property
    def report(self) -> OrderReport:
        """Every ordering pass of the request, merged."""
        merged = OrderReport()
        for _, report in self.orders:
            merged = merged.merged(report)
        return merged

    @property
    def upstream_ttfb(self) -> float | None:
        """Seconds from the first upstream request to the first body byte back."""
        if self.upstream_sent_at is None or self.first_byte_at is None:
            return None
        return max(0.0, self.first_byte_at - self.upstream_sent_at)

    def usage(self) -> Usage | None:
        """Tokens over every upstream response of the request."""
        total: Usage | None = None
        for watch in self.watches:
            usage = watch.usage()
            if usage is not None:
                total = usage if total is None else total + usage
        return total


TRACE = web.RequestKey("toolpair.trace", Trace)
_CURRENT: ContextVar[Trace | None] = ContextVar("toolpair_trace", default=None)


def trace_of(request: web.Request) -> Trace:
    """The request's trace; a detached one when no access middleware runs (notes then go nowhere)."""
    try:
        return request[TRACE]  # one lookup: Request.get is MutableMapping's, two Python calls
    except KeyError:
        trace = request[TRACE] = Trace(request_id="-")
        return trace


def current_trace() -> Trace | None:
    """The trace of the request this task serves, for code that does not see the request."""
    return _CURRENT.get()


def bind(trace: Trace) -> Token[Trace | None]:
    """Publish ``trace`` as the current one; pass the result to :func:`unbind`."""
    return _CURRENT.set(trace)


def unbind(token: Token[Trace | None]) -> None:
    _CURRENT.reset(token)


def note_toolcalls(extracted: int, failed: int = 0) -> None:
    """Count extracted tool calls for the current request, if there is one."""
    trace = _CURRENT.get()
    if trace is not None:
        trace.toolcalls(extracted, failed)
