"""The tuned ordering walks decide exactly as the plain reference does, on any input.

``proxy.order`` is written for speed (inline checks, shared reports); the
reference in ``tests/order_reference.py`` is the straightforward version. For
random lists in all three forms, damaged in every way the rules know (missing,
empty, non-string, duplicate and unknown IDs, short runs, non-dict messages and
blocks, odd types where strings belong), both must return the same list, the
same objects in it, and the same report.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import order
from tests import order_reference as reference

ID = st.one_of(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from(["", None, 1, 0, True, 2.5]),
    st.lists(st.just("a"), max_size=1),
    st.dictionaries(st.just("k"), st.just("v"), max_size=1),
)
STRING_IDS = st.sampled_from(["a", "b", "c", "d"])
ROLE = st.sampled_from(["assistant", "assistant", "tool", "tool", "user", "user", "system", None, 7, ["user"]])
NOISE = st.one_of(st.none(), st.integers(), st.text(max_size=2), st.lists(st.integers(), max_size=1))


def _ids(draw: st.DrawFn) -> list[Any]:
    clean = draw(st.booleans())
    return draw(st.lists(STRING_IDS if clean else ID, min_size=0, max_size=4, unique_by=repr if clean else None))


@st.composite
def chat_lists(draw: st.DrawFn) -> list[Any]:
    messages: list[Any] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["calls", "results", "other", "noise"]))
        if kind == "calls":
            calls = [draw(st.sampled_from([{"id": i}, {"id": i, "type": "function"}, i])) for i in _ids(draw)]
            messages.append({"role": draw(ROLE), "tool_calls": draw(st.sampled_from([calls, calls, None, "x"]))})
        elif kind == "results":
            for result_id in _ids(draw):
                message: dict[str, Any] = {"role": draw(st.sampled_from(["tool", "tool", "user"]))}
                if draw(st.integers(0, 9)):
                    message["tool_call_id"] = result_id
                messages.append(message)
        elif kind == "other":
            messages.append({"role": draw(ROLE), "content": "x"})
        else:
            messages.append(draw(NOISE))
    return messages


@st.composite
def anthropic_lists(draw: st.DrawFn) -> list[Any]:
    messages: list[Any] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["calls", "results", "other", "noise"]))
        if kind == "calls":
            blocks: list[Any] = [{"type": "tool_use", "id": i} for i in _ids(draw)]
            if draw(st.booleans()):
                blocks.insert(draw(st.integers(0, len(blocks))), draw(st.sampled_from([{"type": "text"}, "t", None])))
            content = draw(st.sampled_from([blocks, blocks, "text", None]))
            messages.append({"role": draw(ROLE), "content": content})
        elif kind == "results":
            results: list[Any] = [{"type": "tool_result", "tool_use_id": i} for i in _ids(draw)]
            if draw(st.booleans()):
                results.insert(draw(st.integers(0, len(results))), draw(st.sampled_from([{"type": "text"}, 3])))
            cut = draw(st.integers(0, len(results)))
            for part in (results[:cut], results[cut:]) if draw(st.booleans()) else (results,):
                messages.append({"role": draw(st.sampled_from(["user", "user", "assistant", "tool"])), "content": part})
        elif kind == "other":
            messages.append({"role": draw(ROLE), "content": draw(st.sampled_from(["x", [], [{"type": "text"}]]))})
        else:
            messages.append(draw(NOISE))
    return messages


CALL_TYPE = st.sampled_from(["function_call", "custom_tool_call"])
OUTPUT_TYPE = st.sampled_from(["function_call_output", "custom_tool_call_output"])
OTHER_TYPE = st.sampled_from(["message", "reasoning", None, 3, ["function_call"], {"a": 1}])


@st.composite
def responses_lists(draw: st.DrawFn) -> list[Any]:
    items: list[Any] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["calls", "outputs", "other", "noise"]))
        if kind in ("calls", "outputs"):
            for call_id in _ids(draw):
                item: dict[str, Any] = {"type": draw(CALL_TYPE if kind == "calls" else OUTPUT_TYPE)}
                if draw(st.integers(0, 9)):
                    item["call_id"] = call_id
                items.append(item)
        elif kind == "other":
            items.append({"type": draw(OTHER_TYPE)})
        else:
            items.append(draw(NOISE))
    return items


def _same(
    fast: tuple[list[Any], order.OrderReport], plain: tuple[list[Any], order.OrderReport], given: list[Any]
) -> None:
    fast_list, fast_report = fast
    plain_list, plain_report = plain
    assert (fast_list is given) == (plain_list is given)
    assert fast_list == plain_list
    given_ids = {id(item) for item in given}
    for mine, theirs in zip(fast_list, plain_list, strict=True):
        if id(theirs) in given_ids:
            assert mine is theirs  # whole objects move; only an edited Anthropic turn is a new one
    assert (fast_report.reordered, fast_report.in_order, fast_report.kept) == (
        plain_report.reordered,
        plain_report.in_order,
        plain_report.kept,
    )


@settings(max_examples=400)
@given(chat_lists())
def test_chat_walk_matches_the_reference(messages: list[Any]) -> None:
    _same(order.order_chat_results(messages), reference.order_chat_results(messages), messages)


@settings(max_examples=400)
@given(anthropic_lists())
def test_anthropic_walk_matches_the_reference(messages: list[Any]) -> None:
    _same(order.order_anthropic_results(messages), reference.order_anthropic_results(messages), messages)


@settings(max_examples=400)
@given(responses_lists())
def test_responses_walk_matches_the_reference(items: list[Any]) -> None:
    _same(order.order_responses_items(items), reference.order_responses_items(items), items)


@given(st.lists(ID, max_size=4), st.lists(ID, max_size=4))
def test_call_order_matches_the_reference(call_ids: list[Any], result_ids: list[Any]) -> None:
    assert order.call_order(call_ids, result_ids) == reference.call_order(call_ids, result_ids)
    assert order.call_order(tuple(call_ids), result_ids) == reference.call_order(tuple(call_ids), result_ids)


def test_shared_reports_are_only_the_ones_without_kept_runs() -> None:
    calls = {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "a"}]}
    _, kept = order.order_chat_results([calls, {"role": "tool", "tool_call_id": "a"}])
    _, again = order.order_chat_results([calls, {"role": "tool", "tool_call_id": "a"}])
    assert kept.kept == {"duplicate_id": 1} and kept is not again and kept.kept is not again.kept
    assert order.order_chat_results([])[1] is order.NO_RUNS
    assert order.NO_RUNS.merged(kept) is kept and kept.merged(order.NO_RUNS) is kept
