"""Errors that toolpair itself produces, and their shape in each client dialect.

Exception tree (each knows its HTTP status and error type)::

    ToolpairError                 root; never escapes a handler
    ├── ClientInputError          400  the request body is not usable
    │   ├── BodyTooLargeError     413  the body is over max_body_bytes
    │   ├── BodyTimeoutError      408  the body did not arrive within body_read_timeout
    │   ├── NotFoundError         404  the request names something toolpair does not hold
    │   └── PromptTooLongError    400  the engine's context cannot hold the prompt
    ├── UpstreamError             502  the upstream failed or answered garbage
    │   ├── UpstreamTimeoutError  504  the upstream did not answer in time
    │   └── UpstreamStatusError   4xx/5xx  the engine refused a translated request
    ├── EngineUnavailableError    503  the managed engine is not ready
    ├── QueueFullError            429  the managed engine's queue is full
    ├── StoreUnavailableError     503  the shared Responses store (Redis) cannot be reached
    └── AuthenticationError       401  no API key, or not one of toolpair's keys

Each error is turned into bytes in exactly one place, :func:`error_body`, in
the dialect of the route the client called (a Responses stream that already
started reports it in-band instead, as the ``error`` of a failed Response:
:func:`response_error`). Bodies carry ``"source":
"toolpair"`` so an operator can tell our errors from the engine's.
"""

from __future__ import annotations

from enum import StrEnum

import orjson

__all__ = [
    "AuthenticationError",
    "BodyTimeoutError",
    "BodyTooLargeError",
    "ClientInputError",
    "Dialect",
    "EngineUnavailableError",
    "NotFoundError",
    "PromptTooLongError",
    "QueueFullError",
    "StoreUnavailableError",
    "ToolpairError",
    "UpstreamError",
    "UpstreamStatusError",
    "UpstreamTimeoutError",
    "dialect_for_path",
    "error_body",
    "error_event",
    "response_error",
]


class Dialect(StrEnum):
    """The API family a route speaks, which decides the error shape."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"


def dialect_for_path(path: str) -> Dialect:
    """The dialect a request path speaks, from its first segment after an optional ``/v1``.

    Used where no handler has claimed the request yet (authentication), so a
    refusal is still in the client's own error shape.

    >>> dialect_for_path("/v1/messages/count_tokens"), dialect_for_path("/v1/responses")
    (<Dialect.ANTHROPIC: 'anthropic'>, <Dialect.RESPONSES: 'responses'>)
    >>> dialect_for_path("/v1/chat/completions"), dialect_for_path("/v1/messagesx")
    (<Dialect.OPENAI: 'openai'>, <Dialect.OPENAI: 'openai'>)
    """
    segments = path.split("/")
    first = segments[2] if len(segments) > 2 and segments[1] == "v1" else segments[1] if len(segments) > 1 else ""
    if first == "messages":
        return Dialect.ANTHROPIC
    if first == "responses":
        return Dialect.RESPONSES
    return Dialect.OPENAI


class ToolpairError(Exception):
    """Raised when toolpair must answer with an error of its own."""

    status = 500
    openai_type = "server_error"
    anthropic_type = "api_error"
    code = "internal_error"
    retry_after: int | None = None
    """Seconds, sent as ``Retry-After`` when set."""

    quotes_engine = False
    """The message holds the engine's own words, which may quote the prompt: logged only via proxy.privacy."""

    def __init__(self, message: str, *, param: str | None = None, quotes_engine: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.quotes_engine = quotes_engine


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


class BodyTimeoutError(ClientInputError):
    """Raised when the request body does not fully arrive within ``body_read_timeout``."""

    status = 408
    code = "body_timeout"


class NotFoundError(ClientInputError):
    """Raised when a request names a stored object that is unknown here (e.g. a previous response)."""

    status = 404
    anthropic_type = "not_found_error"
    code = "not_found"

    def __init__(self, message: str, *, param: str | None = None, code: str = "not_found") -> None:
        super().__init__(message, param=param)
        self.code = code


class PromptTooLongError(ClientInputError):
    """Raised when the engine refuses a prompt longer than its context window.

    The message is Anthropic's own wording, ``prompt is too long: N tokens > M
    maximum``, which is what makes Claude Code compact its history.
    """

    code = "prompt_too_long"

    def __init__(self, prompt_tokens: int, limit: int) -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens > {limit} maximum", param="messages")
        self.prompt_tokens = prompt_tokens
        self.limit = limit


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


# Anthropic's error type for each status it documents; other 4xx are
# invalid_request_error and other 5xx api_error.
_ANTHROPIC_STATUS_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class UpstreamStatusError(UpstreamError):
    """Raised when the engine answers a request that toolpair translated with an error status.

    The engine's status and message are kept, so the client sees what went
    wrong, in its own dialect.
    """

    code = "upstream_status"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message, quotes_engine=True)
        self.status = status
        if status < 500:
            self.openai_type = "invalid_request_error"
        self.anthropic_type = _ANTHROPIC_STATUS_TYPES.get(
            status, "invalid_request_error" if status < 500 else "api_error"
        )


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


class StoreUnavailableError(ToolpairError):
    """Raised when a request needs the shared Responses store and Redis does not answer.

    Only requests that read or write stored responses get it; the rest keep working.
    """

    status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"
    code = "store_unavailable"
    retry_after = 2


class AuthenticationError(ToolpairError):
    """Raised when a request carries no API key, or one that toolpair does not accept."""

    status = 401
    openai_type = "invalid_request_error"
    anthropic_type = "authentication_error"
    code = "invalid_api_key"


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
    object carries ``error``, which the OpenAI SDK raises on. A Responses stream
    relayed from an engine gets the API's ``error`` event, which also carries
    ``error`` for the SDK (the stream's sequence numbers belong to the engine).
    """
    if dialect is Dialect.ANTHROPIC:
        return b"event: error\ndata: " + error_body(error, dialect) + b"\n\n"
    if dialect is Dialect.RESPONSES:
        inner = _error_object(error, dialect)
        event = {"type": "error", "code": error.code, "message": error.message, "param": error.param, "error": inner}
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
    return b"data: " + error_body(error, dialect) + b"\n\n"


def response_error(error: ToolpairError) -> dict[str, object]:
    """The ``error`` object of a failed Response, for failures after a Responses stream began.

    >>> response_error(UpstreamError("engine gone"))["code"]
    'server_error'
    """
    return {
        "code": "server_error" if error.status >= 500 else "invalid_prompt",
        "message": error.message,
        "param": error.param,
        "type": error.openai_type,
        "source": "toolpair",
    }
