"""The ordering rules as first written: the plain reference the fast ``proxy.order`` is tested against.

This is ``proxy/order.py`` before it was tuned for datasets of short records,
kept verbatim (rules, reports, kept reasons) so that property tests can check
the tuned code decides exactly as this did on any input.

Original summary: put each complete run of tool results back into call order.

One rule, three wire forms:

- Chat Completions: an assistant message with ``tool_calls`` is followed by
  ``role: "tool"`` messages matched by ``tool_call_id``.
- Anthropic Messages: an assistant message with ``tool_use`` blocks is followed
  by user messages whose ``tool_result`` blocks match by ``tool_use_id``.
- Responses: a group of consecutive ``function_call`` / ``custom_tool_call``
  items is followed by ``*_output`` items matched by ``call_id``.

A run is reordered only when the call IDs and the result IDs are unique,
nonempty strings and name the same set. Anything else keeps the received order
and is reported with a reason. Whole result objects move; nothing is mutated,
and when nothing moves the very same list object comes back, so the caller can
forward the client's bytes unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from proxy._types import Messages

__all__ = [
    "KeptReason",
    "OrderReport",
    "call_order",
    "order_anthropic_results",
    "order_chat_results",
    "order_responses_items",
]


class KeptReason(StrEnum):
    """Why a run of results kept its received order."""

    MISSING_ID = "missing_id"  # a call or result has no ID, null, or ""
    NON_STRING_ID = "non_string_id"  # an ID is a number, object, list or bool
    DUPLICATE_ID = "duplicate_id"  # two calls, or two results, share an ID
    UNKNOWN_ID = "unknown_id"  # a result names no call of this turn
    INCOMPLETE_RUN = "incomplete_run"  # fewer results than calls


@dataclass(frozen=True)
class OrderReport:
    """What ordering did to one request.

    ``reordered`` counts runs that moved, ``in_order`` runs that already were in
    call order, and ``kept`` runs left in received order, by reason.
    """

    reordered: int = 0
    in_order: int = 0
    kept: dict[str, int] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return self.reordered + self.in_order + sum(self.kept.values())

    def merged(self, other: OrderReport) -> OrderReport:
        kept = dict(self.kept)
        for reason, count in other.kept.items():
            kept[reason] = kept.get(reason, 0) + count
        return OrderReport(self.reordered + other.reordered, self.in_order + other.in_order, kept)


class _Tally:
    """Mutable counter used while walking one list; frozen into an OrderReport."""

    __slots__ = ("in_order", "kept", "reordered")

    def __init__(self) -> None:
        self.reordered = 0
        self.in_order = 0
        self.kept: dict[str, int] = {}

    def count(self, outcome: list[int] | KeptReason | None) -> None:
        if isinstance(outcome, KeptReason):
            self.kept[outcome.value] = self.kept.get(outcome.value, 0) + 1
        elif outcome is None:
            self.in_order += 1
        else:
            self.reordered += 1

    def report(self) -> OrderReport:
        return OrderReport(self.reordered, self.in_order, self.kept)


def _check_ids(ids: Sequence[object]) -> KeptReason | None:
    # Fast path for the common case: every ID a nonempty string, none repeated.
    if all(type(value) is str and value for value in ids) and len(set(ids)) == len(ids):
        return None
    seen: set[str] = set()
    for value in ids:
        if value is None or value == "":
            return KeptReason.MISSING_ID
        if not isinstance(value, str):
            return KeptReason.NON_STRING_ID
        if value in seen:
            return KeptReason.DUPLICATE_ID
        seen.add(value)
    return None


def call_order(call_ids: Sequence[object], result_ids: Sequence[object]) -> list[int] | KeptReason | None:
    """Decide how a run of results should be permuted into call order.

    Returns the result indices in call order when the run must move, ``None``
    when it already is in call order, or the reason it must keep its order.

    >>> call_order(["a", "b"], ["b", "a"])
    [1, 0]
    >>> call_order(["a", "b"], ["a", "b"]) is None
    True
    >>> call_order(["a", "b"], ["a"])
    <KeptReason.INCOMPLETE_RUN: 'incomplete_run'>
    """
    problem = _check_ids(call_ids)
    if problem is not None:
        return problem
    if list(result_ids) == list(call_ids):
        return None
    problem = _check_ids(result_ids)
    if problem is not None:
        return problem
    position = {call_id: index for index, call_id in enumerate(call_ids)}
    slots = [position.get(result_id) for result_id in result_ids]
    if None in slots:
        return KeptReason.UNKNOWN_ID
    if len(result_ids) != len(call_ids):
        return KeptReason.INCOMPLETE_RUN
    # IDs are unique and the sets are equal, so ``slots`` is a permutation: invert it.
    by_call = [0] * len(slots)
    for index, slot in enumerate(slots):
        by_call[slot] = index  # type: ignore[index]
    return by_call


def _get(item: object, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else None


# --- Chat Completions -------------------------------------------------------


def order_chat_results(messages: Messages) -> tuple[Messages, OrderReport]:
    """Restore call order of each run of ``tool`` messages in a Chat Completions list.

    >>> calls = {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}
    >>> out, report = order_chat_results([calls, {"role": "tool", "tool_call_id": "b"},
    ...                                   {"role": "tool", "tool_call_id": "a"}])
    >>> [m.get("tool_call_id") for m in out], report.reordered
    ([None, 'a', 'b'], 1)
    """
    tally = _Tally()
    result: Messages | None = None
    index = 0
    count = len(messages)
    # Written with inline dict checks: this loop runs on every chat request with results.
    while index < count:
        message = messages[index]
        index += 1
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            continue
        start = index
        while index < count:
            candidate = messages[index]
            if not isinstance(candidate, dict) or candidate.get("role") != "tool":
                break
            index += 1
        if start == index:
            continue
        run = messages[start:index]
        outcome = call_order(
            [call.get("id") if isinstance(call, dict) else None for call in calls],
            [m.get("tool_call_id") for m in run],
        )
        tally.count(outcome)
        if isinstance(outcome, list):
            if result is None:
                result = list(messages)
            result[start:index] = [run[i] for i in outcome]
    return (messages if result is None else result), tally.report()


# --- Anthropic Messages -----------------------------------------------------


def _tool_use_ids(message: object) -> list[object] | None:
    content = _get(message, "content")
    if _get(message, "role") != "assistant" or not isinstance(content, list):
        return None
    ids = [_get(block, "id") for block in content if _get(block, "type") == "tool_use"]
    return ids or None


def order_anthropic_results(messages: Messages) -> tuple[Messages, OrderReport]:
    """Restore call order of ``tool_result`` blocks after each ``tool_use`` turn.

    The run is every ``tool_result`` block in the user messages right after the
    assistant turn, even when split across several user messages. Those slots
    are permuted into call order; every other block stays where it is.

    >>> turn = {"role": "assistant", "content": [{"type": "tool_use", "id": "a"},
    ...                                          {"type": "tool_use", "id": "b"}]}
    >>> user = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b"},
    ...                                     {"type": "tool_result", "tool_use_id": "a"}]}
    >>> out, _ = order_anthropic_results([turn, user])
    >>> [b["tool_use_id"] for b in out[1]["content"]]
    ['a', 'b']
    """
    tally = _Tally()
    result: Messages | None = None
    index = 0
    count = len(messages)
    while index < count:
        call_ids = _tool_use_ids(messages[index])
        index += 1
        if call_ids is None:
            continue
        slots: list[tuple[int, int]] = []
        while index < count and _get(messages[index], "role") == "user":
            content = _get(messages[index], "content")
            if isinstance(content, list):
                slots.extend(
                    (index, position) for position, block in enumerate(content) if _get(block, "type") == "tool_result"
                )
            index += 1
        if not slots:
            continue
        blocks = [messages[m]["content"][b] for m, b in slots]
        outcome = call_order(call_ids, [_get(block, "tool_use_id") for block in blocks])
        tally.count(outcome)
        if not isinstance(outcome, list):
            continue
        if result is None:
            result = list(messages)
        fresh: dict[int, list[Any]] = {}
        for (m, b), source in zip(slots, outcome, strict=False):
            if m not in fresh:
                fresh[m] = list(messages[m]["content"])
            fresh[m][b] = blocks[source]
        for m, content in fresh.items():
            result[m] = {**messages[m], "content": content}
    return (messages if result is None else result), tally.report()


# --- Responses --------------------------------------------------------------

_CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


def _item_type(item: object) -> str | None:
    """An item's ``type`` when it is a string (a list or object there must not break the set lookups)."""
    kind = _get(item, "type")
    return kind if isinstance(kind, str) else None


