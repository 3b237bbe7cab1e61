"""OpenAI Responses <-> Chat Completions, for engines that have no ``/v1/responses``.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson

from proxy._types import Body, Messages
from proxy.dialects.chat.request import decode_body
from proxy.errors import ClientInputError, ToolpairError, UpstreamError, response_error
from proxy.order import OrderReport, order_responses_items

__all__ = [
    "CALL_MARKER",
    "Event",
    "NativePlan",
    "ResponsesPlan",
    "ResponsesStream",
    "StreamStateError",
    "ToolMap",
    "ToolRef",
    "chat_to_response",
    "flat_name",
    "plan_native_request",
    "previous_response_id",
    "translate_request",
]

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


def translate_request(data: Body, history: Messages | None = None) -> ResponsesPlan:
    """Turn a Responses request, continuing ``history``, into a Chat Completions body.

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
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return ResponsesPlan(chat, stream, store, ToolMap(refs), tuple(dropped), items, report, _echo(data))


@dataclass(frozen=True)
class NativePlan:
    """What to forward to an engine that serves ``/v1/responses`` itself.

    ``body`` is the client's own bytes whenever nothing moved.
    """

    body: bytes
    report: OrderReport


def plan_native_request(raw: bytes) -> NativePlan:
    """Validate a Responses body and restore call order of its output runs, for native forwarding.

    >>> plan_native_request(b'{"input": "hi"}').body
    b'{"input": "hi"}'
    """
    data = decode_body(raw)
    items = data.get("input")
    if CALL_MARKER not in raw or not isinstance(items, list):
        return NativePlan(raw, OrderReport())
    ordered, report = order_responses_items(items)
    if ordered is items:
        return NativePlan(raw, report)
    return NativePlan(orjson.dumps({**data, "input": ordered}), report)


# --- the response: one state machine for streams, reused for whole completions ----------------


_TRUNCATED = {"length": "max_output_tokens", "content_filter": "content_filter"}  # chat finish -> incomplete reason


class StreamStateError(RuntimeError):
    """Raised when the stream transducer is driven in an order that cannot happen (a toolpair bug)."""


class _Phase(Enum):
    NEW = "new"  # nothing sent yet
    OPEN = "open"  # response.created sent; items may be added
    DONE = "done"  # completed, incomplete or failed sent; nothing more


@dataclass
class _Item:
    """The one output item that is currently open."""

    kind: str  # reasoning, message, function_call or custom_tool_call
    index: int  # output_index
    id: str
    chat_index: int | None = None  # the chat tool call index it came from
    call_id: str = ""
    ref: ToolRef | None = None
    parts: list[str] = field(default_factory=list)
    announced: bool = False  # output_item.added sent (a call waits for its name)


def _tokens(usage: Body, key: str, detail: str | None = None) -> int:
    """A token count from the engine's usage; anything but a number there counts as 0."""
    value = usage.get(key)
    if detail is not None:
        value = value.get(detail) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _usage(chat_usage: Any) -> Body | None:
    """Responses usage from a chat ``usage`` object.

    >>> _usage({"prompt_tokens": 3, "completion_tokens": "2", "prompt_tokens_details": []})["total_tokens"]
    3
    """
    if not isinstance(chat_usage, dict):
        return None
    prompt = _tokens(chat_usage, "prompt_tokens")
    completion = _tokens(chat_usage, "completion_tokens")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": _tokens(chat_usage, "prompt_tokens_details", "cached_tokens")},
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _tokens(chat_usage, "completion_tokens_details", "reasoning_tokens")
        },
        "total_tokens": _tokens(chat_usage, "total_tokens") or prompt + completion,
    }


