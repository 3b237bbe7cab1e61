"""OpenAI Responses requests as Chat Completions requests, for engines that have no ``/v1/responses``.

Three pure pieces, dict in and dict out::

    Responses request  --translate_request-->  ResponsesPlan (Chat body + how to map calls back)
    chat.completion    --chat_to_response--->  Response object
    chat chunk dicts   --ResponsesStream---->  Responses stream events, each with a sequence_number

``input`` items understood: ``message`` (roles user, assistant, system, developer; parts
``input_text``, ``output_text``, ``refusal``, ``input_image`` by URL), ``function_call``,
``function_call_output``, ``custom_tool_call``, ``custom_tool_call_output``, ``reasoning`` (its text
becomes ``reasoning_content``; encrypted-only reasoning is dropped) and ``additional_tools`` (its tools
are offered). Any other item type is a 400 naming it.

Output items produced: ``message`` with ``output_text``, ``reasoning`` with ``reasoning_text``,
``function_call`` and ``custom_tool_call`` (with ``namespace`` when the tool came from a namespace).

Reference: https://platform.openai.com/docs/api-reference/responses
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy._types import Body, Messages
from proxy.dialects.chat.request import decode_body
from proxy.engine.adapt import responses_logprobs_asked
from proxy.engine.model_names import NO_NAMES, ModelNames, ModelPlan, with_model
from proxy.engine.thinking import responses_switch, with_switch
from proxy.errors import ClientInputError
from proxy.order import NO_RUNS, OrderReport, order_responses_items

Event = dict[str, Any]
"""One Responses stream event: ``{"type": ..., "sequence_number": ..., ...}``."""

CALL_MARKER = b"call_id"
"""Bytes that any Responses body with tool outputs must contain (the native fast-path test)."""

_NAMESPACE_JOIN = "__"
_CALL_ITEMS = ("function_call", "custom_tool_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
_UNSUPPORTED_FIELDS = {
    "background": "background responses",
    "conversation": "server-side conversations",
    "prompt": "stored prompt templates",
}


# --- small validators: every 400 names the parameter ------------------------------------------


def _bad(where: str, what: str) -> ClientInputError:
    return ClientInputError(f"{where}: {what}", param=where)


def _str(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{where}.{key}", "must be a nonempty string")
    return value


def _opt_str(item: Mapping[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise _bad(f"{where}.{key}", "must be a string")
    return value or None


def _opt_bool(data: Mapping[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise _bad(key, "must be true or false")
    return value


def _opt_number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _bad(key, "must be a number")
    return value


# --- tools ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRef:
    """The client's tool behind one chat function name."""

    kind: str  # "function" or "custom": which output item a call becomes
    name: str
    namespace: str | None = None


def flat_name(name: str, namespace: str | None) -> str:
    """The chat function name of a tool; a namespaced one is joined with ``__``.

    >>> flat_name("spawn_agent", "multi_agent_v1"), flat_name("exec_command", None)
    ('multi_agent_v1__spawn_agent', 'exec_command')
    """
    if namespace is None:
        return name
    return namespace.rstrip("_") + _NAMESPACE_JOIN + name.lstrip("_")


@dataclass(frozen=True)
class ToolMap:
    """Chat function names back to the client's tools."""

    refs: Mapping[str, ToolRef] = field(default_factory=dict)

    def ref(self, chat_name: str) -> ToolRef:
        """A name the model made up is returned as a plain function call."""
        return self.refs.get(chat_name) or ToolRef("function", chat_name)