def order_responses_items(items: Messages) -> tuple[Messages, OrderReport]:
    """Restore call order of ``*_output`` items after each group of calls in ``input``.

    >>> items = [{"type": "function_call", "call_id": "a"}, {"type": "function_call", "call_id": "b"},
    ...          {"type": "function_call_output", "call_id": "b"},
    ...          {"type": "function_call_output", "call_id": "a"}]
    >>> [i["call_id"] for i in order_responses_items(items)[0][2:]]
    ['a', 'b']
    """
    tally = _Tally()
    result: Messages | None = None
    index = 0
    count = len(items)
    while index < count:
        if _item_type(items[index]) not in _CALL_TYPES:
            index += 1
            continue
        calls_start = index
        while index < count and _item_type(items[index]) in _CALL_TYPES:
            index += 1
        run_start = index
        while index < count and _item_type(items[index]) in _OUTPUT_TYPES:
            index += 1
        if run_start == index:
            continue
        run = items[run_start:index]
        outcome = call_order(
            [_get(item, "call_id") for item in items[calls_start:run_start]],
            [_get(item, "call_id") for item in run],
        )
        tally.count(outcome)
        if isinstance(outcome, list):
            if result is None:
                result = list(items)
            result[run_start:index] = [run[i] for i in outcome]
    return (items if result is None else result), tally.report()
