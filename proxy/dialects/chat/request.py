"""Chat Completions requests: decode, order, and decide which bytes go upstream."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from proxy._types import Body
from proxy.errors import ClientInputError
from proxy.order import OrderReport, order_chat_results

__all__ = ["ChatPlan", "decode_body", "plan_chat_request", "RESULT_MARKER"]

RESULT_MARKER = b"tool_call_id"
"""Bytes that any chat body with tool results must contain (the fast-path test)."""


def decode_body(raw: bytes) -> Body:
    """Parse a request body that must be a JSON object, or raise a 400."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ClientInputError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ClientInputError("request body must be a JSON object")
    return data


@dataclass(frozen=True)
class ChatPlan:
    """What to send upstream for one chat request.

    ``body`` is the client's own bytes whenever nothing moved.
    """

    body: bytes
    data: Body
    report: OrderReport

    @property
    def stream(self) -> bool:
        return self.data.get("stream") is True


def plan_chat_request(raw: bytes) -> ChatPlan:
    """Validate a Chat Completions body and restore call order of its result runs.

    >>> plan_chat_request(b'{"messages": []}').body
    b'{"messages": []}'
    """
    data = decode_body(raw)
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ClientInputError("'messages' must be a list", param="messages")
    if RESULT_MARKER not in raw:
        return ChatPlan(raw, data, OrderReport())
    ordered, report = order_chat_results(messages)
    if ordered is messages:
        return ChatPlan(raw, data, report)
    data = {**data, "messages": ordered}
    return ChatPlan(orjson.dumps(data), data, report)
