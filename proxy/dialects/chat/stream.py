"""Chat Completions as a stream dialect: chunk dicts in, ``data:`` frames out, ``[DONE]`` last."""

from __future__ import annotations

import orjson

from proxy._types import Body
from proxy.errors import Dialect, ToolpairError, error_event
from proxy.sse import encode_event

__all__ = ["ChatStream"]

_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keepalive\n\n"


class ChatStream:
    """The Chat dialect for :func:`proxy.http.streaming.stream_reply`.

    Its ping is an SSE comment, sent when the engine sends bytes that complete no chunk (a ping of
    its own, part of a frame), so a client's read timeout sees the engine is alive.

    >>> s = ChatStream(); s.feed({"choices": []}) + s.finish()
    b'data: {"choices":[]}\\n\\ndata: [DONE]\\n\\n'
    """

    done = False

    def start(self) -> bytes:
        return b""

    def ping(self) -> bytes:
        return _KEEPALIVE

    def feed(self, chunk: Body) -> bytes:
        return encode_event(orjson.dumps(chunk))

    def finish(self) -> bytes:
        return _DONE

    def fail(self, error: ToolpairError) -> bytes:
        return error_event(error, Dialect.OPENAI)
