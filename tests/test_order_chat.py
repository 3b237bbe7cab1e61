"""The Chat Completions ordering rules, without a network."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.order import KeptReason, call_order, order_chat_results


def assistant(*ids: Any, name: str = "get_weather") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": name, "arguments": f'{{"n": {n}}}'}}
            for n, i in enumerate(ids)
        ],
    }


def tool(call_id: Any, content: Any = None, **extra: Any) -> dict[str, Any]:
    message = {"role": "tool", "tool_call_id": call_id, "content": content if content is not None else f"r-{call_id}"}
    message.update(extra)
    return message


def ids(messages: list[Any]) -> list[Any]:
    return [m.get("tool_call_id") for m in messages if m.get("role") == "tool"]


USER = {"role": "user", "content": "weather in Paris and Oslo?"}


def test_reversed_pair_of_same_function_is_put_in_call_order() -> None:
    messages = [USER, assistant("call_a", "call_b"), tool("call_b"), tool("call_a")]
    out, report = order_chat_results(messages)
    assert ids(out) == ["call_a", "call_b"]
    assert out[2] is messages[3] and out[3] is messages[2]
    assert (report.reordered, report.in_order, report.kept) == (1, 0, {})


@pytest.mark.parametrize("received", list(itertools.permutations(["a", "b", "c"])))
def test_three_calls_in_every_permutation(received: tuple[str, ...]) -> None:
    messages = [USER, assistant("a", "b", "c"), *(tool(i) for i in received)]
    out, report = order_chat_results(messages)
    assert ids(out) == ["a", "b", "c"]
    in_order = received == ("a", "b", "c")
    assert report.reordered == (0 if in_order else 1)
    assert report.in_order == (1 if in_order else 0)
    assert (out is messages) == in_order


def test_already_ordered_returns_the_same_object() -> None:
    messages = [USER, assistant("a", "b"), tool("a"), tool("b")]
    out, report = order_chat_results(messages)
    assert out is messages
    assert report.in_order == 1 and report.reordered == 0


def test_single_call() -> None:
    messages = [USER, assistant("a"), tool("a")]
    out, report = order_chat_results(messages)
    assert out is messages and report.in_order == 1


def test_legacy_function_role_without_ids_is_left_alone() -> None:
    messages = [
        USER,
        {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "function", "name": "f", "content": "x"},
    ]
    out, report = order_chat_results(messages)
    assert out is messages and report.runs == 0


@pytest.mark.parametrize(
    ("calls", "results", "reason"),
    [
        (["a", None], ["b", "a"], KeptReason.MISSING_ID),
        (["a", "b"], ["b", None], KeptReason.MISSING_ID),
        (["a", "b"], ["b", ""], KeptReason.MISSING_ID),
        (["a", ""], ["b", "a"], KeptReason.MISSING_ID),
        (["a", "a"], ["a", "a"], KeptReason.DUPLICATE_ID),
        (["a", "b"], ["b", "b"], KeptReason.DUPLICATE_ID),
        (["a", "b"], ["b", "x"], KeptReason.UNKNOWN_ID),
        (["a", "b"], ["b", 7], KeptReason.NON_STRING_ID),
        ([1, 2], [2, 1], KeptReason.NON_STRING_ID),
        (["a", "b"], ["b", {"id": "a"}], KeptReason.NON_STRING_ID),
        (["a", "b"], ["b", True], KeptReason.NON_STRING_ID),
        (["a", "b", "c"], ["c", "a"], KeptReason.INCOMPLETE_RUN),
        (["a", "b"], ["b", "a", "c"], KeptReason.UNKNOWN_ID),
    ],
)
def test_ambiguous_runs_keep_received_order(calls: list[Any], results: list[Any], reason: KeptReason) -> None:
    messages = [USER, assistant(*calls), *(tool(r) for r in results)]
    out, report = order_chat_results(messages)
    assert out is messages
    assert report.kept == {reason.value: 1}
    assert report.reordered == 0


def test_missing_tool_call_id_key_and_non_dict_call() -> None:
    messages = [
        USER,
        {"role": "assistant", "tool_calls": ["not-a-dict", {"id": "b"}]},
        {"role": "tool", "content": "x"},
        tool("b"),
    ]
    out, report = order_chat_results(messages)
    assert out is messages and report.kept == {"missing_id": 1}


def test_over_complete_run_with_duplicate_result() -> None:
    messages = [USER, assistant("a", "b"), tool("b"), tool("a"), tool("a")]
    out, report = order_chat_results(messages)
    assert out is messages and report.kept == {"duplicate_id": 1}


def test_two_rounds_are_ordered_separately() -> None:
    messages = [
        USER,
        assistant("a", "b"),
        tool("b"),
        tool("a"),
        {"role": "assistant", "content": "thinking more"},
        assistant("c", "d"),
        tool("d"),
        tool("c"),
    ]
    out, report = order_chat_results(messages)
    assert ids(out) == ["a", "b", "c", "d"]
    assert report.reordered == 2


def test_round_ids_do_not_leak_across_rounds() -> None:
    # Results of round 1 answering ids of round 2 are unknown in round 1.
    messages = [USER, assistant("a", "b"), tool("c"), tool("d"), assistant("c", "d"), tool("d"), tool("c")]
    out, report = order_chat_results(messages)
    assert ids(out) == ["c", "d", "c", "d"]
    assert report.kept == {"unknown_id": 1} and report.reordered == 1


@pytest.mark.parametrize("between", [{"role": "user", "content": "hi"}, {"role": "system", "content": "note"}])
def test_results_never_move_across_another_message(between: dict[str, Any]) -> None:
    messages = [USER, assistant("a", "b"), tool("b"), between, tool("a")]
    out, report = order_chat_results(messages)
    assert out is messages
    # The run is just [b]: one result for two calls.
    assert report.kept == {"incomplete_run": 1}


def test_image_bearing_results_and_extra_keys_move_whole() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    slow = tool("a", [{"type": "text", "text": "map of A"}, image], name="render", x_meta={"ms": 900})
    fast = tool("b", "plain text", name="render")
    messages = [USER, assistant("a", "b", name="render"), fast, slow]
    out, _ = order_chat_results(messages)
    assert out[2] is slow and out[3] is fast
    assert out[2]["content"][1] is image and out[2]["x_meta"] == {"ms": 900}


def test_input_is_never_mutated() -> None:
    messages = [USER, assistant("a", "b", "c"), tool("c"), tool("a"), tool("b")]
    snapshot = copy.deepcopy(messages)
    out, _ = order_chat_results(messages)
    assert messages == snapshot
    assert out is not messages


def test_assistant_with_calls_but_no_results_is_not_a_run() -> None:
    messages = [USER, assistant("a", "b")]
    out, report = order_chat_results(messages)
    assert out is messages and report.runs == 0


def test_tool_messages_after_a_non_calling_turn_are_not_a_run() -> None:
    messages = [USER, {"role": "assistant", "content": "hi", "tool_calls": []}, tool("b"), tool("a")]
    out, report = order_chat_results(messages)
    assert out is messages and report.runs == 0


def test_non_dict_messages_are_tolerated() -> None:
    messages: list[Any] = [None, 3, "x", assistant("a", "b"), tool("b"), tool("a"), []]
    out, report = order_chat_results(messages)
    assert ids([m for m in out if isinstance(m, dict)]) == ["a", "b"]
    assert report.reordered == 1


def test_call_order_doctest_cases() -> None:
    assert call_order([], []) is None
    assert call_order(["a"], []) == KeptReason.INCOMPLETE_RUN


# --- properties -----------------------------------------------------------

ID = st.text(alphabet="abcdef", min_size=1, max_size=3)


@st.composite
def conversations(draw: st.DrawFn) -> list[Any]:
    """Rounds of calls followed by results in any order, sometimes damaged, with noise between."""
    messages: list[Any] = [USER]
    for _ in range(draw(st.integers(0, 4))):
        call_ids = draw(st.lists(ID, min_size=1, max_size=5, unique=True))
        messages.append(assistant(*call_ids))
        results = draw(st.permutations(call_ids))
        if draw(st.booleans()):
            results = draw(st.lists(st.one_of(ID, st.none(), st.integers()), max_size=6))
        messages.extend(tool(r) for r in results)
        if draw(st.booleans()):
            messages.append({"role": "user", "content": "next"})
    return messages


@given(conversations())
def test_property_output_is_a_permutation_inside_each_run(messages: list[Any]) -> None:
    out, _ = order_chat_results(messages)
    assert len(out) == len(messages)
    # Non-tool messages stay exactly where they were.
    for before, after in zip(messages, out, strict=False):
        if before.get("role") != "tool":
            assert after is before
        else:
            assert after.get("role") == "tool"

    # Each run holds the same objects.
    def runs(seq: list[Any]) -> list[list[int]]:
        found: list[list[int]] = []
        for m in seq:
            if m.get("role") == "tool":
                if found and found[-1] is not None:
                    found[-1].append(id(m))
            else:
                found.append([])
        return found

    assert [sorted(r) for r in runs(out)] == [sorted(r) for r in runs(messages)]


@given(conversations())
def test_property_idempotent(messages: list[Any]) -> None:
    once, _ = order_chat_results(messages)
    twice, report = order_chat_results(once)
    assert twice is once
    assert report.reordered == 0


@given(st.lists(ID, min_size=1, max_size=6, unique=True))
def test_property_ordered_input_comes_back_as_the_same_object(call_ids: list[str]) -> None:
    messages = [USER, assistant(*call_ids), *(tool(i) for i in call_ids)]
    out, report = order_chat_results(messages)
    assert out is messages and report.in_order == 1
