"""Ordering in Anthropic and Responses form, with the same matching rules as chat."""

from __future__ import annotations

import copy
from typing import Any

from proxy.order import order_anthropic_results, order_responses_items


def tool_use(*ids: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": "checking"}]
        + [{"type": "tool_use", "id": i, "name": "Grep", "input": {"pattern": i}} for i in ids],
    }


def result(i: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": f"r-{i}", **extra}


def test_anthropic_reversed_results_with_text_staying_in_place() -> None:
    user = {"role": "user", "content": [result("b"), result("a", is_error=True), {"type": "text", "text": "go on"}]}
    messages = [{"role": "user", "content": "hi"}, tool_use("a", "b"), user]
    snapshot = copy.deepcopy(messages)
    out, report = order_anthropic_results(messages)
    assert [b.get("tool_use_id") for b in out[2]["content"]] == ["a", "b", None]
    assert out[2]["content"][0] is user["content"][1]
    assert report.reordered == 1
    assert messages == snapshot


def test_anthropic_results_split_across_two_user_messages_are_one_run() -> None:
    first = {"role": "user", "content": [result("c")]}
    second = {"role": "user", "content": [{"type": "text", "text": "x"}, result("b"), result("a")]}
    out, report = order_anthropic_results([tool_use("a", "b", "c"), first, second])
    assert [b["tool_use_id"] for b in out[1]["content"]] == ["a"]
    assert [b.get("tool_use_id") for b in out[2]["content"]] == [None, "b", "c"]
    assert report.reordered == 1


def test_anthropic_system_message_between_results_ends_the_run() -> None:
    messages = [
        tool_use("a", "b"),
        {"role": "user", "content": [result("b")]},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": [result("a")]},
    ]
    out, report = order_anthropic_results(messages)
    assert out is messages and report.kept == {"incomplete_run": 1}


def test_anthropic_ordered_and_ambiguous_return_same_object() -> None:
    ordered = [tool_use("a", "b"), {"role": "user", "content": [result("a"), result("b")]}]
    assert order_anthropic_results(ordered)[0] is ordered
    dup = [tool_use("a", "b"), {"role": "user", "content": [result("b"), result("b")]}]
    out, report = order_anthropic_results(dup)
    assert out is dup and report.kept == {"duplicate_id": 1}
    string_content = [tool_use("a"), {"role": "user", "content": "plain"}]
    assert order_anthropic_results(string_content)[0] is string_content


def fc(i: Any, name: str = "shell") -> dict[str, Any]:
    return {"type": "function_call", "call_id": i, "name": name, "arguments": "{}", "id": f"fc_{i}"}


def out_item(i: Any, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": i, "output": f"o-{i}", "id": f"fco_{i}"}


def test_responses_reversed_outputs_are_put_in_call_order() -> None:
    items = [{"role": "user", "content": "hi"}, fc("a"), fc("b"), out_item("b"), out_item("a")]
    snapshot = copy.deepcopy(items)
    out, report = order_responses_items(items)
    assert [i.get("call_id") for i in out] == [None, "a", "b", "a", "b"]
    assert report.reordered == 1 and items == snapshot


def test_responses_custom_tool_calls_share_the_run() -> None:
    items = [
        fc("a"),
        {"type": "custom_tool_call", "call_id": "b", "name": "apply_patch", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "b", "output": "done"},
        out_item("a"),
    ]
    out, _report = order_responses_items(items)
    assert [i["call_id"] for i in out[2:]] == ["a", "b"]


def test_responses_other_items_never_move() -> None:
    items = [fc("a"), fc("b"), out_item("b"), {"type": "message", "role": "user", "content": "x"}, out_item("a")]
    out, report = order_responses_items(items)
    assert out is items and report.kept == {"incomplete_run": 1}
