"""Anthropic Messages <-> Chat Completions: requests, responses, stream events.

Everything toolpair does to an Anthropic request or answer is in this file,
as pure functions and one stream transducer:

- :func:`plan_translation` / :func:`plan_native`: decode, normalize the
  billing stamp, put tool results into call order, and either translate to a
  Chat Completions body (one small function per part: :func:`system_messages`,
  :func:`user_turn`, :func:`assistant_message`, :func:`tool_message`,
  :func:`chat_tools`, :func:`tool_choice_fields`, :func:`sampling_fields`,
  :func:`thinking_fields`) or keep the Anthropic body for an engine that
  speaks it.
- :class:`MessageEvents`: ``chat.completion.chunk`` dicts in, Anthropic stream
  events out, following the documented grammar (``message_start``, ``ping``,
  per block ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
  ``message_stop``). Stop sequences are matched here, on the generated text.
  :class:`MessageFrames` is the same transducer with SSE frames out.
- :class:`MessageAccumulator`: Anthropic events in, the final message out, as
  the anthropic SDK's ``accumulate_event`` builds it; an impossible order raises.
  :func:`message_from_completion` is a non-stream completion put through both.
- :func:`context_overflow` and :func:`native_error`: engine errors as
  Anthropic errors, an overflowing context as ``prompt is too long``.

Spec: https://docs.anthropic.com/en/api/messages and
https://docs.anthropic.com/en/docs/build-with-claude/streaming.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy._types import Body, Message, Messages
from proxy.dialects.chat.request import decode_body
from proxy.engine.stop_sequences import StopMatcher
from proxy.errors import ClientInputError, PromptTooLongError, ToolpairError, UpstreamError, UpstreamStatusError
from proxy.ops.privacy import private
from proxy.order import OrderReport, order_anthropic_results
from proxy.sse import encode_event

__all__ = [
    "Event",
    "MessageAccumulator",
    "MessageEvents",
    "MessageFrames",
    "NativePlan",
    "TranslationPlan",
    "assistant_message",
    "chat_tools",
    "context_overflow",
    "message_from_completion",
    "native_error",
    "new_message_id",
    "normalize_billing_stamp",
    "plan_native",
    "plan_translation",
    "sampling_fields",
    "stop_reason",
    "system_messages",
    "thinking_fields",
    "tool_choice_fields",
    "tool_message",
    "translate_request",
    "user_turn",
]

log = logging.getLogger("toolpair.anthropic")

Event = dict[str, Any]
"""One Anthropic stream event, e.g. ``{"type": "content_block_stop", "index": 0}``."""

Block = dict[str, Any]
"""One Anthropic content block, e.g. ``{"type": "text", "text": "hi"}``."""

ERROR_MARKER = "Error: "
"""Put before the text of a ``tool_result`` with ``is_error: true``: Chat has no error flag."""


def new_message_id() -> str:
    """A fresh Anthropic-style message id, ``msg_`` and 24 hex digits."""
    return "msg_" + secrets.token_hex(12)


def _new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


# --- request: checks ----------------------------------------------------------


def _blocks(content: object, where: str) -> list[Block]:
    """Message content as a list of blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise ClientInputError(f"{where}: content must be a string or a list of content blocks", param=where)
    for position, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ClientInputError(f"{where}.content.{position}: a content block must be an object with a type")
    return content


