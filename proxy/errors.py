"""Errors that toolpair itself produces, and their shape in each client dialect.

Exception tree (each knows its HTTP status and error type)::

    ToolpairError                 root; never escapes a handler
    ├── ClientInputError          400  the request body is not usable
    │   └── BodyTooLargeError     413  the body is over max_body_bytes
    ├── UpstreamError             502  the upstream failed or answered garbage
    │   ├── UpstreamTimeoutError  504  the upstream did not answer in time
    │   └── UpstreamStatusError   4xx/5xx  the engine refused a translated request
    ├── EngineUnavailableError    503  the managed engine is not ready
    └── QueueFullError            429  the managed engine's queue is full

Each error is turned into bytes in exactly one place, :func:`error_body`, in
the dialect of the route the client called. Bodies carry ``"source":
"toolpair"`` so an operator can tell our errors from the engine's.
"""

from __future__ import annotations

from enum import StrEnum

import orjson

__all__ = [
    "BodyTooLargeError",
    "ClientInputError",
    "Dialect",
    "EngineUnavailableError",
    "QueueFullError",
    "ToolpairError",
    "UpstreamError",
    "UpstreamStatusError",
    "UpstreamTimeoutError",
    "error_body",
    "error_event",
]


class Dialect(StrEnum):
    """The API family a route speaks, which decides the error shape."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"


class ToolpairError(Exception):
    """Raised when toolpair must answer with an error of its own."""

    status = 500
    openai_type = "server_error"
    anthropic_type = "api_error"
    code = "internal_error"
    retry_after: int | None = None
    """Seconds, sent as ``Retry-After`` when set."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ClientInputError(ToolpairError):
    """Raised when the request body cannot be decoded or has the wrong shape."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "invalid_request"


class BodyTooLargeError(ClientInputError):
    """Raised when the body is larger than ``max_body_bytes``."""

    status = 413
    anthropic_type = "request_too_large"
    code = "body_too_large"


class UpstreamError(ToolpairError):
    """Raised when the upstream refuses the connection, breaks it or is unreachable."""

    status = 502
    openai_type = "upstream_error"
    anthropic_type = "api_error"
    code = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    """Raised when connecting to, or reading from, the upstream takes too long."""

    status = 504
    code = "upstream_timeout"


class UpstreamStatusError(UpstreamError):
    """Raised when the engine answers a request that toolpair translated with an error status.

    The engine's status and message are kept, so the client sees what went
    wrong, in its own dialect.
    """

    code = "upstream_status"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
        if status < 500:
            self.openai_type = "invalid_request_error"
            self.anthropic_type = "not_found_error" if status == 404 else "invalid_request_error"


class EngineUnavailableError(ToolpairError):
    """Raised when the managed engine is starting, restarting or has given up."""

    status = 503
    openai_type = "engine_unavailable"
    anthropic_type = "overloaded_error"
    code = "engine_unavailable"

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFullError(ToolpairError):
    """Raised when a request finds the engine's waiting queue full (``max_queue``)."""

    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _error_object(error: ToolpairError, dialect: Dialect) -> dict[str, object]:
    if dialect is Dialect.ANTHROPIC:
        return {"type": error.anthropic_type, "message": error.message, "source": "toolpair"}
    return {
        "message": error.message,
        "type": error.openai_type,
        "param": error.param,
        "code": error.code,
        "source": "toolpair",
    }


def error_body(error: ToolpairError, dialect: Dialect) -> bytes:
    """The JSON body for an error response, in the client's dialect.

    >>> error_body(ClientInputError("bad"), Dialect.ANTHROPIC)[:40]
    b'{"type":"error","error":{"type":"invalid'
    """
    if dialect is Dialect.ANTHROPIC:
        return orjson.dumps({"type": "error", "error": _error_object(error, dialect)})
    return orjson.dumps({"error": _error_object(error, dialect)})


def error_event(error: ToolpairError, dialect: Dialect) -> bytes:
    """A complete SSE frame reporting a failure in the middle of a stream.

    Chat Completions has no error event, so the frame is a ``data:`` line whose
    object carries ``error``, which the OpenAI SDK raises on.
    """
    if dialect is Dialect.ANTHROPIC:
        return b"event: error\ndata: " + error_body(error, dialect) + b"\n\n"
    return b"data: " + error_body(error, dialect) + b"\n\n"
