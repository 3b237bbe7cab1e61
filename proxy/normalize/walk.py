"""The ordering rules on a freshly parsed record, for runs that are clean: the dataset's fast walk.

``proxy.order`` decides every run, however damaged, and says why it keeps one;
on a dataset of short records its walk costs more than parsing the line. Here
the same rules are written for what a JSON parser hands back (only ``dict``,
``list``, ``str``, numbers, ``bool`` and ``None``, so exact type checks stand
for ``isinstance``) and for the run nearly every record holds: as many results
as calls, every call ID a nonempty string, none repeated, the result IDs the
same set. Such a run is either in call order or is permuted into it, exactly
as ``proxy.order`` would.

Anything else (a result without an ID, a repeated or non-string ID, a short
run, an unknown ID) makes these walks give up with ``None``: the caller then
runs ``proxy.order`` on the record, which decides it and names the reason. So
they never decide differently from it; ``tests/test_normalize_walk.py`` checks
that on random damaged records of all three forms.

Each walk returns ``(items, reordered, in_order)``: the list itself when nothing
moved, else a new list holding the very same result objects (an Anthropic user
turn whose blocks moved is a new dict with a new ``content`` list, as there).
"""

from __future__ import annotations

from typing import Any

__all__ = ["clean_anthropic_runs", "clean_chat_runs", "clean_responses_runs"]

Walked = tuple[list[Any], int, int] | None

_CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


def _permutation(call_ids: list[Any], result_ids: list[Any], results: list[Any]) -> list[Any] | None:
    """``results`` in call order, or None unless the call IDs are clean and the result IDs the same set.

    The caller has already seen that both lists are as long.
    """
    for call_id in call_ids:
        if type(call_id) is not str or not call_id:
            return None
    try:
        if len(set(call_ids)) != len(call_ids):
            return None
        by_id = dict(zip(result_ids, results, strict=True))
        if len(by_id) != len(results):
            return None
        return [by_id[call_id] for call_id in call_ids]
    except (TypeError, KeyError):  # an unhashable result ID, or one that names no call
        return None


def _in_order(call_ids: list[Any], result_ids: list[Any]) -> bool:
    """Whether the run is already in call order with clean IDs (``result_ids == call_ids`` is known)."""
    count = len(call_ids)
    if count == 1:
        first = call_ids[0]
        return type(first) is str and first != ""
    if count == 2:
        first, second = call_ids
        return type(first) is str and type(second) is str and first != "" and second != "" and first != second
    for call_id in call_ids:
        if type(call_id) is not str or not call_id:
            return False
    return len(set(call_ids)) == count


def clean_chat_runs(messages: list[Any]) -> Walked:
    """Chat Completions: ``role: "tool"`` messages after an assistant turn with ``tool_calls``."""
    result: list[Any] | None = None
    reordered = in_order = 0
    index = 0
    count = len(messages)
    while index < count:
        message = messages[index]
        index += 1
        if type(message) is not dict or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if type(calls) is not list or not calls:
            continue
        start = index
        while index < count:
            candidate = messages[index]
            if type(candidate) is not dict or candidate.get("role") != "tool":
                break
            index += 1
        if start == index:
            continue
        if index - start != len(calls):
            return None
        try:
            call_ids = [call["id"] for call in calls]
            result_ids = [reply["tool_call_id"] for reply in messages[start:index]]
        except (TypeError, KeyError):  # a call that is not an object, an ID missing
            return None
        if result_ids == call_ids:
            if not _in_order(call_ids, result_ids):
                return None
            in_order += 1
            continue
        fresh = _permutation(call_ids, result_ids, messages[start:index])
        if fresh is None:
            return None
        if result is None:
            result = list(messages)
        result[start:index] = fresh
        reordered += 1
    return (messages if result is None else result), reordered, in_order


def clean_anthropic_runs(messages: list[Any]) -> Walked:
    """Anthropic: ``tool_result`` blocks in the user turns after an assistant turn with ``tool_use`` blocks."""
    result: list[Any] | None = None
    reordered = in_order = 0
    index = 0
    count = len(messages)
    while index < count:
        message = messages[index]
        index += 1
        if type(message) is not dict or message.get("role") != "assistant":
            continue
        turn = message.get("content")
        if type(turn) is not list:
            continue
        call_ids = [block.get("id") for block in turn if type(block) is dict and block.get("type") == "tool_use"]
        if not call_ids:
            continue
        slots: list[tuple[int, int]] = []
        while index < count:
            reply = messages[index]
            if type(reply) is not dict or reply.get("role") != "user":
                break
            content = reply.get("content")
            if type(content) is list:
                for position, block in enumerate(content):
                    if type(block) is dict and block.get("type") == "tool_result":
                        slots.append((index, position))
            index += 1
        if not slots:
            continue
        if len(slots) != len(call_ids):
            return None
        blocks = [messages[m]["content"][b] for m, b in slots]
        try:
            result_ids = [block["tool_use_id"] for block in blocks]
        except KeyError:
            return None
        if result_ids == call_ids:
            if not _in_order(call_ids, result_ids):
                return None
            in_order += 1
            continue
        moved = _permutation(call_ids, result_ids, blocks)
        if moved is None:
            return None
        if result is None:
            result = list(messages)
        fresh: dict[int, list[Any]] = {}
        for (m, b), block in zip(slots, moved, strict=True):
            if m not in fresh:
                fresh[m] = list(messages[m]["content"])
            fresh[m][b] = block
        for m, content in fresh.items():
            result[m] = {**messages[m], "content": content}
        reordered += 1
    return (messages if result is None else result), reordered, in_order


def clean_responses_runs(items: list[Any]) -> Walked:
    """Responses: ``*_output`` items after a group of ``function_call`` / ``custom_tool_call`` items."""
    result: list[Any] | None = None
    reordered = in_order = 0
    kinds: list[Any] = [item.get("type") if type(item) is dict else None for item in items]
    index = 0
    count = len(items)
    while index < count:
        kind = kinds[index]
        if type(kind) is not str or kind not in _CALL_TYPES:
            index += 1
            continue
        calls_start = index
        while index < count and type(kinds[index]) is str and kinds[index] in _CALL_TYPES:
            index += 1
        run_start = index
        while index < count and type(kinds[index]) is str and kinds[index] in _OUTPUT_TYPES:
            index += 1
        if run_start == index:
            continue
        if index - run_start != run_start - calls_start:
            return None
        try:
            call_ids = [call["call_id"] for call in items[calls_start:run_start]]
            result_ids = [output["call_id"] for output in items[run_start:index]]
        except KeyError:
            return None
        if result_ids == call_ids:
            if not _in_order(call_ids, result_ids):
                return None
            in_order += 1
            continue
        fresh = _permutation(call_ids, result_ids, items[run_start:index])
        if fresh is None:
            return None
        if result is None:
            result = list(items)
        result[run_start:index] = fresh
        reordered += 1
    return (items if result is None else result), reordered, in_order
