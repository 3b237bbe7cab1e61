"""The forwarding client: one pooled session per upstream, errors mapped once.

aiohttp client errors never leave this module. Connecting and reading the
response head raise :class:`~proxy.errors.UpstreamError` or
:class:`~proxy.errors.UpstreamTimeoutError`; so does :meth:`Upstream.chunks`
when the body breaks off. There is no total timeout, because long generations
are normal: only connecting, and silence between two reads, are bounded.

Credentials for the next hop are decided here too, once: with ``api_key`` the
engine gets ``Authorization: Bearer <api_key>`` and never the client's own
``Authorization`` or ``x-api-key``; with ``forward_credentials=False`` (toolpair
checks keys of its own) the client's are dropped and none are sent.

A managed engine can say why a connection broke (``explain_failure``: it
crashed, by which signal, and why): the 502 then says so instead of only
"Server disconnected".

Every request and response also passes the current request's
:class:`~proxy.ops.trace.Trace`, which notes time to first byte and token usage.
"""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict

from proxy.errors import UpstreamError, UpstreamTimeoutError
from proxy.ops.trace import Trace, current_trace

__all__ = ["CREDENTIAL_HEADERS", "HOP_BY_HOP", "EngineTarget", "ExplainFailure", "Upstream", "forwardable_headers"]

ExplainFailure = Callable[[str | None, float], Awaitable[str | None]]
"""Called with the engine's name (None: the only one) and the ``time.monotonic()`` a broken request
was sent at; answers why the engine went away (a crash diagnosis), or None."""


@dataclass(frozen=True)
class EngineTarget:
    """The engine one admitted request goes to (one of serve's --parallel engines)."""

    name: str
    """"engine-0", ... for logs, metrics and status."""
    base_url: str
    """e.g. http://127.0.0.1:PORT"""
    api_key: str | None


# RFC 9110 section 7.6.1 connection-specific fields, plus the ones aiohttp
# recomputes for the new hop (Host, Content-Length).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key"})
"""Where clients put their API key (OpenAI SDK: Bearer; Anthropic SDK: either)."""


def forwardable_headers(headers: Mapping[str, str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """Copy headers for the next hop, without hop-by-hop ones or those named in ``drop``.

    Also drops any header that the ``Connection`` header names, as RFC 9110 asks.
    """
    skip = HOP_BY_HOP.union(drop) if drop else HOP_BY_HOP
    connection = headers.get("connection")
    if connection:
        skip = skip | {h.strip().lower() for h in connection.split(",") if h.strip()}
    # items() of a multidict yields every value of a repeated header.
    return CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in skip])


IDLE_CONNECTION_SECONDS = 4.0
"""How long a pooled connection to the engine may sit idle before toolpair closes it.

Below the engines' own idle limit (llama-server's HTTP library and uvicorn, under vLLM, both close
an idle connection after 5 s): a connection the engine is closing just as a request is written to
it fails that request, and only the side that closes first can rule that out.
"""


