"""Tool-call IDs as a chat template demands them, for rendering only.

Mistral Nemo's and Mistral Small 3.2's templates render each call's ID and each
result's ``tool_call_id`` (so their models pair by ID), but refuse any ID that is
not nine characters: ``Tool call IDs should be alphanumeric strings with length
9!``. Claude Code's ``toolu_...`` and OpenAI's ``call_...`` IDs fail that check,
so every request with tool history failed on these models.

The fix maps each client ID to nine alphanumerics, the same for a call and its
result, in the body the engine renders and nowhere else: ordering has already
used the client's IDs, and replies carry the IDs toolpair or the model mints.
The mapping is a hash of the ID, so a conversation's history renders the same
prompt on every turn (the engine's prompt cache keeps matching) and needs no
state. Pure functions; :mod:`proxy.engine.adapt` applies them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from proxy._types import Message

__all__ = ["ANY", "CALL_ID_FORMS", "NINE_ALNUM", "fits_form", "rendered_ids", "template_call_id_form"]

ANY = "any"
NINE_ALNUM = "nine-alnum"
CALL_ID_FORMS = (ANY, NINE_ALNUM)
"""Values of the ``tool_call_ids`` setting: what the model's template accepts as a tool-call ID."""

_NINE_CHECK = re.compile(r"(?:tool_call\.id|tool_call_id'?\]?)\s*\|\s*length\s*!=\s*9")
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def template_call_id_form(template: str) -> str:
    """What a template accepts as a tool-call ID: :data:`NINE_ALNUM` where it checks for nine characters.

    >>> template_call_id_form("{%- if tool_call.id|length != 9 %}{{ raise_exception('bad id') }}{% endif %}")
    'nine-alnum'
    >>> template_call_id_form("{{ message.tool_call_id }}")
    'any'
    """
    return NINE_ALNUM if _NINE_CHECK.search(template) else ANY


def fits_form(call_id: str, form: str) -> bool:
    """Whether the template takes ``call_id`` as it is."""
    return form != NINE_ALNUM or (len(call_id) == 9 and call_id.isascii() and call_id.isalnum())


def _nine(call_id: str, salt: int) -> str:
    digest = int.from_bytes(hashlib.sha256(f"{salt}:{call_id}".encode()).digest()[:8], "big")
    chars = []
    for _ in range(9):
        digest, rest = divmod(digest, len(_ALNUM))
        chars.append(_ALNUM[rest])
    return "".join(chars)


def _id_map(messages: list[Any], form: str) -> dict[str, str]:
    """Each client ID the template would refuse -> the ID it renders; IDs that fit keep theirs."""
    seen: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                seen.append(call["id"])
        if isinstance(message.get("tool_call_id"), str):
            seen.append(message["tool_call_id"])
    taken = {i for i in seen if fits_form(i, form)}
    mapping: dict[str, str] = {}
    for call_id in seen:
        if call_id in mapping or call_id in taken:
            continue
        salt = 0
        while (mapped := _nine(call_id, salt)) in taken:  # distinct client IDs stay distinct
            salt += 1
        taken.add(mapped)
        mapping[call_id] = mapped
    return mapping


def rendered_ids(messages: list[Any], form: str) -> list[Any]:
    """``messages`` with every ID the template would refuse mapped, or ``messages`` itself when none is.

    A call and its result get the same mapped ID; the caller's objects are never changed.

    >>> sent = [{"role": "assistant", "tool_calls": [{"id": "toolu_1", "type": "function"}]},
    ...         {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"}]
    >>> out = rendered_ids(sent, NINE_ALNUM)
    >>> out[0]["tool_calls"][0]["id"] == out[1]["tool_call_id"] != "toolu_1", len(out[1]["tool_call_id"])
    (True, 9)
    >>> rendered_ids(sent, ANY) is sent
    True
    """
    if form == ANY:
        return messages
    mapping = _id_map(messages, form)
    if not mapping:
        return messages
    return [_mapped(m, mapping) for m in messages]


def _mapped(message: Any, mapping: dict[str, str]) -> Any:
    if not isinstance(message, dict):
        return message
    changed: Message | None = None
    calls = message.get("tool_calls")
    if isinstance(calls, list) and any(isinstance(c, dict) and c.get("id") in mapping for c in calls):
        changed = {**message, "tool_calls": [_mapped_call(c, mapping) for c in calls]}
    result_id = message.get("tool_call_id")
    if isinstance(result_id, str) and result_id in mapping:
        changed = {**(changed or message), "tool_call_id": mapping[result_id]}
    return message if changed is None else changed


def _mapped_call(call: Any, mapping: dict[str, str]) -> Any:
    if isinstance(call, dict) and isinstance(call.get("id"), str) and call["id"] in mapping:
        return {**call, "id": mapping[call["id"]]}
    return call