def _function_tool(tool: Body, chat_name: str, where: str) -> Body:
    function: Body = {"name": chat_name}
    description = _opt_str(tool, "description", where)
    if description:
        function["description"] = description
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _bad(f"{where}.parameters", "must be a JSON schema object")
    function["parameters"] = parameters or {"type": "object", "properties": {}}
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _custom_tool(tool: Body, chat_name: str, where: str) -> Body:
    """A free-text custom tool becomes a function taking one string, ``input``."""
    doc = "The tool's whole input, as free text."
    grammar = tool.get("format")
    if isinstance(grammar, dict) and grammar.get("type") == "grammar":
        syntax, definition = grammar.get("syntax"), grammar.get("definition")
        if isinstance(definition, str):
            doc += f" It must follow this {syntax if isinstance(syntax, str) else ''} grammar:\n{definition}"
    function: Body = {
        "name": chat_name,
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": doc}},
            "required": ["input"],
            "additionalProperties": False,
        },
    }
    description = _opt_str(tool, "description", where)
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def _tools_to_chat(tools: Sequence[Any], where: str) -> tuple[list[Body], dict[str, ToolRef], list[str]]:
    """Chat tools, the name map, and the types of hosted tools that the engine cannot run.

    >>> chat, refs, dropped = _tools_to_chat([{"type": "web_search"}, {"type": "namespace", "name": "ns",
    ...     "tools": [{"type": "custom", "name": "patch"}]}], "tools")
    >>> [t["function"]["name"] for t in chat], refs["ns__patch"].kind, dropped
    (['ns__patch'], 'custom', ['web_search'])
    """
    chat: list[Body] = []
    refs: dict[str, ToolRef] = {}
    dropped: dict[str, None] = {}  # ordered, and a set: a request may name many thousands

    def add(tool: Any, at: str, namespace: str | None) -> None:
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _bad(at, "each tool must be an object with a string 'type'")
        kind = tool["type"]
        if kind == "namespace" and namespace is None:
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise _bad(f"{at}.tools", "must be a list")
            for index, nested in enumerate(inner):
                add(nested, f"{at}.tools[{index}]", _str(tool, "name", at))
            return
        if kind not in ("function", "custom"):
            dropped[kind] = None
            return
        name = _str(tool, "name", at)
        chat_name = flat_name(name, namespace)
        if chat_name in refs:
            raise _bad(f"{at}.name", f"two tools share the name {chat_name!r}")
        refs[chat_name] = ToolRef(kind, name, namespace)
        chat.append(_function_tool(tool, chat_name, at) if kind == "function" else _custom_tool(tool, chat_name, at))

    for index, tool in enumerate(tools):
        add(tool, f"{where}[{index}]", None)
    return chat, refs, list(dropped)


def _tool_choice(choice: Any, refs: Mapping[str, ToolRef]) -> tuple[Any, set[str] | None]:
    """The chat ``tool_choice``, and the names an ``allowed_tools`` choice keeps (None: all)."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice, None
    if not isinstance(choice, dict):
        raise _bad("tool_choice", "must be 'auto', 'none', 'required' or an object")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        chat_name = flat_name(_str(choice, "name", "tool_choice"), _opt_str(choice, "namespace", "tool_choice"))
        if chat_name not in refs:
            raise _bad("tool_choice.name", f"names no tool in 'tools': {chat_name!r}")
        return {"type": "function", "function": {"name": chat_name}}, None
    if kind == "allowed_tools":
        mode, listed = choice.get("mode", "auto"), choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(listed, list):
            raise _bad("tool_choice", "allowed_tools needs mode 'auto' or 'required' and a list of tools")
        allowed = {
            flat_name(tool["name"], tool.get("namespace"))
            for tool in listed
            if isinstance(tool, dict) and isinstance(tool.get("name"), str)
        }
        return mode, allowed
    raise _bad("tool_choice", f"type {kind!r} is a hosted tool that the engine is not offered")


# --- input items -----------------------------------------------------------------------------


def _part_to_chat(part: Any, where: str) -> Body:
    if not isinstance(part, dict):
        raise _bad(where, "each content part must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad(f"{where}.text", "must be a string")
        return {"type": "text", "text": text}
    if kind == "refusal":
        return {"type": "text", "text": _str(part, "refusal", where)}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _bad(f"{where}.image_url", "an image must be given by URL or data URL (file_id is not supported)")
        image: Body = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise _bad(f"{where}.type", f"content part type {kind!r} is not supported")


def _content_to_chat(content: Any, where: str) -> str | list[Body]:
    """A string, or chat parts; text-only content becomes one string, which every template renders."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of content parts")
    parts = [_part_to_chat(part, f"{where}[{index}]") for index, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _system_text(content: Any, where: str) -> str:
    text = _content_to_chat(content, where)
    if not isinstance(text, str):
        raise _bad(where, "system and developer messages can only hold text")
    return text


def _reasoning_text(item: Body) -> str | None:
    """The readable text of a reasoning item: its content, else its summary; None when encrypted only."""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            found = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == part_type]
            texts = [text for text in found if isinstance(text, str) and text]
            if texts:
                return "\n".join(texts)
    return None


