"""HTTP/1.1 over a bare socket, for requests that a well-behaved client library refuses to send.

:func:`exchange` writes any bytes (while reading, so a server may answer before a
large body is sent) and reads one response: the head, then a body delimited by
``Content-Length``, by chunked encoding, or by the end of the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Reply", "exchange", "request"]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes
    seconds: float
    head: bytes


def request(
    method: str,
    target: str,
    body: bytes | None = b"",
    headers: Iterable[tuple[str, str]] = (),
    *,
    length: int | None = None,
) -> bytes:
    """A request with ``Connection: close``; ``length`` announces a Content-Length other than the body's.

    ``body=None`` sends no Content-Length at all.
    """
    lines = [f"{method} {target} HTTP/1.1", "Host: toolpair.test", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def chunked(body: bytes, size: int = 1 << 20) -> bytes:
    """``body`` in chunked transfer encoding."""
    pieces = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return bytes(body)
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    return await reader.read()


async def exchange(address: tuple[str, int], data: bytes, deadline: float = 10.0) -> Reply:
    """Send ``data`` and read one response within ``deadline`` seconds."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(*address, limit=1 << 20)

    async def send() -> None:
        # The server may answer and close before all of a large body is sent.
        with contextlib.suppress(ConnectionError):
            for start in range(0, len(data), 1 << 20):
                writer.write(data[start : start + (1 << 20)])
                await writer.drain()

    sending = asyncio.create_task(send())
    try:
        async with asyncio.timeout(deadline):
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await _read_body(reader, headers)
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return Reply(status, headers, body, time.monotonic() - started, head)
