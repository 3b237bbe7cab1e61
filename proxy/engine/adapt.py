"""Chat Completions requests rewritten into shapes a given engine accepts.

Applied after ordering, driven by the engine's row in :mod:`proxy.engine.kinds`.
Each rule is a small pure function that answers one question about the body
and returns it unchanged (the same object) when it has nothing to do, so a
request that needs nothing keeps the client's exact bytes. Rules never mutate
the caller's objects: a changed message is a new dict.

A request the engine cannot serve at all (``n`` > 1, images for a model that
cannot see them, custom tools) is refused with a
:class:`~proxy.errors.ClientInputError`: a clear 400 instead of the engine's
500 or, worse, a reply that silently ignored part of the request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from proxy._types import Body, Message
from proxy.engine.call_ids import rendered_ids
from proxy.engine.kinds import EngineKind, EngineProfile
from proxy.errors import ClientInputError

__all__ = [
    "RESPONSES_LOGPROBS_INCLUDE",
    "RULES",
    "adapt_chat_request",
    "refuse_completion_logprobs",
    "refuse_responses_logprobs",
    "responses_logprobs_asked",
]

_TEXT_PARTS = frozenset({"text", "refusal"})
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _listed(value: Any) -> list[Any]:
    """``value`` when it is a list, else nothing: a field of the wrong type is the engine's to refuse."""
    return value if isinstance(value, list) else []


def _parts(message: Any) -> list[Any]:
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        return list(message["content"])
    return []


def _part_type(part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else None
    return kind if isinstance(kind, str) else None


def refuse_multiple_choices(body: Body, profile: EngineProfile) -> Body:
    """``n`` > 1 is an error where the engine would silently answer one choice."""
    n = body.get("n")
    if profile.multiple_choices or n is None or n == 1:
        return body
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ClientInputError(f"'n' must be a positive integer, got {n!r}", param="n")
    raise ClientInputError(
        f"this engine ({profile.kind}) returns one choice per request; 'n' = {n} is not supported", param="n"
    )


def refuse_unseen_media(body: Body, profile: EngineProfile) -> Body:
    """Images for a model that cannot see them, and audio or files it cannot read, are a 400."""
    if profile.refuses_unseen_media:
        return body
    for i, message in enumerate(_listed(body.get("messages"))):
        for j, part in enumerate(_parts(message)):
            kind = _part_type(part)
            where = f"messages[{i}].content[{j}]"
            if kind == "image_url" and not profile.vision:
                raise ClientInputError(
                    f"this model cannot see images ({where} is an image_url part); "
                    "set vision: true only if the engine runs a vision model",
                    param=where,
                )
            if kind in ("input_audio", "file") and not profile.audio_and_files:
                raise ClientInputError(f"this engine ({profile.kind}) cannot read {kind} parts ({where})", param=where)
    return body


def refuse_custom_tools(body: Body, profile: EngineProfile) -> Body:
    """Custom (free-form) tools have no function schema; an engine without them cannot call them."""
    if profile.custom_tools:
        return body
    for i, tool in enumerate(_listed(body.get("tools"))):
        if isinstance(tool, dict) and tool.get("type") == "custom":
            raise ClientInputError(f"this engine ({profile.kind}) supports only function tools", param=f"tools[{i}]")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "custom":
        raise ClientInputError(f"this engine ({profile.kind}) supports only function tools", param="tool_choice")
    for i, message in enumerate(_listed(body.get("messages"))):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            if isinstance(call, dict) and call.get("type") == "custom":
                where = f"messages[{i}].tool_calls[{j}]"
                raise ClientInputError(f"this engine ({profile.kind}) supports only function tool calls", param=where)
    return body


def _joined_text(parts: list[Any], where: str) -> str:
    texts: list[str] = []
    for j, part in enumerate(parts):
        kind = _part_type(part)
        value = part.get(kind) if kind in _TEXT_PARTS else None
        if not isinstance(value, str):
            raise ClientInputError(
                f"{where}.content[{j}] is a {kind or 'malformed'} part; only text parts fit here", param=where
            )
        texts.append(value)
    return "\n".join(texts)


def _adapt_message(message: Message, index: int, profile: EngineProfile) -> Message:
    role = message.get("role")
    if not isinstance(role, str):
        raise ClientInputError(f"messages[{index}].role must be a string", param=f"messages[{index}].role")
    content = message.get("content")
    changed: Message = message
    if role == "developer" and not profile.developer_role:
        changed = {**changed, "role": "system"}
        role = "system"
    if content is None and "content" in message and role not in profile.null_content_roles:
        changed = {**changed, "content": ""}
    elif isinstance(content, list) and role not in profile.list_content_roles:
        changed = {**changed, "content": _joined_text(content, f"messages[{index}]")}
    return changed


def adapt_messages(body: Body, profile: EngineProfile) -> Body:
    """Per message: ``developer`` -> ``system``, null content -> ``""``, lists of text parts -> one string.

    >>> from proxy.engine.kinds import engine_profile
    >>> adapt_messages({"messages": [{"role": "assistant", "content": None}]}, engine_profile("llama-cpp-python"))
    {'messages': [{'role': 'assistant', 'content': ''}]}
    """
    messages = body.get("messages")
    takes_all = profile.developer_role and profile.null_content_roles >= _ROLES and profile.list_content_roles >= _ROLES
    if takes_all or not isinstance(messages, list):
        return body
    adapted = [_adapt_message(m, i, profile) if isinstance(m, dict) else m for i, m in enumerate(messages)]
    if all(a is m for a, m in zip(adapted, messages, strict=True)):
        return body
    return {**body, "messages": adapted}


def _call_names(message: Any) -> dict[str, str]:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    names: dict[str, str] = {}
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, dict) and isinstance(call.get("id"), str):
            function = call.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            names[call["id"]] = name if isinstance(name, str) else "tool"
    return names