def _call_to_chat(item: Body, where: str) -> Body:
    """A function or custom tool call item as one chat ``tool_calls`` entry."""
    name = flat_name(_str(item, "name", where), _opt_str(item, "namespace", where))
    if item.get("type") == "function_call":
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise _bad(f"{where}.arguments", "must be a string of JSON")
    else:
        text = item.get("input")
        if not isinstance(text, str):
            raise _bad(f"{where}.input", "must be a string")
        arguments = orjson.dumps({"input": text}).decode()
    return {"id": _str(item, "call_id", where), "type": "function", "function": {"name": name, "arguments": arguments}}


def _output_to_chat(item: Body, where: str) -> Body:
    output = item.get("output")
    return {
        "role": "tool",
        "tool_call_id": _str(item, "call_id", where),
        "content": _content_to_chat(output, f"{where}.output"),
    }


class _Turn:
    """One assistant chat message, assembled from consecutive reasoning, message and call items."""

    __slots__ = ("calls", "reasoning", "text")

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: list[Body] = []

    def takes(self, kind: str) -> bool:
        """Responses order inside a turn is reasoning, then text, then calls."""
        if kind == "reasoning":
            return not self.text and not self.calls
        return kind in _CALL_ITEMS or not self.calls

    def message(self) -> Body | None:
        if not self.text and not self.calls:
            return None  # reasoning alone: nothing to render as a turn
        # "" rather than null beside tool_calls: both are valid Chat, and llama-cpp-python 0.3.36 rejects null.
        message: Body = {"role": "assistant", "content": "\n".join(self.text)}
        if self.calls:
            message["tool_calls"] = self.calls
        if self.reasoning:
            message["reasoning_content"] = "\n".join(self.reasoning)
        return message