def _string(block: Block, key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise ClientInputError(f"{where}: {block['type']} block needs a string {key!r}", param=where)
    return value


def _texts(blocks: Iterable[Block]) -> str:
    """The text blocks of a list, joined by newlines; other blocks are skipped."""
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


# --- request: one function per part ----------------------------------------------


def system_messages(system: object) -> list[Message]:
    """The top-level ``system`` (a string or text blocks) as Chat system messages.

    >>> system_messages([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
    ...                  {"type": "text", "text": "b"}])
    [{'role': 'system', 'content': 'a\\nb'}]
    """
    if system is None:
        return []
    text = _texts(_blocks(system, "system"))
    return [{"role": "system", "content": text}] if text else []


def _image_part(block: Block, where: str) -> dict[str, Any] | None:
    source = block.get("source")
    if not isinstance(source, dict):
        raise ClientInputError(f"{where}: image block needs a source object", param=where)
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise ClientInputError(f"{where}: base64 image needs string media_type and data", param=where)
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": _string(source | {"type": "url"}, "url", where)}}
    return None


def _document_text(block: Block) -> str:
    """What a text-only engine can be shown of a document or search result block."""
    source = block.get("source")
    title = block.get("title")
    head = f"{title}\n" if isinstance(title, str) and title else ""
    if block.get("type") == "search_result":
        content = block.get("content")
        return head + (_texts(content) if isinstance(content, list) else "")
    if isinstance(source, dict):
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return head + str(source["data"])
        if source.get("type") == "content" and isinstance(source.get("content"), list):
            return head + _texts(source["content"])
        kind = source.get("media_type") or source.get("type")
        return f"{head}[{kind} document: not readable by this engine]"
    return f"{head}[document: not readable by this engine]"


def _user_part(block: Block, where: str) -> dict[str, Any] | None:
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": _string(block, "text", where)}
    if kind == "image":
        part = _image_part(block, where)
        return part or {"type": "text", "text": "[image file: not readable by this engine]"}
    if kind in ("document", "search_result"):
        return {"type": "text", "text": _document_text(block)}
    log.info("dropped a %s block from a user turn: the engine has no equivalent", kind)
    return None


def _collapse(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content becomes one string (every chat template reads that); images keep parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _result_blocks(block: Block, where: str) -> list[Block]:
    content = block.get("content")
    if content is None:
        return []
    return _blocks(content, where)


def tool_message(block: Block, where: str = "tool_result") -> Message:
    """One ``tool_result`` block as a Chat ``tool`` message.

    List content is joined as text; each image is named in the text and sent
    in the user message that follows the tool messages; ``is_error: true``
    puts :data:`ERROR_MARKER` first.

    >>> tool_message({"type": "tool_result", "tool_use_id": "t1", "is_error": True,
    ...               "content": [{"type": "text", "text": "no such file"}]})
    {'role': 'tool', 'tool_call_id': 't1', 'content': 'Error: no such file'}
    """
    call_id = _string(block, "tool_use_id", where)
    texts: list[str] = []
    for part in _result_blocks(block, where):
        if part["type"] == "text":
            texts.append(_string(part, "text", where))
        elif part["type"] == "image":
            texts.append("[image: shown in the next message]")
        elif part["type"] in ("document", "search_result"):
            texts.append(_document_text(part))
        else:
            texts.append(f"[{part['type']} block]")
    text = "\n".join(texts)
    if block.get("is_error") is True:
        text = ERROR_MARKER + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _result_images(block: Block, where: str) -> list[dict[str, Any]]:
    images = [_image_part(part, where) for part in _result_blocks(block, where) if part["type"] == "image"]
    found = [image for image in images if image is not None]
    if not found:
        return []
    label = f"Image{'s' if len(found) > 1 else ''} from the result of tool call {block['tool_use_id']}:"
    return [{"type": "text", "text": label}, *found]


def user_turn(blocks: Sequence[Block], where: str = "messages") -> list[Message]:
    """One user turn: its ``tool_result`` blocks as ``tool`` messages first, then one user message.

    The user message holds the images from the results, then the user's own
    blocks, so the user's text always comes after the tool messages.

    >>> user_turn([{"type": "text", "text": "thanks"},
    ...            {"type": "tool_result", "tool_use_id": "t1", "content": "42"}])
    [{'role': 'tool', 'tool_call_id': 't1', 'content': '42'}, {'role': 'user', 'content': 'thanks'}]
    """
    messages: list[Message] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if block["type"] == "tool_result":
            messages.append(tool_message(block, where))
            parts.extend(_result_images(block, where))
    for block in blocks:
        if block["type"] != "tool_result":
            part = _user_part(block, where)
            if part is not None:
                parts.append(part)
    if parts:
        messages.append({"role": "user", "content": _collapse(parts)})
    return messages


def _arguments(value: object) -> str:
    # The spaced form is what tool-calling models write, so the prompt prefix
    # rendered from history matches what the model produced.
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def assistant_message(blocks: Sequence[Block], where: str = "messages") -> Message:
    """An assistant turn: text as ``content``, ``tool_use`` as ``tool_calls``, thinking as ``reasoning_content``.

    ``redacted_thinking`` and server-side tool blocks are dropped: the engine
    can neither read nor run them.

    >>> assistant_message([{"type": "text", "text": "Looking."},
    ...                    {"type": "tool_use", "id": "t1", "name": "Grep", "input": {"pattern": "x"}}])
    {'role': 'assistant', 'content': 'Looking.', 'tool_calls': [{'id': 't1', 'type': 'function', \
'function': {'name': 'Grep', 'arguments': '{"pattern": "x"}'}}]}
    """
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            reasoning.append(_string(block, "thinking", where))
        elif kind == "tool_use":
            function = {"name": _string(block, "name", where), "arguments": _arguments(block.get("input"))}
            calls.append({"id": _string(block, "id", where), "type": "function", "function": function})
        elif kind != "redacted_thinking":
            log.info("dropped a %s block from an assistant turn: the engine has no equivalent", kind)
    # "" rather than null: llama-cpp-python refuses a null assistant content.
    message: Message = {"role": "assistant", "content": "\n".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _conversation(messages: Messages) -> list[Message]:
    """Anthropic ``messages`` as Chat messages. Consecutive user messages are one turn, as the API treats them."""
    out: list[Message] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise ClientInputError(f"{where}: a message must be an object", param=where)
        role = message.get("role")
        if role == "user":
            blocks: list[Block] = []
            while index < len(messages) and isinstance(messages[index], dict) and messages[index].get("role") == "user":
                blocks.extend(_blocks(messages[index].get("content"), f"messages.{index}"))
                index += 1
            out.extend(user_turn(blocks, where))
            continue
        if role == "assistant":
            out.append(assistant_message(_blocks(message.get("content"), where), where))
        elif role == "system":
            # Claude Code sends reminders as system messages mid-conversation.
            out.append({"role": "system", "content": _texts(_blocks(message.get("content"), where))})
        else:
            raise ClientInputError(f"{where}: role must be user, assistant or system, not {role!r}", param=where)
        index += 1
    return out


def chat_tools(tools: object) -> list[dict[str, Any]]:
    """Anthropic tools as Chat functions. ``cache_control``, ``defer_loading`` and ``strict`` are dropped.

    Anthropic-defined tools with no ``input_schema`` (web search, code
    execution, ...) run on Anthropic's servers; the engine cannot, so they are
    left out.

    >>> chat_tools([{"name": "Grep", "description": "search", "input_schema": {"type": "object"},
    ...              "defer_loading": True}])
    [{'type': 'function', 'function': {'name': 'Grep', 'description': 'search', 'parameters': {'type': 'object'}}}]
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ClientInputError("tools must be a list", param="tools")
    out: list[dict[str, Any]] = []
    for position, tool in enumerate(tools):
        where = f"tools.{position}"
        if not isinstance(tool, dict):
            raise ClientInputError(f"{where}: a tool must be an object", param=where)
        kind = tool.get("type")
        schema = tool.get("input_schema")
        if kind not in (None, "custom") and schema is None:
            log.info("dropped the %s tool: it runs on Anthropic's servers", kind)
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ClientInputError(f"{where}: a tool needs a name", param=where)
        if schema is not None and not isinstance(schema, dict):
            raise ClientInputError(f"{where}: input_schema must be an object", param=where)
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = schema if schema is not None else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def tool_choice_fields(choice: object) -> Body:
    """``tool_choice`` as Chat fields: auto, any (required), tool (a named function), none.

    >>> tool_choice_fields({"type": "any", "disable_parallel_tool_use": True})
    {'tool_choice': 'required', 'parallel_tool_calls': False}
    """
    if choice is None:
        return {}
    if not isinstance(choice, dict):
        raise ClientInputError("tool_choice must be an object", param="tool_choice")
    kind = choice.get("type")
    fields: Body = {}
    if kind == "auto":
        fields["tool_choice"] = "auto"
    elif kind == "any":
        fields["tool_choice"] = "required"
    elif kind == "none":
        fields["tool_choice"] = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise ClientInputError("tool_choice of type tool needs a name", param="tool_choice")
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise ClientInputError(f"tool_choice type must be auto, any, tool or none, not {kind!r}", param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        fields["parallel_tool_calls"] = False
    return fields


def _number(body: Body, key: str, kind: type[int] | type[float]) -> Any:
    value = body.get(key)
    if value is None:
        return None
    ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if not ok or isinstance(value, bool):
        raise ClientInputError(f"{key} must be a number", param=key)
    return value


def sampling_fields(body: Body) -> Body:
    """``max_tokens``, ``temperature``, ``top_p``, ``top_k`` and ``metadata.user_id`` (as ``user``).

    ``stop_sequences`` is not here: toolpair matches them itself (see
    :class:`MessageEvents`), so it can report which one fired.

    >>> sampling_fields({"max_tokens": 64, "temperature": 0, "metadata": {"user_id": "u1"}})
    {'max_tokens': 64, 'temperature': 0, 'user': 'u1'}
    """
    fields: Body = {}
    max_tokens = _number(body, "max_tokens", int)
    if max_tokens is not None:
        if max_tokens < 1:
            raise ClientInputError("max_tokens must be at least 1", param="max_tokens")
        fields["max_tokens"] = max_tokens
    for key, kind in (("temperature", float), ("top_p", float), ("top_k", int)):
        value = _number(body, key, kind)
        if value is not None:
            fields[key] = value
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        fields["user"] = metadata["user_id"]
    return fields


def stop_sequences(body: Body) -> tuple[str, ...]:
    """The request's ``stop_sequences``, checked."""
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ClientInputError("stop_sequences must be a list of strings", param="stop_sequences")
    return tuple(s for s in stops if s)


_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def thinking_fields(thinking: object, output_config: object = None) -> Body:
    """The ``thinking`` setting and ``output_config`` as the fields chat engines read.

    ``enabled``, ``adaptive`` and ``between_tools`` turn the template's thinking switch on
    (``chat_template_kwargs.enable_thinking``, read by llama-server, vLLM and
    Qwen-style templates), ``disabled`` turns it off; ``output_config.effort``
    becomes ``reasoning_effort`` and ``output_config.format`` a JSON-schema
    ``response_format``. Engines that know none of these ignore them.

    >>> thinking_fields({"type": "adaptive"}, {"effort": "max"})
    {'chat_template_kwargs': {'enable_thinking': True}, 'reasoning_effort': 'high'}
    """
    fields: Body = {}
    if isinstance(thinking, dict):
        kind = thinking.get("type")
        if kind in ("enabled", "adaptive", "between_tools"):
            fields["chat_template_kwargs"] = {"enable_thinking": True}
        elif kind == "disabled":
            fields["chat_template_kwargs"] = {"enable_thinking": False}
    elif thinking is not None:
        raise ClientInputError("thinking must be an object", param="thinking")
    if isinstance(output_config, dict):
        effort = output_config.get("effort")
        if isinstance(effort, str) and effort in _EFFORTS:
            fields["reasoning_effort"] = _EFFORTS[effort]
        output_format = output_config.get("format")
        if isinstance(output_format, dict) and output_format.get("type") == "json_schema":
            schema = output_format.get("schema")
            fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return fields


def translate_request(body: Body, *, engine_model: str | None = None) -> Body:
    """An Anthropic Messages request as a Chat Completions request (``stream`` is the caller's).

    ``engine_model`` replaces the model name when set; otherwise the client's
    name goes through. Ignored on purpose: ``cache_control`` anywhere,
    ``context_management``, ``service_tier``, ``container``, ``mcp_servers``.

    >>> translate_request({"model": "claude-x", "max_tokens": 8, "system": "Be brief.",
    ...                    "messages": [{"role": "user", "content": "Hi"}]}, engine_model="gemma")
    {'model': 'gemma', 'messages': [{'role': 'system', 'content': 'Be brief.'}, \
{'role': 'user', 'content': 'Hi'}], 'max_tokens': 8}
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ClientInputError("messages must be a list", param="messages")
    model = engine_model or body.get("model")
    if model is not None and not isinstance(model, str):
        raise ClientInputError("model must be a string", param="model")
    chat: Body = {}
    if model is not None:
        chat["model"] = model
    chat["messages"] = [*system_messages(body.get("system")), *_conversation(messages)]
    tools = chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat.update(tool_choice_fields(body.get("tool_choice")))
    else:
        tool_choice_fields(body.get("tool_choice"))  # still checked
    chat.update(sampling_fields(body))
    chat.update(thinking_fields(body.get("thinking"), body.get("output_config")))
    return chat


# --- request: planning ---------------------------------------------------------------

# Claude Code's per-request stamp: "x-anthropic-billing-header: cc_version=...;
# cc_entrypoint=cli; cch=1a2b3;". Only cch changes from one request to the next.
_BILLING_STAMP = re.compile(r"(x-anthropic-billing-header:[^\n]*?\bcch=)[0-9A-Za-z]+")
_STAMP_VALUE = r"\g<1>00000"


def normalize_billing_stamp(body: Body) -> Body:
    """Replace Claude Code's per-request ``cch`` value in ``system`` with a constant.

    Returns ``body`` itself when there is no stamp, a new dict otherwise.

    >>> normalize_billing_stamp({"system": "x-anthropic-billing-header: cc_version=2.1.9.0d9; cch=fa690;"})
    {'system': 'x-anthropic-billing-header: cc_version=2.1.9.0d9; cch=00000;'}
    """
    system = body.get("system")
    if isinstance(system, str):
        fixed = _BILLING_STAMP.sub(_STAMP_VALUE, system)
        return body if fixed == system else {**body, "system": fixed}
    if not isinstance(system, list):
        return body
    blocks: list[Any] = []
    changed = False
    for block in system:
        text = block.get("text") if isinstance(block, dict) else None
        if isinstance(text, str):
            fixed = _BILLING_STAMP.sub(_STAMP_VALUE, text)
            if fixed != text:
                block = {**block, "text": fixed}
                changed = True
        blocks.append(block)
    return {**body, "system": blocks} if changed else body


def _prepare(raw: bytes, normalize_stamp: bool) -> tuple[Body, Body, OrderReport]:
    """Decode, normalize the stamp and order: (as received, as prepared, report)."""
    data = decode_body(raw)
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ClientInputError("messages must be a list", param="messages")
    prepared = normalize_billing_stamp(data) if normalize_stamp else data
    ordered, report = order_anthropic_results(messages)
    if ordered is not messages:
        prepared = {**prepared, "messages": ordered}
    return data, prepared, report


@dataclass(frozen=True)
class TranslationPlan:
    """What to ask a Chat Completions engine for one ``/v1/messages`` request."""

    chat: Body
    """The Chat Completions body, without ``stream``."""
    model: str
    """The model name the client asked for, echoed in the answer."""
    stream: bool
    stop_sequences: tuple[str, ...]
    report: OrderReport


def plan_translation(raw: bytes, *, engine_model: str | None = None, normalize_stamp: bool = True) -> TranslationPlan:
    """Decode, order and translate a ``/v1/messages`` body.

    >>> plan = plan_translation(b'{"model": "claude", "max_tokens": 5, "stream": true, '
    ...                         b'"stop_sequences": ["END"], "messages": [{"role": "user", "content": "Hi"}]}')
    >>> plan.chat["messages"], plan.stream, plan.stop_sequences
    ([{'role': 'user', 'content': 'Hi'}], True, ('END',))
    """
    data, prepared, report = _prepare(raw, normalize_stamp)
    model = data.get("model")
    return TranslationPlan(
        chat=translate_request(prepared, engine_model=engine_model),
        model=model if isinstance(model, str) else "",
        stream=data.get("stream") is True,
        stop_sequences=stop_sequences(data),
        report=report,
    )


@dataclass(frozen=True)
class NativePlan:
    """What to forward to an engine that speaks Anthropic Messages itself."""

    body: bytes
    """The client's own bytes whenever nothing changed."""
    report: OrderReport


def plan_native(raw: bytes, *, engine_model: str | None = None, normalize_stamp: bool = True) -> NativePlan:
    """Decode, normalize, order and re-serialize only if something changed.

    >>> raw = b'{"model": "claude", "messages": []}'
    >>> plan_native(raw).body is raw
    True
    """
    data, prepared, report = _prepare(raw, normalize_stamp)
    if engine_model and prepared.get("model") != engine_model:
        prepared = {**prepared, "model": engine_model}
    return NativePlan(raw if prepared is data else orjson.dumps(prepared), report)


# --- response: stream events -------------------------------------------------------


def stop_reason(finish_reason: str | None, used_tools: bool) -> str:
    """A Chat ``finish_reason`` as an Anthropic ``stop_reason``.

    Engines differ on the finish reason after tool calls, so any tool call
    means ``tool_use`` unless the output was cut short.

    >>> stop_reason("length", True), stop_reason("stop", True), stop_reason("stop", False)
    ('max_tokens', 'tool_use', 'end_turn')
    """
    if finish_reason == "length":
        return "max_tokens"
    if finish_reason == "content_filter":
        return "refusal"
    if used_tools or finish_reason in ("tool_calls", "function_call"):
        return "tool_use"
    return "end_turn"


def _nonempty(value: object) -> str:
    return value if isinstance(value, str) else ""


def _produces_output(delta: Body) -> bool:
    """Whether a chunk carries generated output: the token count when the engine gives no usage."""
    if any(_nonempty(delta.get(key)) for key in ("content", "reasoning_content", "reasoning")):
        return True
    calls = delta.get("tool_calls")
    return isinstance(calls, list) and bool(calls)


class MessageEvents:
    """``chat.completion.chunk`` dicts in, Anthropic stream events out.

    State: whether ``message_start`` went out, the open block (its kind and
    index), the block of each tool call index, the stop-sequence matcher, the
    finish reason and usage. Each :meth:`feed` is one step from the current
    state to the next, returning the events it implies. Orders the Anthropic
    grammar cannot express raise :class:`~proxy.errors.UpstreamError`: a tool
    call that resumes after another began, a tool call with no name, a stream
    that ends with no finish reason, and any input after the message ended.

    >>> events = MessageEvents(model="claude", message_id="msg_1")
    >>> [e["type"] for e in events.feed({"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]})]
    ['message_start', 'ping', 'content_block_start', 'content_block_delta']
    >>> [e["type"] for e in events.finish()]
    ['content_block_stop', 'message_delta', 'message_stop']
    """

    def __init__(
        self,
        *,
        model: str,
        message_id: str | None = None,
        input_tokens: int = 0,
        stop_sequences: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.message_id = message_id or new_message_id()
        self.input_tokens = input_tokens
        self._stops = StopMatcher(stop_sequences) if stop_sequences else None
        self._started = False
        self._index = -1
        self._open: str | None = None  # kind of the open block
        self._tools: dict[int, int] = {}  # chat tool call index -> block index
        self._open_tool: int | None = None
        self.finish_reason: str | None = None
        self._prompt_tokens: int | None = None
        self._completion_tokens: int | None = None
        self._counted = 0
        self.done = False
        """True once ``message_stop`` went out: by a stop sequence, or :meth:`finish`."""

    # -- steps

    def ping(self) -> list[Event]:
        """A keep-alive while the engine has not answered yet (``message_start`` first if needed)."""
        if self.done:
            return []
        return [*self._start(), {"type": "ping"}]

    def feed(self, chunk: Body) -> list[Event]:
        if self.done:
            raise UpstreamError("the engine sent more after the message ended")
        events = self._start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self._prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self._completion_tokens = usage["completion_tokens"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if _produces_output(delta):
                self._counted += 1
            self._delta(delta, events)
            if self.done:
                return events
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish
        return events

    def finish(self) -> list[Event]:
        """End of the engine's stream: close the open block and the message."""
        if self.done:
            return []
        if self.finish_reason is None:
            raise UpstreamError("the engine ended the stream before it finished the message")
        events = self._start()
        events += self._flush_text()
        events += self._close()
        events += self._end(stop_reason(self.finish_reason, bool(self._tools)), None)
        return events

    # -- helpers

    def _start(self) -> list[Event]:
        if self._started:
            return []
        self._started = True
        message: Body = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _delta(self, delta: Body, events: list[Event]) -> None:
        reasoning = _nonempty(delta.get("reasoning_content")) or _nonempty(delta.get("reasoning"))
        if reasoning:
            if self._open != "thinking":
                events += self._flush_text()
                events += self._open_block({"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._block_delta({"type": "thinking_delta", "thinking": reasoning}))
        content = _nonempty(delta.get("content"))
        if content:
            events += self._text(content)
            if self.done:
                return
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._tool_call(call, position, events)

    def _text(self, text: str) -> list[Event]:
        stop = None
        if self._stops is not None:
            match = self._stops.feed(text)
            text, stop = match.text, match.stop
        events: list[Event] = []
        if text:
            if self._open != "text":
                events += self._open_block({"type": "text", "text": ""})
            events.append(self._block_delta({"type": "text_delta", "text": text}))
        if stop is not None:
            events += self._close()
            events += self._end("stop_sequence", stop)
        return events

    def _flush_text(self) -> list[Event]:
        """Let through text held back as a possible stop sequence: the text ended without one."""
        held = self._stops.finish() if self._stops is not None else ""
        if not held:
            return []
        events = [] if self._open == "text" else self._open_block({"type": "text", "text": ""})
        events.append(self._block_delta({"type": "text_delta", "text": held}))
        return events

    def _tool_call(self, call: Body, position: int, events: list[Event]) -> None:
        index = call.get("index", position)
        if isinstance(index, (list, dict)):
            raise UpstreamError("the engine sent a tool call whose index is not a number")
        function: Body = call["function"] if isinstance(call.get("function"), dict) else {}
        if index not in self._tools:
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise UpstreamError("the engine started a tool call without a name")
            call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else _new_tool_use_id()
            events += self._flush_text()
            events += self._open_block({"type": "tool_use", "id": call_id, "name": name, "input": {}})
            self._tools[index] = self._index
            self._open_tool = index
        elif self._open_tool != index:
            raise UpstreamError("the engine resumed a tool call after the next one began")
        arguments = _nonempty(function.get("arguments"))
        if arguments:
            events.append(self._block_delta({"type": "input_json_delta", "partial_json": arguments}))

    def _open_block(self, block: Block) -> list[Event]:
        events = self._close()
        self._index += 1
        self._open = block["type"]
        return [*events, {"type": "content_block_start", "index": self._index, "content_block": block}]

    def _block_delta(self, delta: Body) -> Event:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        self._open_tool = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _end(self, reason: str, stop: str | None) -> list[Event]:
        self.done = True
        usage = {
            "input_tokens": self._prompt_tokens if self._prompt_tokens is not None else self.input_tokens,
            "output_tokens": self._completion_tokens if self._completion_tokens is not None else self._counted,
        }
        delta = {"stop_reason": reason, "stop_sequence": stop}
        return [{"type": "message_delta", "delta": delta, "usage": usage}, {"type": "message_stop"}]


def frames(events: Iterable[Event]) -> list[bytes]:
    """Anthropic events as SSE frames, each named by its type (the SDK skips unnamed frames)."""
    return [encode_event(orjson.dumps(event), event["type"]) for event in events]


class MessageFrames:
    """:class:`MessageEvents` with SSE frames out: ``feed(chunk) -> list[bytes]``, ``finish() -> list[bytes]``."""

    def __init__(self, events: MessageEvents) -> None:
        self.events = events

    @property
    def done(self) -> bool:
        return self.events.done

    def ping(self) -> list[bytes]:
        return frames(self.events.ping())

    def feed(self, chunk: Body) -> list[bytes]:
        return frames(self.events.feed(chunk))

    def finish(self) -> list[bytes]:
        return frames(self.events.finish())


# --- response: accumulating a message ------------------------------------------------


def _tool_input(buffer: str) -> Any:
    if not buffer:
        return {}
    try:
        value = orjson.loads(buffer)
    except orjson.JSONDecodeError:
        log.warning("a tool call's arguments are not JSON; sending an empty input: %s", private(buffer[:200]))
        return {}
    if not isinstance(value, dict):
        log.warning("a tool call's arguments are not a JSON object; sending an empty input: %s", private(buffer[:200]))
        return {}
    return value


class MessageAccumulator:
    """Anthropic stream events in, the final message out, checking the grammar on the way.

    The same state and steps as the anthropic SDK's accumulator, stricter:
    ``message_start`` first, blocks opened in index order, deltas only to the
    open block and of its kind, no block open at ``message_delta``,
    ``message_stop`` last. Anything else raises ``ValueError``.

    >>> acc = MessageAccumulator()
    >>> for e in MessageEvents(model="m", message_id="msg_1").feed({"choices": [{"delta": {"content": "Hi"},
    ...                                                              "finish_reason": "stop"}]}):
    ...     acc.feed(e)
    >>> acc.message["content"]
    [{'type': 'text', 'text': 'Hi'}]
    """

    def __init__(self) -> None:
        self.message: Body | None = None
        self._open: int | None = None
        self._json = ""
        self._delta_seen = False
        self.ended = False

    def feed(self, event: Event) -> None:
        kind = event.get("type")
        if self.ended:
            raise ValueError(f"{kind} after message_stop")
        if self.message is None:
            if kind != "message_start":
                raise ValueError(f"{kind} before message_start")
            self.message = {**event["message"], "content": list(event["message"]["content"])}
            self.message["usage"] = dict(self.message["usage"])
            return
        content: list[Block] = self.message["content"]
        if kind == "ping":
            return
        if kind == "message_start":
            raise ValueError("a second message_start")
        if kind == "error":
            raise ValueError(f"error event: {event.get('error')}")
        if self._delta_seen and kind != "message_stop":
            raise ValueError(f"{kind} after message_delta")
        if kind == "content_block_start":
            if self._open is not None:
                raise ValueError("content_block_start while a block is open")
            if event["index"] != len(content):
                raise ValueError(f"block index {event['index']}, expected {len(content)}")
            content.append(dict(event["content_block"]))
            self._open = event["index"]
            self._json = ""
        elif kind == "content_block_delta":
            self._apply(content, event)
        elif kind == "content_block_stop":
            if self._open is None or event["index"] != self._open:
                raise ValueError(f"content_block_stop for block {event['index']}, which is not open")
            block = content[self._open]
            if block["type"] == "tool_use":
                block["input"] = _tool_input(self._json)
            self._open = None
        elif kind == "message_delta":
            if self._open is not None:
                raise ValueError("message_delta while a block is open")
            self.message.update(event["delta"])
            self.message["usage"].update(event["usage"])
            self._delta_seen = True
        elif kind == "message_stop":
            if not self._delta_seen:
                raise ValueError("message_stop before message_delta")
            self.ended = True
        else:
            raise ValueError(f"unknown event type {kind!r}")

    def _apply(self, content: list[Block], event: Event) -> None:
        if self._open is None or event["index"] != self._open:
            raise ValueError(f"content_block_delta for block {event['index']}, which is not open")
        block, delta = content[self._open], event["delta"]
        expected = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
        if expected.get(block["type"]) != delta["type"]:
            raise ValueError(f"{delta['type']} in a {block['type']} block")
        if block["type"] == "text":
            block["text"] += delta["text"]
        elif block["type"] == "thinking":
            block["thinking"] += delta["thinking"]
        else:
            self._json += delta["partial_json"]


def _completion_chunk(completion: Body) -> Body:
    """A whole non-stream completion as one chunk, so it takes the same path as a stream."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message: Body = choice["message"] if isinstance(choice.get("message"), dict) else {}
    delta: Body = {k: message[k] for k in ("content", "reasoning_content", "reasoning") if k in message}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(calls) if isinstance(call, dict)]
    chunk: Body = {"choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason") or "stop"}]}
    if isinstance(completion.get("usage"), dict):
        chunk["usage"] = completion["usage"]
    return chunk


def message_from_completion(completion: Body, *, model: str, message_id: str | None = None) -> Body:
    """A non-stream ``chat.completion`` as an Anthropic message.

    >>> message_from_completion({"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}],
    ...                          "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
    ...                         model="claude", message_id="msg_1")["usage"]
    {'input_tokens': 9, 'output_tokens': 1}
    """
    events = MessageEvents(model=model, message_id=message_id)
    return accumulate([*events.feed(_completion_chunk(completion)), *events.finish()])


def accumulate(events: Iterable[Event]) -> Body:
    """The final message of a complete event sequence."""
    accumulator = MessageAccumulator()
    for event in events:
        accumulator.feed(event)
    if accumulator.message is None or not accumulator.ended:
        raise ValueError("the events did not end the message")
    return accumulator.message


# --- errors ------------------------------------------------------------------------------

_CONTEXT_OVERFLOW = (
    # llama-cpp-python server, vLLM, OpenAI: "maximum context length is 512 tokens. However,
    # you requested 829 tokens (824 in the messages, 5 in the completion)"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?\((?P<prompt>\d+) in the messages"
               r"(?:, (?P<completion>\d+))?", re.S),
    # vLLM: "maximum context length is 4096 tokens. However, your request has 5000 input tokens"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?request has (?P<prompt>\d+) input tokens", re.S),
    # llama-cpp-python's own exception text
    re.compile(r"Requested tokens \((?P<prompt>\d+)\) exceed context window of (?P<limit>\d+)"),
    # llama-server: "request (5000 tokens) exceeds the available context size (4096 tokens)"
    re.compile(r"request \((?P<prompt>\d+) tokens\) exceeds the available context size \((?P<limit>\d+) tokens\)"),
)  # fmt: skip


def context_overflow(engine_message: str) -> ClientInputError | None:
    """The Anthropic error for an engine's "does not fit in the context" message, if it is one.

    A prompt that alone fills the context is ``prompt is too long: N tokens > M
    maximum`` (what makes Claude Code compact); one that only fails with room
    for ``max_tokens`` gets Anthropic's wording for that case.

    >>> context_overflow("This model's maximum context length is 512 tokens. However, you requested "
    ...                  "829 tokens (824 in the messages, 5 in the completion).").message
    'prompt is too long: 824 tokens > 512 maximum'
    >>> context_overflow("no such model") is None
    True
    """
    for pattern in _CONTEXT_OVERFLOW:
        match = pattern.search(engine_message)
        if match is None:
            continue
        prompt, limit = int(match["prompt"]), int(match["limit"])
        completion = match.groupdict().get("completion")
        if prompt >= limit or completion is None:
            return PromptTooLongError(prompt, limit)
        return ClientInputError(
            f"input length and `max_tokens` exceed context limit: {prompt} + {completion} > {limit}, "
            "decrease input length or `max_tokens` and try again",
            param="max_tokens",
        )
    return None


def native_error(status: int, raw: bytes) -> ToolpairError | None:
    """The Anthropic error for an error answer from a native engine, or None when it already is one.

    Engines that serve ``/v1/messages`` often answer errors in their own shape
    (llama-server: ``{"error": {"type": "exceed_context_size_error",
    "n_prompt_tokens": ..., "n_ctx": ...}}``). Those are rewritten, so that
    Claude Code still sees ``prompt is too long`` and can compact.

    >>> native_error(400, b'{"error": {"message": "too big", "n_prompt_tokens": 9000, "n_ctx": 8192}}').message
    'prompt is too long: 9000 tokens > 8192 maximum'
    >>> native_error(400, b'{"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}') is None
    True
    """
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        overflow = context_overflow(message) if isinstance(message, str) else None
        return overflow if isinstance(overflow, PromptTooLongError) else None
    error = data.get("error", data.get("detail", data)) if isinstance(data, dict) else data
    if isinstance(error, dict):
        prompt, limit = error.get("n_prompt_tokens"), error.get("n_ctx")
        if isinstance(prompt, int) and isinstance(limit, int):
            return PromptTooLongError(prompt, limit)
        error = error.get("message")
    message = error if isinstance(error, str) and error else raw.decode("utf-8", "replace")[:500] or "no body"
    return context_overflow(message) or UpstreamStatusError(message, status=status)