def move_tool_images(body: Body, profile: EngineProfile) -> Body:
    """Image parts in tool messages move to one user message right after their run of results.

    Tool messages carry text only on such engines. Each moved group is headed
    by a text part naming the call it answers, so the model can still pair an
    image with its call; a result left with no text says where its image went.
    """
    messages = body.get("messages")
    if profile.images_in_tool_results or not isinstance(messages, list):
        return body
    if not any(
        isinstance(m, dict) and m.get("role") == "tool" and any(_part_type(p) == "image_url" for p in _parts(m))
        for m in messages
    ):
        return body
    out: list[Any] = []
    names: dict[str, str] = {}
    moved: list[Any] = []
    for message in messages:
        is_tool = isinstance(message, dict) and message.get("role") == "tool"
        if not is_tool and moved:
            out.append({"role": "user", "content": moved})
            moved = []
        if not is_tool:
            names = _call_names(message) or names
            out.append(message)
            continue
        parts = _parts(message)
        images = [p for p in parts if _part_type(p) == "image_url"]
        if not images:
            out.append(message)
            continue
        call_id = message.get("tool_call_id")
        label = f"{names.get(call_id, 'tool')} ({call_id})" if isinstance(call_id, str) else "a tool"
        moved.append({"type": "text", "text": f"Image output of the call {label}:"})
        moved.extend(images)
        rest = [p for p in parts if _part_type(p) != "image_url"]
        out.append({**message, "content": rest or "[image output follows in the next message]"})
    if moved:
        out.append({"role": "user", "content": moved})
    return {**body, "messages": out}


def fill_tool_parameters(body: Body, profile: EngineProfile) -> Body:
    """A function tool without ``parameters`` gets the empty object schema it means."""
    tools = body.get("tools")
    if profile.tools_without_parameters or not isinstance(tools, list):
        return body
    filled = [
        {**t, "function": {**t["function"], "parameters": {"type": "object", "properties": {}}}}
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and "parameters" not in t["function"]
        else t
        for t in tools
    ]
    if all(a is b for a, b in zip(filled, tools, strict=True)):
        return body
    return {**body, "tools": filled}


def narrow_allowed_tools(body: Body, profile: EngineProfile) -> Body:
    """``tool_choice: allowed_tools`` becomes its mode, with ``tools`` narrowed to the allowed ones."""
    choice = body.get("tool_choice")
    if profile.allowed_tools_choice or not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return body
    allowed = choice.get("allowed_tools")
    mode = allowed.get("mode") if isinstance(allowed, dict) else None
    listed = allowed.get("tools") if isinstance(allowed, dict) else None
    if mode not in ("auto", "required") or not isinstance(listed, list):
        message = "tool_choice.allowed_tools needs a mode (auto or required) and a list of tools"
        raise ClientInputError(message, param="tool_choice")
    wanted = {t["function"].get("name") for t in listed if isinstance(t, dict) and isinstance(t.get("function"), dict)}
    tools = [
        t
        for t in _listed(body.get("tools"))
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") in wanted
    ]
    return {**body, "tool_choice": mode, "tools": tools}


def rename_max_completion_tokens(body: Body, profile: EngineProfile) -> Body:
    """``max_completion_tokens`` becomes ``max_tokens`` (the smaller wins when both are set)."""
    if profile.max_completion_tokens or "max_completion_tokens" not in body:
        return body
    adapted = dict(body)
    limit = adapted.pop("max_completion_tokens")
    current = adapted.get("max_tokens")
    if limit is not None:
        both = isinstance(current, int) and isinstance(limit, int)
        adapted["max_tokens"] = min(current, limit) if both else limit if current is None else current
    return adapted


