"""Log output: text for people, JSON lines for collectors, request ids on every line.

``setup_logging`` installs one handler on the root logger, so toolpair's lines,
aiohttp's and the engine's (when toolpair runs it) share one format. Every
record made while a request is served carries that request's id.

Structured fields go in ``extra={"fields": {...}}``: the JSON format puts them
at the top level of the line, the text format appends them as ``key=value``
(skipping ``None`` values and the keys named in ``extra={"summarized": (...)}``,
which the message already says).
What goes into a line is chosen by the caller; this module adds no request
data of its own, so nothing here can leak a key or a prompt.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
from aiohttp.http_exceptions import BadHttpMessage

from proxy.config import ConfigError, LogFormat, choices
from proxy.ops.trace import current_trace

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "TextFormatter",
    "accept_request_id",
    "log_handler",
    "one_line",
    "setup_logging",
]

LOG_FORMATS = tuple(choices(LogFormat))

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:+=/-]{1,128}")


def accept_request_id(value: str | None) -> str:
    """The client's ``X-Request-ID`` when it is short and plain, else a fresh one.

    Bounded length and a small alphabet keep a client from writing control
    characters, quotes or megabytes into every log line.

    >>> accept_request_id("req-42.a:b")
    'req-42.a:b'
    >>> len(accept_request_id("bad id\\n")), len(accept_request_id(None))
    (32, 32)
    """
    if value is not None and _REQUEST_ID.fullmatch(value):
        return value
    return os.urandom(16).hex()  # as random as uuid4().hex, without building a UUID per request


class _RequestIdFilter(logging.Filter):
    """Stamps each record with the id of the request being served, if any."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            trace = current_trace()
            record.request_id = trace.request_id if trace is not None else None
        return True


class _ClientProtocolErrors(logging.Filter):
    """A request that is not valid HTTP: one line at info level, not an error with a traceback.

    aiohttp's server logs each one as ``Error handling request`` with the parser's
    traceback, so any client could fill the log with error-level tracebacks of its
    own making. The parser's message says everything that matters.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if record.name != "aiohttp.server" or not isinstance(error, BadHttpMessage):
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "refused a request that is not valid HTTP: %s", (" ".join(str(error).split()),)
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line["request_id"] = request_id
        for key, value in _fields(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


# C0 controls (tab aside) and DEL: a line break in a logged value (a request path, a client's
# tool name) would let the client start a forged log line of its own.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def one_line(text: str) -> str:
    """``text`` with control characters escaped, so it cannot split or forge a log line.

    >>> print(one_line("GET /a\\r\\n2026-01-01 INFO fake line"))
    GET /a\\r\\n2026-01-01 INFO fake line
    """
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [request id] key=value ...``, always one line (tracebacks aside)."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{_timestamp(record)} {record.levelname} {record.name}: {one_line(record.getMessage())}"]
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            parts.append(f"[{request_id}]")
        skip = getattr(record, "summarized", ())
        parts += [f"{k}={one_line(_text(v))}" for k, v in _fields(record).items() if v is not None and k not in skip]
        text = " ".join(parts)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


class _Handler(logging.StreamHandler[TextIO]):
    """The handler setup_logging installs; a second call replaces it instead of doubling lines."""


def log_handler(fmt: str, stream: TextIO | None = None) -> logging.Handler:
    """A handler writing ``fmt`` lines, with request ids, to ``stream`` (stderr)."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    handler.addFilter(_ClientProtocolErrors())
    return handler


def setup_logging(level: str, fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Send every logger's records to ``stream`` (stderr) in ``fmt``; returns the handler."""
    handler = log_handler(fmt, stream)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
