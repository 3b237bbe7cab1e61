"""Chat Completions requests: decode, order, adapt to the engine, and decide which bytes go upstream."""

from __future__ import annotations

from typing import NamedTuple

import orjson

from proxy._types import Body
from proxy.engine.adapt import adapt_chat_request
from proxy.engine.model_names import NO_NAMES, ModelNames, ModelPlan, with_model
from proxy.engine.plan import EngineSetup, ReplyPlan, reply_plan
from proxy.engine.thinking import chat_switch, with_switch
from proxy.errors import ClientInputError
from proxy.order import NO_RUNS, OrderReport, order_chat_results

__all__ = ["ChatPlan", "EnginePlan", "decode_body", "plan_chat_request", "plan_engine_request", "RESULT_MARKER"]

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


class ChatPlan(NamedTuple):
    """What to send upstream for one chat request.

    ``body`` is the client's own bytes whenever nothing moved. A named tuple, not a dataclass: one is
    made per request, and a frozen dataclass sets each field with a call of its own.
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
        return ChatPlan(raw, data, NO_RUNS)
    ordered, report = order_chat_results(messages)
    if ordered is messages:
        return ChatPlan(raw, data, report)
    data = {**data, "messages": ordered}
    return ChatPlan(orjson.dumps(data), data, report)


class EnginePlan(NamedTuple):
    """One chat request, ready for the engine.

    ``body`` is the client's own bytes whenever neither ordering nor
    adaptation changed anything. A named tuple, as :class:`ChatPlan`.
    """

    body: bytes
    data: Body
    order: OrderReport
    adapted: tuple[str, ...]
    """Names of the adaptation rules that changed the request."""
    reply: ReplyPlan | None
    model: ModelPlan
    """The model name the engine gets; when it is not the client's, the answer names the client's again."""


def plan_engine_request(raw: bytes, setup: EngineSetup, names: ModelNames = NO_NAMES) -> EnginePlan:
    """Validate, order, name the model (``names``), adapt; decide how the reply is treated.

    >>> from proxy.engine.plan import GENERIC
    >>> plan = plan_engine_request(b'{"messages": [{"role": "developer", "content": "hi"}]}', GENERIC)
    >>> plan.body, plan.reply
    (b'{"messages": [{"role": "developer", "content": "hi"}]}', None)
    """
    chat = plan_chat_request(raw)
    model = names.plan(chat.data)
    data, adapted = adapt_chat_request(with_model(chat.data, model), setup.profile)
    if setup.profile.template_kwargs:  # reasoning_effort also as the template's switch (the client's kwargs win)
        switched = with_switch(data, chat_switch(data))
        if switched is not data:
            data, adapted = switched, (*adapted, "thinking_switch")
    body = chat.body if data is chat.data else orjson.dumps(data)
    return EnginePlan(body, data, chat.report, adapted, reply_plan(data, setup), model)
