"""Anthropic Messages requests: decode, normalize the billing stamp, order, translate to Chat Completions.

:func:`plan_translation` builds the Chat body for an engine without ``/v1/messages`` (one small
function per part: :func:`system_messages`, :func:`user_turn`, :func:`assistant_message`,
:func:`tool_message`, :func:`chat_tools`, :func:`tool_choice_fields`, :func:`sampling_fields`,
:func:`thinking_fields`); :func:`plan_native` keeps the Anthropic body for an engine that speaks it.

Spec: https://docs.anthropic.com/en/api/messages
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
from proxy.engine.model_names import NO_NAMES, ModelNames, ModelPlan, with_model
from proxy.engine.thinking import anthropic_switch, with_switch
from proxy.errors import ClientInputError
from proxy.order import OrderReport, order_anthropic_results

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


def new_tool_use_id() -> str:
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


def thinking_fields(thinking: object, output_config: object = None, template_kwargs: object = None) -> Body:
    """The ``thinking`` setting and ``output_config`` as the fields chat engines read.

    The thinking switch is :func:`proxy.engine.thinking.anthropic_switch`'s: ``enabled``,
    ``adaptive`` and ``between_tools`` turn the template's ``enable_thinking`` on, ``disabled`` off,
    an ``enabled`` budget becomes llama-server's ``reasoning_budget_tokens``; ``output_config.effort``
    becomes ``reasoning_effort`` (top level, as Chat engines read it, and for the template) and
    ``output_config.format`` a JSON-schema ``response_format``. Engines that know none of these
    ignore them. ``template_kwargs``, the client's own ``chat_template_kwargs``, wins key by key.

    >>> thinking_fields({"type": "adaptive"}, {"effort": "max"})
    {'reasoning_effort': 'high', 'chat_template_kwargs': {'enable_thinking': True, 'reasoning_effort': 'high'}}
    """
    switch = anthropic_switch(thinking, output_config)
    fields: Body = {"reasoning_effort": switch.effort} if switch.effort else {}
    if template_kwargs is not None:
        fields["chat_template_kwargs"] = template_kwargs
    fields = with_switch(fields, switch)
    if isinstance(output_config, dict):
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
    # chat_template_kwargs is not Anthropic's, but a client may send its own for the template: it is kept.
    chat.update(thinking_fields(body.get("thinking"), body.get("output_config"), body.get("chat_template_kwargs")))
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
    model_plan: ModelPlan
    """The model name the engine gets (``messages_model``, else the map or the engine's only model)."""


def unseen_image(data: Body) -> str | None:
    """Where the request holds an image, as the client's own field path; None when it holds none.

    >>> unseen_image({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
    ...     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
    ...         {"type": "text", "text": "see"}, {"type": "image", "source": {}}]}]}]})
    'messages[2].content[0].content[1]'
    """
    messages = data.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "image":
                return f"messages[{i}].content[{j}]"
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for k, part in enumerate(inner if isinstance(inner, list) else ()):
                if isinstance(part, dict) and part.get("type") == "image":
                    return f"messages[{i}].content[{j}].content[{k}]"
    return None


def refuse_unseen_image(path: str | None) -> None:
    """An image for a model that cannot see: a 400 naming the client's own field."""
    if path is not None:
        raise ClientInputError(
            f"this model cannot see images ({path} is an image); "
            "set vision: true only if the engine runs a vision model",
            param=path,
        )


def plan_translation(
    raw: bytes,
    *,
    engine_model: str | None = None,
    normalize_stamp: bool = True,
    sees_images: bool = True,
    names: ModelNames = NO_NAMES,
) -> TranslationPlan:
    """Decode, order and translate a ``/v1/messages`` body.

    The engine gets ``engine_model`` (``messages_model``) when set, else the name ``names`` plan;
    the answer names the client's model either way.

    Checked here, on the client's body: at least one message, as the API demands; and, for a model
    that cannot see (``sees_images`` False), no image, with the refusal naming the client's field.

    >>> plan = plan_translation(b'{"model": "claude", "max_tokens": 5, "stream": true, '
    ...                         b'"stop_sequences": ["END"], "messages": [{"role": "user", "content": "Hi"}]}')
    >>> plan.chat["messages"], plan.stream, plan.stop_sequences
    ([{'role': 'user', 'content': 'Hi'}], True, ('END',))
    """
    data, prepared, report = _prepare(raw, normalize_stamp)
    model = data.get("model")
    model_plan = names.plan_with(data, engine_model)
    plan = TranslationPlan(
        chat=translate_request(prepared, engine_model=model_plan.send if model_plan.changed else None),
        model=model if isinstance(model, str) else "",
        stream=data.get("stream") is True,
        stop_sequences=stop_sequences(data),
        report=report,
        model_plan=model_plan,
    )
    if not data["messages"]:
        raise ClientInputError("messages: at least one message is required", param="messages")
    if not sees_images:
        refuse_unseen_image(unseen_image(data))
    return plan


@dataclass(frozen=True)
class NativePlan:
    """What to forward to an engine that speaks Anthropic Messages itself."""

    body: bytes
    """The client's own bytes whenever nothing changed."""
    report: OrderReport
    model: ModelPlan
    """The model name the engine gets; when it is not the client's, the answer names the client's again."""


def plan_native(
    raw: bytes,
    *,
    engine_model: str | None = None,
    normalize_stamp: bool = True,
    thinking_switch: bool = False,
    names: ModelNames = NO_NAMES,
) -> NativePlan:
    """Decode, normalize, order, name the model, and re-serialize only if something changed.

    The model is ``engine_model`` (``messages_model``) when set, else the name ``names`` plan
    (:mod:`proxy.engine.model_names`).

    ``thinking_switch``: the engine reads ``chat_template_kwargs`` (llama-server, whose own
    Messages route maps no ``thinking`` to it), so ``thinking`` and ``output_config.effort`` are
    added there (:func:`proxy.engine.thinking.with_switch`; the budget does not pass that route).
    A control the engine would refuse is left for it to refuse.

    >>> raw = b'{"model": "claude", "messages": []}'
    >>> plan_native(raw).body is raw
    True
    >>> plan_native(b'{"messages": [], "thinking": {"type": "disabled"}}', thinking_switch=True).body
    b'{"messages":[],"thinking":{"type":"disabled"},"chat_template_kwargs":{"enable_thinking":false}}'
    """
    data, prepared, report = _prepare(raw, normalize_stamp)
    model = names.plan_with(prepared, engine_model)
    prepared = with_model(prepared, model)
    if thinking_switch:
        try:
            switch = anthropic_switch(prepared.get("thinking"), prepared.get("output_config"))
            prepared = with_switch(prepared, switch, budget=False)
        except ClientInputError:
            pass  # the engine's own answer to it stands
    return NativePlan(raw if prepared is data else orjson.dumps(prepared), report, model)