def _item_kind(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise _bad(where, "each input item must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if not isinstance(kind, str):
        raise _bad(f"{where}.type", "must name the item type")
    return kind


def _items_to_messages(items: Messages, label: Mapping[int, str]) -> Messages:
    """Chat messages for ordered Responses items (``label`` gives each item's place for errors)."""
    messages: Messages = []
    turn: _Turn | None = None

    def close() -> None:
        nonlocal turn
        message = turn.message() if turn is not None else None
        if message is not None:
            messages.append(message)
        turn = None

    for item in items:
        where = label.get(id(item), "input")
        kind = _item_kind(item, where)
        role = item.get("role") if kind == "message" else "assistant"
        if kind in ("reasoning", "message", *_CALL_ITEMS) and role == "assistant":
            if turn is None or not turn.takes(kind):
                close()
                turn = _Turn()
            if kind == "reasoning":
                text = _reasoning_text(item)
                if text:
                    turn.reasoning.append(text)
            elif kind == "message":
                content = _content_to_chat(item.get("content"), f"{where}.content")
                if not isinstance(content, str):
                    raise _bad(f"{where}.content", "assistant messages can only hold text")
                turn.text.append(content)
            else:
                turn.calls.append(_call_to_chat(item, where))
            continue
        close()
        if kind == "message":
            if role in ("system", "developer"):
                messages.append({"role": "system", "content": _system_text(item.get("content"), f"{where}.content")})
            elif role == "user":
                messages.append({"role": "user", "content": _content_to_chat(item.get("content"), f"{where}.content")})
            else:
                raise _bad(f"{where}.role", "must be user, assistant, system or developer")
        elif kind in _OUTPUT_ITEMS:
            messages.append(_output_to_chat(item, where))
        elif kind != "additional_tools":
            raise _bad(f"{where}.type", f"input item type {kind!r} is not supported")
    close()
    return messages


def _with_system(instructions: str | None, messages: Messages) -> Messages:
    """``instructions`` and the leading system and developer messages become one system message.

    Later ones stay where they are, as system messages.
    """
    texts = [instructions] if instructions else []
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        texts.append(messages[start]["content"])
        start += 1
    if not texts:
        return messages
    return [{"role": "system", "content": "\n\n".join(texts)}, *messages[start:]]


# --- the request ---------------------------------------------------------------------------


def _response_format(text: Any) -> Body | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("text", "must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format", "must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise _bad("text.format.type", "must be 'text', 'json_object' or 'json_schema'")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _bad("text.format.schema", "must be a JSON schema object")
    spec: Body = {"name": _opt_str(fmt, "name", "text.format") or "response", "schema": schema}
    if isinstance(fmt.get("strict"), bool):
        spec["strict"] = fmt["strict"]
    if isinstance(fmt.get("description"), str):
        spec["description"] = fmt["description"]
    return {"type": "json_schema", "json_schema": spec}


def _sampling(data: Body) -> Body:
    chat: Body = {}
    limit = data.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _bad("max_output_tokens", "must be a positive integer")
        chat["max_tokens"] = limit
    for key in ("temperature", "top_p"):
        value = _opt_number(data, key)
        if value is not None:
            chat[key] = value
    top = data.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise _bad("top_logprobs", "must be an integer from 0 to 20")
    if responses_logprobs_asked(data) is not None:
        chat["logprobs"] = True  # the engine's token logprobs become each output_text's logprobs
        chat["top_logprobs"] = top or 0
    return chat


def _input_items(value: Any) -> Messages:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise _bad("input", "must be a string or a list of items")
    return value


def previous_response_id(data: Body) -> str | None:
    """The stored response this request continues, if any.

    >>> previous_response_id({"previous_response_id": "resp_1"})
    'resp_1'
    """
    return _opt_str(data, "previous_response_id", "body")


def _echo(data: Body) -> Body:
    """The request fields a Response object repeats back, with the API's defaults."""
    return {
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "metadata": data.get("metadata") or {},
        "model": data.get("model"),
        "parallel_tool_calls": data.get("parallel_tool_calls", True),
        "previous_response_id": data.get("previous_response_id"),
        "reasoning": data.get("reasoning") or {"effort": None, "summary": None},
        "store": data.get("store", True),
        "temperature": data.get("temperature"),
        "text": data.get("text") or {"format": {"type": "text"}},
        "tool_choice": data.get("tool_choice", "auto"),
        "tools": data.get("tools") or [],
        "top_p": data.get("top_p"),
        "truncation": data.get("truncation", "disabled"),
        "user": data.get("user"),
    }


@dataclass(frozen=True)
class ResponsesPlan:
    """Everything a handler needs to serve one Responses request through a Chat engine.

    ``items`` is the whole conversation as Responses items, history first and in call
    order: what a stored response keeps, so that a continuation can replay it.
    """

    chat: Body
    stream: bool
    store: bool
    tools: ToolMap
    dropped_tools: tuple[str, ...]
    items: Messages
    report: OrderReport
    echo: Body


def unseen_image(items: Messages) -> str | None:
    """Where the client's ``input`` items hold an image, as the client's own field path; None when none.

    >>> unseen_image([{"role": "user", "content": [{"type": "input_text", "text": "a"},
    ...                                            {"type": "input_image", "image_url": "data:,"}]}])
    'input[0].content[1]'
    """
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        for key in ("content", "output"):
            parts = item.get(key)
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                if isinstance(part, dict) and part.get("type") == "input_image":
                    return f"input[{i}].{key}[{j}]"
    return None


def translate_request(data: Body, history: Messages | None = None, *, sees_images: bool = True) -> ResponsesPlan:
    """Turn a Responses request, continuing ``history``, into a Chat Completions body.

    For a model that cannot see (``sees_images`` False), an image in ``input`` is a 400 naming the
    client's own field, checked before translation.

    >>> plan = translate_request({"model": "m", "instructions": "Be brief.", "input": "Hi",
    ...                           "max_output_tokens": 20})
    >>> plan.chat
    {'model': 'm', 'messages': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], \
'max_tokens': 20}
    """
    for key, what in _UNSUPPORTED_FIELDS.items():
        if data.get(key):
            raise _bad(key, f"{what} are not supported by this engine")
    stream = bool(_opt_bool(data, "stream"))
    store = _opt_bool(data, "store") is not False
    previous_response_id(data)
    model = _opt_str(data, "model", "body")
    instructions = _opt_str(data, "instructions", "body")
    fresh = _input_items(data.get("input"))
    if not sees_images:
        where = unseen_image(fresh)
        if where is not None:
            raise _bad(where, "this model cannot see images; set vision: true only if the engine runs a vision model")
    label = {id(item): f"input[{index}]" for index, item in enumerate(fresh)}
    items, report = order_responses_items([*(history or []), *fresh])

    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "must be a list")
    extra = [item for item in items if isinstance(item, dict) and item.get("type") == "additional_tools"]
    all_tools = list(tools or [])
    for item in extra:
        if not isinstance(item.get("tools"), list):
            raise _bad(f"{label.get(id(item), 'input')}.tools", "must be a list")
        all_tools.extend(item["tools"])
    chat_tools, refs, dropped = _tools_to_chat(all_tools, "tools")
    choice, allowed = _tool_choice(data.get("tool_choice"), refs)
    if allowed is not None:
        chat_tools = [tool for tool in chat_tools if tool["function"]["name"] in allowed]

    messages = _with_system(instructions, _items_to_messages(items, label))
    if not any(message["role"] != "system" for message in messages):
        raise _bad("input", "there is nothing to respond to: give at least one input message")
    chat: Body = {"model": model} if model else {}
    chat["messages"] = messages
    if chat_tools:
        chat["tools"] = chat_tools
        if choice is not None:
            chat["tool_choice"] = choice
        parallel = _opt_bool(data, "parallel_tool_calls")
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    response_format = _response_format(data.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    chat.update(_sampling(data))
    chat = _thinking(chat, data)
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return ResponsesPlan(chat, stream, store, ToolMap(refs), tuple(dropped), items, report, _echo(data))


def _thinking(chat: Body, data: Body) -> Body:
    """``reasoning.effort`` as Chat's ``reasoning_effort`` and the template's switch; the client's kwargs win."""
    switch = responses_switch(data.get("reasoning"))
    effort = data["reasoning"].get("effort") if switch.asked else None
    if isinstance(effort, str) and effort != "none":
        chat["reasoning_effort"] = switch.effort
    if "chat_template_kwargs" in data:
        chat["chat_template_kwargs"] = data["chat_template_kwargs"]
    return with_switch(chat, switch)


@dataclass(frozen=True)
class NativePlan:
    """What to forward to an engine that serves ``/v1/responses`` itself.

    ``body`` is the client's own bytes whenever nothing moved.
    """

    body: bytes
    report: OrderReport
    model: ModelPlan
    """The model name the engine gets; when it is not the client's, the answer names the client's again."""


def plan_native_request(raw: bytes, *, thinking_switch: bool = False, names: ModelNames = NO_NAMES) -> NativePlan:
    """Validate a Responses body and restore call order of its output runs, for native forwarding.

    ``thinking_switch``: the engine reads ``chat_template_kwargs`` (llama-server maps
    ``reasoning.effort`` to the template's ``reasoning_effort`` but never turns ``enable_thinking``
    on or off), so ``reasoning.effort`` is added there as well.

    >>> plan_native_request(b'{"input": "hi"}').body
    b'{"input": "hi"}'
    >>> plan_native_request(b'{"reasoning": {"effort": "none"}}', thinking_switch=True).body
    b'{"reasoning":{"effort":"none"},"chat_template_kwargs":{"enable_thinking":false}}'
    """
    data = decode_body(raw)
    model = names.plan(data)
    switched = with_model(data, model)
    if thinking_switch:
        with contextlib.suppress(ClientInputError):  # a control the engine would refuse: its answer stands
            switched = with_switch(switched, responses_switch(data.get("reasoning")))
    items = data.get("input")
    if CALL_MARKER not in raw or not isinstance(items, list):
        return NativePlan(raw if switched is data else orjson.dumps(switched), NO_RUNS, model)
    ordered, report = order_responses_items(items)
    if ordered is items:
        return NativePlan(raw if switched is data else orjson.dumps(switched), report, model)
    return NativePlan(orjson.dumps({**switched, "input": ordered}), report, model)
