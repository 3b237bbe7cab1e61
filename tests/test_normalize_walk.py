"""The dataset's fast walk (``proxy/normalize/walk.py``) decides exactly as ``proxy.order``, or gives up.

``order_parsed`` answers only for records whose runs are clean; for those it
must return what ``order_record`` returns (the same list when nothing moved,
the very same result objects when something did, the same counts, no kept
runs), and a block normalized through it must equal the lines normalized one
by one through ``order_record``. The damaged lists come from the generators
that pin ``proxy.order`` to its plain reference, written out as JSON and read
back, as a dataset line would be.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.normalize import block_edits, may_hold_results, normalize_line, order_record
from proxy.normalize.core import order_parsed, quick_marked_line
from tests.dataset_records import FORMS, arrived_in_any_order, sharegpt
from tests.test_order_reference import anthropic_lists, chat_lists, responses_lists

CALLS = [("call_a", "A"), ("call_b", "B"), ("call_c", "C"), ("call_d", "D")]


def _parsed(record: Any) -> Any:
    return json.loads(json.dumps(record))  # exact integers of any width, as the exact path reads them


def _same_as_order_record(record: Any, **flags: bool) -> bool:
    """Check ``order_parsed`` against ``order_record`` on one parsed record; whether it answered."""
    walked = order_parsed(record, **flags)
    ordered, report = order_record(record, **flags)
    if walked is None:
        return False
    fast, reordered, in_order = walked
    assert (reordered, in_order, {}) == (report.reordered, report.in_order, report.kept)
    assert (fast is record) == (ordered is record)
    assert fast == ordered
    if fast is not record:
        for name in ("messages", "input"):
            mine, theirs = fast.get(name), ordered.get(name)
            if isinstance(theirs, list):
                for a, b in zip(mine, theirs, strict=True):
                    assert a is b or (a == b and a["role"] == "user")  # moved whole, or a rebuilt Anthropic turn
    return True


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_lists(), anthropic_lists(), responses_lists(), st.booleans(), st.booleans(), st.booleans())
def test_the_fast_walk_answers_as_order_record_or_not_at_all(
    chat: list[Any], anthropic: list[Any], responses: list[Any], use_chat: bool, use_anthropic: bool, use_input: bool
) -> None:
    for messages in (chat, anthropic, chat + anthropic):
        record = _parsed({"messages": messages, "input": responses})
        _same_as_order_record(record, chat=use_chat, anthropic=use_anthropic, responses=use_input)
        _same_as_order_record(record)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_clean_runs_are_answered_by_the_fast_walk_in_every_order(form: str, size: int) -> None:
    """Not a walk that always gives up: every arrival order of clean IDs is decided here."""
    for arrival in itertools.permutations(range(size)):
        calls = CALLS[:size]
        record = _parsed(FORMS[form](calls, [(calls[i][0], f"out {i}") for i in arrival]))
        assert _same_as_order_record(record), arrival
        line = orjson.dumps(record)
        quick = quick_marked_line(line)
        assert quick is not None
        fresh, reordered, in_order = quick
        assert (fresh is line) == (list(arrival) == sorted(arrival))
        assert fresh == normalize_line(line)[0] and (reordered, in_order) == ((0, 1) if fresh is line else (1, 0))


@pytest.mark.parametrize(
    "results",
    [
        [("call_b", "1")],  # a short run
        [("call_b", "1"), ("call_b", "2")],  # a repeated ID
        [("call_b", "1"), ("call_z", "2")],  # an unknown ID
        [("call_b", "1"), (None, "2")],  # a missing ID
        [("call_b", "1"), ("", "2")],  # an empty ID
        [("call_b", "1"), (7, "2")],  # not a string
    ],
)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_damaged_runs_go_to_order_record_which_names_the_reason(form: str, results: list[Any]) -> None:
    record = _parsed(FORMS[form](CALLS[:2], results))
    assert order_parsed(record) is None
    line = orjson.dumps(record)
    assert quick_marked_line(line) is None
    out, result = normalize_line(line)
    assert out is line and result.report.kept and not result.changed


def _reference_block(lines: list[bytes]) -> tuple[list[Any], int, int, int, int]:
    """Each line through ``order_record``: the line or its new value; records, changed, reordered, in order."""
    out: list[Any] = []
    records = changed = reordered = in_order = 0
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        records += 1
        ordered, report = order_record(value)
        reordered += report.reordered
        in_order += report.in_order
        if ordered is value:
            out.append(line)
        else:
            changed += 1
            out.append(ordered)
    return out, records, changed, reordered, in_order


_line_records = st.one_of(
    arrived_in_any_order(CALLS),
    st.builds(lambda messages: {"messages": messages}, chat_lists()),
    st.builds(lambda messages: {"messages": messages}, anthropic_lists()),
    st.builds(lambda items: {"input": items}, responses_lists()),
    st.just(sharegpt()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line_records, min_size=1, max_size=8))
def test_a_block_equals_its_lines_through_order_record(records: list[Any]) -> None:
    lines = [json.dumps(record, separators=(",", ":")).encode() for record in records]
    block = b"\n".join(lines) + b"\n"
    edits, tally = block_edits(block)
    expected, records_read, changed, reordered, in_order = _reference_block(lines)
    fresh = bytearray(block)
    for start, end, text in reversed(edits):
        fresh[start:end] = text
    for original, line, want in zip(lines, bytes(fresh).split(b"\n")[:-1], expected, strict=True):
        if isinstance(want, bytes):
            assert line == want  # unchanged: the very bytes
        else:  # rewritten to order_record's value, in the bytes a line alone is written as
            assert json.loads(line) == want and line == normalize_line(original)[0]
    assert (tally.records, tally.changed, tally.runs_reordered, tally.runs_in_order) == (
        records_read,
        changed,
        reordered,
        in_order,
    )
    # Lines without ID markers are not parsed, so their runs (all without IDs) are not counted.
    runs = sum(order_record(r)[1].runs for r, line in zip(records, lines, strict=True) if may_hold_results(line))
    assert sum(tally.runs_kept.values()) == runs - reordered - in_order
