"""Text that may quote a prompt or a reply reaches a log line only while body logging is on.

Model output (a malformed tool call, arguments that are not JSON) and the
engine's own error messages can carry the user's text: llama-cpp-python's
validation errors quote the request they refuse. Log lines say such text
through :func:`private`, which shows it only while ``log_bodies`` is on for the
request being served, and otherwise only its size. The access middleware sets
that per request (:func:`show_bodies`).
"""

from __future__ import annotations

from contextvars import ContextVar, Token

from proxy.errors import ToolpairError

__all__ = ["hide_bodies", "log_message", "private", "show_bodies"]

_SHOWN: ContextVar[bool] = ContextVar("toolpair_bodies_shown", default=False)


def private(text: str) -> str:
    """``text`` while body logging is on, else only its size.

    >>> private("the user's text")
    '<15 characters: log_bodies shows them>'
    """
    return text if _SHOWN.get() else f"<{len(text)} characters: log_bodies shows them>"


def log_message(error: ToolpairError) -> str:
    """What a log line may say about ``error``: the engine's own words only through :func:`private`."""
    return private(error.message) if error.quotes_engine else error.message


def show_bodies(shown: bool) -> Token[bool]:
    """Whether the request being served logs bodies; pass the result to :func:`hide_bodies`."""
    return _SHOWN.set(shown)


def hide_bodies(token: Token[bool]) -> None:
    _SHOWN.reset(token)