def json_schema_as_json_object(body: Body, profile: EngineProfile) -> Body:
    """``response_format`` ``json_schema`` becomes ``json_object`` carrying the same schema.

    >>> from proxy.engine.kinds import engine_profile
    >>> fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    >>> json_schema_as_json_object({"response_format": fmt}, engine_profile("llama-cpp-python"))
    {'response_format': {'type': 'json_object', 'schema': {'type': 'object'}}}
    """
    fmt = body.get("response_format")
    if profile.json_schema or not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return body
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    adapted: dict[str, Any] = {"type": "json_object"}
    if isinstance(schema, dict):
        adapted["schema"] = schema
    return {**body, "response_format": adapted}


_LOGPROBS_OFF = (
    "this engine runs without logprobs ({param} asks for them); start toolpair serve with --logprobs "
    "(setting engine_logprobs: true) to serve them, at the memory cost its banner states"
)


def map_call_ids_for_template(body: Body, profile: EngineProfile) -> Body:
    """Tool-call IDs the model's template would refuse (Mistral's nine characters) mapped for rendering."""
    messages = body.get("messages")
    if profile.call_id_form == "any" or not isinstance(messages, list):
        return body
    mapped = rendered_ids(messages, profile.call_id_form)
    return body if mapped is messages else {**body, "messages": mapped}


def refuse_logprobs(body: Body, profile: EngineProfile) -> Body:
    """``logprobs`` or ``top_logprobs`` for an engine without them is a 400, not its 500 or a silent null."""
    if profile.logprobs:
        return body
    for param in ("logprobs", "top_logprobs"):
        value = body.get(param)
        if value is not None and value is not False:
            raise ClientInputError(_LOGPROBS_OFF.format(param=param), param=param)
    return body


def refuse_completion_logprobs(raw: bytes | None, profile: EngineProfile) -> None:
    """The same refusal for a legacy ``/v1/completions`` body, which otherwise goes upstream untouched."""
    if profile.logprobs or not raw or b"logprobs" not in raw:
        return
    try:
        body = json.loads(raw)
    except ValueError:
        return  # not JSON: the engine's to refuse
    if isinstance(body, dict) and body.get("logprobs") is not None:
        raise ClientInputError(_LOGPROBS_OFF.format(param="logprobs"), param="logprobs")


RESPONSES_LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The Responses ``include`` entry that asks for each output text's token logprobs."""


def responses_logprobs_asked(data: Body) -> str | None:
    """The field of a Responses request that asks for logprobs (``top_logprobs`` or ``include``), if any.

    >>> asked = responses_logprobs_asked
    >>> asked({"top_logprobs": 0}), asked({"top_logprobs": 2}), asked({"include": [RESPONSES_LOGPROBS_INCLUDE]})
    (None, 'top_logprobs', 'include')
    """
    top = data.get("top_logprobs")
    if top is not None and top != 0:
        return "top_logprobs"
    include = data.get("include")
    if isinstance(include, list) and RESPONSES_LOGPROBS_INCLUDE in include:
        return "include"
    return None


def refuse_responses_logprobs(data: Body, profile: EngineProfile) -> None:
    """A Responses request for ``top_logprobs`` or ``include`` of output logprobs, for an engine without them."""
    if profile.logprobs:
        return
    param = responses_logprobs_asked(data)
    if param is not None:
        raise ClientInputError(_LOGPROBS_OFF.format(param=param), param=param)


Rule = Callable[[Body, EngineProfile], Body]

RULES: tuple[Rule, ...] = (
    refuse_multiple_choices,
    refuse_logprobs,
    refuse_unseen_media,
    refuse_custom_tools,
    move_tool_images,
    adapt_messages,
    fill_tool_parameters,
    narrow_allowed_tools,
    rename_max_completion_tokens,
    json_schema_as_json_object,
    map_call_ids_for_template,
)
"""Every rule, in the order they apply: refusals first, then rewrites."""


def adapt_chat_request(body: Body, profile: EngineProfile) -> tuple[Body, tuple[str, ...]]:
    """Apply every rule; return the body (the same object if nothing changed) and the rules that fired.

    >>> from proxy.engine.kinds import engine_profile
    >>> adapt_chat_request({"messages": [], "max_completion_tokens": 5}, engine_profile("llama-cpp-python"))
    ({'messages': [], 'max_tokens': 5}, ('rename_max_completion_tokens',))
    >>> body = {"messages": [{"role": "developer", "content": "x"}]}
    >>> adapt_chat_request(body, engine_profile("generic"))[0] is body
    True
    """
    if profile.kind is EngineKind.GENERIC:
        return body, ()  # a generic engine accepts every shape: no rule can fire
    fired: list[str] = []
    for rule in RULES:
        adapted = rule(body, profile)
        if adapted is not body:
            fired.append(rule.__name__)
            body = adapted
    return body, tuple(fired)