class ResponsesStream:
    """Chat chunk dicts in, Responses stream events out.

    ``start()`` gives ``response.created`` and ``response.in_progress``; each ``feed(chunk)`` the
    events for one chat chunk; ``finish()`` closes the open item and gives ``response.completed``
    (or ``response.incomplete`` when the engine hit its token limit); ``fail(error)`` ends with
    ``response.failed`` instead. Exactly one output item is open at a time, so every
    ``output_index`` is new, each ``added`` gets its ``done`` with the same identity, and the
    closing event carries the full output list, as the openai SDK's stream helper demands.

    >>> s = ResponsesStream(translate_request({"input": "hi"}), "resp_1", 0)
    >>> [e["type"] for e in s.start() + s.feed({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})]
    ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added', \
'response.output_text.delta']
    >>> [e["type"] for e in s.finish()][-1], s.response["output"][0]["content"][0]["text"]
    ('response.completed', 'Hi')
    """

    def __init__(self, plan: ResponsesPlan, response_id: str, created_at: int) -> None:
        self._plan = plan
        self._id = response_id
        self._created_at = created_at
        self._phase = _Phase.NEW
        self._sequence = 0
        self._open: _Item | None = None
        self._output: list[Body] = []
        self._chat_calls: set[int] = set()
        self._finish_reason: str | None = None
        self._usage: Body | None = None
        self._model: str | None = None
        self.response: Body = self._snapshot("in_progress")

    # -- public steps ---------------------------------------------------------------------------

    def start(self) -> list[Event]:
        if self._phase is not _Phase.NEW:
            raise StreamStateError("start() called twice")
        self._phase = _Phase.OPEN
        snapshot = self._snapshot("in_progress")
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: Body) -> list[Event]:
        if self._phase is not _Phase.OPEN:
            raise StreamStateError(f"feed() while the stream is {self._phase.value}")
        if isinstance(chunk.get("model"), str):
            self._model = chunk["model"]
        usage = _usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise UpstreamError("the engine sent a chunk whose 'choices' is not a list")
        events: list[Event] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                raise UpstreamError("the engine sent a malformed choice or more than one choice")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise UpstreamError("the engine sent a malformed delta")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                events += self._text("reasoning", reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                events += self._text("message", content)
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    events += self._call_delta(call)
            if isinstance(choice.get("finish_reason"), str):
                self._finish_reason = choice["finish_reason"]
                events += self._close("incomplete" if self._finish_reason in _TRUNCATED else "completed")
        return events

    def finish(self) -> list[Event]:
        if self._phase is not _Phase.OPEN:
            raise StreamStateError(f"finish() while the stream is {self._phase.value}")
        truncated = self._finish_reason in _TRUNCATED
        events = self._close("incomplete" if truncated else "completed")
        self._phase = _Phase.DONE
        if truncated:
            reason = _TRUNCATED[str(self._finish_reason)]
            self.response = self._snapshot("incomplete", incomplete_details={"reason": reason})
            return [*events, self._event("response.incomplete", response=self.response)]
        self.response = self._snapshot("completed")
        return [*events, self._event("response.completed", response=self.response)]

    def fail(self, error: ToolpairError) -> list[Event]:
        """End the stream with ``response.failed``; an open item is finished as incomplete first."""
        if self._phase is _Phase.DONE:
            raise StreamStateError("fail() after the stream ended")
        events = self.start() if self._phase is _Phase.NEW else []
        if self._open is not None and not self._open.announced:
            self._open = None  # never shown to the client, so nothing to finish
        events += self._close("incomplete")
        self._phase = _Phase.DONE
        self.response = self._snapshot("failed", error=response_error(error))
        return [*events, self._event("response.failed", response=self.response)]

    @property
    def completed(self) -> bool:
        """True once the response finished normally (completed or incomplete, not failed)."""
        return self._phase is _Phase.DONE and self.response["status"] != "failed"

    # -- building blocks ------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        event: Event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _snapshot(self, status: str, **extra: Any) -> Body:
        echo = self._plan.echo
        return {
            "id": self._id,
            "object": "response",
            "created_at": self._created_at,
            "status": status,
            "error": extra.get("error"),
            "incomplete_details": extra.get("incomplete_details"),
            **echo,
            "model": echo["model"] or self._model or "unknown",
            "output": list(self._output),
            "usage": self._usage if status != "in_progress" else None,
        }

    def _new_item(self, kind: str, prefix: str) -> _Item:
        index = len(self._output)
        return _Item(kind, index, f"{prefix}_{self._id.removeprefix('resp_')}_{index}")

    def _added(self, item: _Item) -> Event:
        item.announced = True
        return self._event("response.output_item.added", output_index=item.index, item=self._body(item, "in_progress"))

    def _body(self, item: _Item, status: str) -> Body:
        """The item as the client sees it; ``status`` is in_progress until it is done."""
        text = "".join(item.parts)
        if item.kind == "message":
            content = [] if status == "in_progress" else [_text_part(text)]
            return {"id": item.id, "type": "message", "status": status, "role": "assistant", "content": content}
        if item.kind == "reasoning":
            content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
            return {"id": item.id, "type": "reasoning", "status": status, "summary": [], "content": content}
        assert item.ref is not None
        body: Body = {
            "id": item.id,
            "type": item.kind,
            "status": status,
            "call_id": item.call_id,
            "name": item.ref.name,
        }
        if item.ref.namespace is not None:
            body["namespace"] = item.ref.namespace
        if item.kind == "function_call":
            body["arguments"] = text if status != "in_progress" else ""
        else:
            body["input"] = _custom_input(text) if status != "in_progress" else ""
        return body

    def _text(self, kind: str, delta: str) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if item is None or item.kind != kind:
            events += self._close("completed")
            item = self._open = self._new_item(kind, "msg" if kind == "message" else "rs")
            events.append(self._added(item))
            part = _text_part("") if kind == "message" else {"type": "reasoning_text", "text": ""}
            events.append(self._event("response.content_part.added", **self._where(item), part=part))
        item.parts.append(delta)
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: Body = {"logprobs": []} if kind == "message" else {}
        events.append(self._event(name, **self._where(item), delta=delta, **extra))
        return events

    def _where(self, item: _Item, content: bool = True) -> Body:
        where: Body = {"item_id": item.id, "output_index": item.index}
        if content:
            where["content_index"] = 0
        return where

    def _call_delta(self, call: Any) -> list[Event]:
        if not isinstance(call, dict):
            raise UpstreamError("the engine sent a malformed tool call delta")
        chat_index = call.get("index", 0)
        function = call.get("function") or {}
        if not isinstance(chat_index, int) or not isinstance(function, dict):
            raise UpstreamError("the engine sent a malformed tool call delta")
        events: list[Event] = []
        item = self._open
        if item is None or item.chat_index != chat_index:
            if chat_index in self._chat_calls:
                raise UpstreamError(f"the engine resumed tool call {chat_index} after another output had started")
            events += self._close("completed")
            self._chat_calls.add(chat_index)
            item = self._open = self._new_item("function_call", "fc")
            item.chat_index = chat_index
        if not item.call_id and isinstance(call.get("id"), str) and call["id"]:
            item.call_id = call["id"]
        name = function.get("name")
        if item.ref is None and isinstance(name, str) and name:
            item.ref = self._plan.tools.ref(name)
            item.kind = "function_call" if item.ref.kind == "function" else "custom_tool_call"
            if item.kind == "custom_tool_call":
                item.id = "ctc" + item.id.removeprefix("fc")
            item.call_id = item.call_id or f"call_{item.id}"
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.parts.append(arguments)
        if item.ref is None:
            return events  # the name has not arrived yet: hold the arguments
        if not item.announced:
            events.append(self._added(item))
            held = "".join(item.parts)
            if held and item.kind == "function_call":
                events.append(
                    self._event("response.function_call_arguments.delta", **self._where(item, False), delta=held)
                )
        elif item.kind == "function_call" and isinstance(arguments, str) and arguments:
            events.append(
                self._event("response.function_call_arguments.delta", **self._where(item, False), delta=arguments)
            )
        return events

    def _close(self, status: str) -> list[Event]:
        """Finish the open item: its done events, then output_item.done; it joins the output list."""
        item = self._open
        if item is None:
            return []
        if not item.announced:
            raise UpstreamError("the engine sent a tool call without a function name")
        self._open = None
        body = self._body(item, status)
        events: list[Event] = []
        if item.kind in ("message", "reasoning"):
            text = body["content"][0]["text"]
            name = "response.output_text.done" if item.kind == "message" else "response.reasoning_text.done"
            extra: Body = {"logprobs": []} if item.kind == "message" else {}
            events.append(self._event(name, **self._where(item), text=text, **extra))
            events.append(self._event("response.content_part.done", **self._where(item), part=body["content"][0]))
        elif item.kind == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **self._where(item, False),
                    name=body["name"],
                    arguments=body["arguments"],
                )
            )
        else:
            if body["input"]:
                events.append(
                    self._event(
                        "response.custom_tool_call_input.delta", **self._where(item, False), delta=body["input"]
                    )
                )
            events.append(
                self._event("response.custom_tool_call_input.done", **self._where(item, False), input=body["input"])
            )
        events.append(self._event("response.output_item.done", output_index=item.index, item=body))
        self._output.append(body)
        return events