class Upstream:
    """An OpenAI-compatible server that requests are forwarded to."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
        api_key: str | None = None,
        forward_credentials: bool = True,
        reuses_connections: bool = True,
        explain_failure: ExplainFailure | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._explain_failure = explain_failure
        self._target: str | None = None
        self._api_key = api_key
        self._forward_credentials = forward_credentials
        self._reuses_connections = reuses_connections
        """False for an engine whose kept-alive connections break after a failed request (see EngineProfile)."""
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the pooled session; call from inside the running event loop."""
        connector = (
            aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_CONNECTION_SECONDS, enable_cleanup_closed=True)
            if self._reuses_connections
            else aiohttp.TCPConnector(limit=0, force_close=True, enable_cleanup_closed=True)
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # a proxy must not keep one client's cookies for the next
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    def at(self, target: EngineTarget | None) -> Upstream:
        """This upstream, sending to ``target`` instead (same pooled session); itself when ``target`` is None.

        Admission picks one of several engines per request; the handler then
        talks to that engine through the returned view, with its URL and key.
        """
        if target is None:
            return self
        view = copy.copy(self)
        view.base_url = target.base_url.rstrip("/")
        view._api_key = target.api_key
        view._target = target.name
        return view

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _describe(self, exc: BaseException) -> str:
        detail = str(exc) or type(exc).__name__
        return f"upstream {self.base_url}: {detail}"

    async def _explained(self, message: str, sent_at: float) -> str:
        """``message``, led by the engine's own account of why it went away when it has one."""
        if self._explain_failure is None:
            return message
        why = await self._explain_failure(self._target, sent_at)
        return f"{why} ({message})" if why else message

    def open(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """Send a request; the block gets the response once its head has arrived.

        The response is owned by the block: on exit it is released to the pool when its body was
        read to the end, and closed (the connection dropped) otherwise.
        """
        return _Exchange(self, method, path_qs, headers, body)

    async def _send(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> aiohttp.ClientResponse:
        """Send a request and return the response once its head has arrived."""
        if self._session is None:
            raise UpstreamError(f"upstream {self.base_url} is not started")
        trace = current_trace()
        headers = self._next_hop_headers(headers, trace)
        if trace is not None:
            trace.upstream_request(body)
        sent_at = time.monotonic()
        try:
            return await self._session.request(
                method, self.base_url + path_qs, headers=headers, data=body, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeoutError(f"upstream {self.base_url} did not answer in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(f"upstream {self.base_url} is unreachable: {exc.strerror or exc}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(await self._explained(self._describe(exc), sent_at)) from exc

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        """The whole body; a broken or silent upstream raises an UpstreamError.

        One ``response.read()`` and one feed of the usage watch: for the small whole replies read
        this way, two async generators around ``iter_any`` cost more than the read itself.
        """
        trace = current_trace()
        watch = None if trace is None else trace.watch(response.content_type, response.headers.get("Content-Encoding"))
        reading_from = time.monotonic()
        try:
            body = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise await self._broken_off(exc, reading_from) from exc
        if watch is not None:
            watch.feed(body)
        return body

    async def _broken_off(self, exc: BaseException, reading_from: float) -> UpstreamError:
        """The error for a body that stopped coming: silence, or a broken connection."""
        if isinstance(exc, (TimeoutError, aiohttp.ServerTimeoutError)):
            return UpstreamTimeoutError(f"upstream {self.base_url} stopped sending")
        message = f"upstream {self.base_url} broke off the response: {exc}"
        return UpstreamError(await self._explained(message, reading_from))

    def _next_hop_headers(self, headers: Mapping[str, str], trace: Trace | None) -> Mapping[str, str]:
        """The caller's headers with this upstream's credential policy and the request id applied."""
        if self._api_key is None and self._forward_credentials and trace is None:
            return headers
        out = CIMultiDict(headers)
        if self._api_key is not None or not self._forward_credentials:
            for name in CREDENTIAL_HEADERS:
                out.popall(name, None)
        if self._api_key is not None:
            out["Authorization"] = f"Bearer {self._api_key}"
        if trace is not None:
            out["X-Request-ID"] = trace.request_id
        return out

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Yield the body as it arrives; a broken or silent upstream raises an UpstreamError."""
        trace = current_trace()
        watch = None if trace is None else trace.watch(response.content_type, response.headers.get("Content-Encoding"))
        reading_from = time.monotonic()
        try:
            async for chunk in response.content.iter_any():
                if watch is not None:
                    watch.feed(chunk)
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise await self._broken_off(exc, reading_from) from exc


class _Exchange:
    """The block of :meth:`Upstream.open`: owns the response from its head to the block's end.

    A class rather than a generator-based context manager: entered for every request, where the
    generator's machinery costs more than what it wraps.
    """

    __slots__ = ("_body", "_headers", "_method", "_path_qs", "_response", "_upstream")

    def __init__(
        self, upstream: Upstream, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> None:
        self._upstream = upstream
        self._method = method
        self._path_qs = path_qs
        self._headers = headers
        self._body = body
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._response = await self._upstream._send(self._method, self._path_qs, self._headers, self._body)
        return self._response

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        response = self._response
        assert response is not None
        if exc_type is None and response.content.at_eof():
            response.release()
        else:
            response.close()
