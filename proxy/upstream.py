"""The forwarding client: one pooled session per upstream, errors mapped once.

aiohttp client errors never leave this module. Connecting and reading the
response head raise :class:`~proxy.errors.UpstreamError` or
:class:`~proxy.errors.UpstreamTimeoutError`; so does :meth:`Upstream.chunks`
when the body breaks off. There is no total timeout, because long generations
are normal: only connecting, and silence between two reads, are bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping

import aiohttp
from multidict import CIMultiDict

from proxy.errors import UpstreamError, UpstreamTimeoutError

__all__ = ["HOP_BY_HOP", "Upstream", "forwardable_headers"]

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


def forwardable_headers(headers: Mapping[str, str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """Copy headers for the next hop, without hop-by-hop ones or those named in ``drop``.

    Also drops any header that the ``Connection`` header names, as RFC 9110 asks.
    """
    named = {h.strip().lower() for h in headers.get("connection", "").split(",") if h.strip()}
    skip = HOP_BY_HOP | named | {h.lower() for h in drop}
    # items() of a multidict yields every value of a repeated header.
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skip)


class Upstream:
    """An OpenAI-compatible server that requests are forwarded to.

    With ``api_key`` set, every request carries ``Authorization: Bearer
    <api_key>`` instead of the client's credentials, and no ``x-api-key``: the
    engine's key is toolpair's, not the client's.
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=read_timeout)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the pooled session; call from inside the running event loop."""
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _describe(self, exc: BaseException) -> str:
        detail = str(exc) or type(exc).__name__
        return f"upstream {self.base_url}: {detail}"

    async def open(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> aiohttp.ClientResponse:
        """Send a request and return the response once its head has arrived.

        The caller owns the response and must ``close()`` or ``release()`` it.
        """
        if self._session is None:
            raise UpstreamError(f"upstream {self.base_url} is not started")
        if self._api_key is not None:
            headers = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in ("authorization", "x-api-key"))
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            return await self._session.request(
                method, self.base_url + path_qs, headers=headers, data=body, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeoutError(f"upstream {self.base_url} did not answer in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(f"upstream {self.base_url} is unreachable: {exc.strerror or exc}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(self._describe(exc)) from exc

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """Yield the body as it arrives; a broken or silent upstream raises an UpstreamError."""
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeoutError(f"upstream {self.base_url} stopped sending") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream {self.base_url} broke off the response: {exc}") from exc