def _text_part(text: str) -> Body:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _custom_input(arguments: str) -> str:
    """The free text of a custom tool call, from the ``{"input": ...}`` arguments of its function."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


def chat_to_response(completion: Body, plan: ResponsesPlan, response_id: str, created_at: int) -> Body:
    """A whole ``chat.completion`` as a Response object (the stream transducer, fed once).

    >>> plan = translate_request({"model": "m", "input": "hi"})
    >>> done = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
    ...          "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    >>> r = chat_to_response(done, plan, "resp_1", 0)
    >>> r["status"], r["output"][0]["content"][0]["text"], r["usage"]["total_tokens"]
    ('completed', 'Hello', 4)
    """
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamError("the engine answered without a choice")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise UpstreamError("the engine answered without a message")
    calls = message.get("tool_calls")
    delta: Body = {
        "reasoning_content": message.get("reasoning_content") or message.get("reasoning"),
        "content": message.get("content"),
        "tool_calls": [{**call, "index": i} if isinstance(call, dict) else call for i, call in enumerate(calls)]
        if isinstance(calls, list)
        else None,
    }
    stream = ResponsesStream(plan, response_id, created_at)
    stream.start()
    stream.feed(
        {
            "model": completion.get("model"),
            "usage": completion.get("usage"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}],
        }
    )
    stream.finish()
    return stream.response


def encode(events: Sequence[Event]) -> bytes:
    """Events as SSE frames, each named by its type, as the Responses API sends them."""
    return b"".join(
        b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n" for event in events
    )
