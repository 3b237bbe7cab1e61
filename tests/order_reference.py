"""The ordering rules written plainly: the reference the tuned ``proxy.order`` is tested against.

This is how ``proxy/order.py`` decided before its walks were tuned for datasets
of short records (a tally object, helper calls, one report per call). It shares
only the vocabulary (``KeptReason``, ``OrderReport``) with the tuned module, so
``tests/test_order_reference.py`` can check that both decide the same on any
input. Change the rules here and there together, or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from proxy._types import Messages
from proxy.order import KeptReason, OrderReport


class _Tally:
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
    problem = _check_ids(call_ids)
    if problem is not None:
        return problem
    if list(result_ids) == list(call_ids):
        return None
    problem = _check_ids(result_ids)
    if problem is not None:
        return problem
    position = {call_id: index for index, call_id in enumerate(call_ids)}
    slots = [position.get(result_id) for result_id in result_ids]  # type: ignore[call-overload]
    if None in slots:
        return KeptReason.UNKNOWN_ID
    if len(result_ids) != len(call_ids):
        return KeptReason.INCOMPLETE_RUN
    return [slots.index(call) for call in range(len(call_ids))]


def _get(item: object, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else None


def _assistant_turns(messages: Messages) -> Iterator[tuple[int, Any]]:
    """Each assistant message and the index just after it, where a run of its results would start."""
    for index, message in enumerate(messages):
        if _get(message, "role") == "assistant":
            yield index + 1, message


def order_chat_results(messages: Messages) -> tuple[Messages, OrderReport]:
    tally = _Tally()
    result: Messages | None = None
    for start, message in _assistant_turns(messages):
        calls = _get(message, "tool_calls")
        if not isinstance(calls, list) or not calls:
            continue
        index = start
        while index < len(messages) and _get(messages[index], "role") == "tool":
            index += 1
        if start == index:
            continue
        run = messages[start:index]
        outcome = call_order([_get(call, "id") for call in calls], [_get(m, "tool_call_id") for m in run])
        tally.count(outcome)
        if isinstance(outcome, list):
            result = list(messages) if result is None else result
            result[start:index] = [run[i] for i in outcome]
    return (messages if result is None else result), tally.report()


def order_anthropic_results(messages: Messages) -> tuple[Messages, OrderReport]:
    tally = _Tally()
    result: Messages | None = None
    for index, message in _assistant_turns(messages):
        content = _get(message, "content")
        if not isinstance(content, list):
            continue
        call_ids = [_get(block, "id") for block in content if _get(block, "type") == "tool_use"]
        if not call_ids:
            continue
        slots: list[tuple[int, int]] = []
        while index < len(messages) and _get(messages[index], "role") == "user":
            reply = _get(messages[index], "content")
            if isinstance(reply, list):
                slots.extend((index, b) for b, block in enumerate(reply) if _get(block, "type") == "tool_result")
            index += 1
        if not slots:
            continue
        blocks = [messages[m]["content"][b] for m, b in slots]
        outcome = call_order(call_ids, [_get(block, "tool_use_id") for block in blocks])
        tally.count(outcome)
        if not isinstance(outcome, list):
            continue
        result = list(messages) if result is None else result
        fresh: dict[int, list[Any]] = {}
        for (m, b), source in zip(slots, outcome, strict=False):
            fresh.setdefault(m, list(messages[m]["content"]))[b] = blocks[source]
        for m, content in fresh.items():
            result[m] = {**messages[m], "content": content}
    return (messages if result is None else result), tally.report()


def _item_type(item: object) -> str | None:
    kind = _get(item, "type")
    return kind if isinstance(kind, str) else None


def order_responses_items(items: Messages) -> tuple[Messages, OrderReport]:
    calls_kinds = {"function_call", "custom_tool_call"}
    output_kinds = {"function_call_output", "custom_tool_call_output"}
    tally = _Tally()
    result: Messages | None = None
    index = 0
    while index < len(items):
        if _item_type(items[index]) not in calls_kinds:
            index += 1
            continue
        calls_start = index
        while index < len(items) and _item_type(items[index]) in calls_kinds:
            index += 1
        run_start = index
        while index < len(items) and _item_type(items[index]) in output_kinds:
            index += 1
        if run_start == index:
            continue
        run = items[run_start:index]
        outcome = call_order(
            [_get(item, "call_id") for item in items[calls_start:run_start]], [_get(item, "call_id") for item in run]
        )
        tally.count(outcome)
        if isinstance(outcome, list):
            result = list(items) if result is None else result
            result[run_start:index] = [run[i] for i in outcome]
    return (items if result is None else result), tally.report()
