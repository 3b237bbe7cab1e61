"""The pure core of ``toolpair normalize``: one line in, one line out, without files."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.normalize import (
    LineKind,
    NormalizeTally,
    WholeLines,
    apply_edits,
    block_edits,
    may_hold_results,
    normalize_block,
    normalize_line,
    order_record,
)
from tests.dataset_records import FORMS, anthropic, arrived_in_any_order, chat, jsonl, responses, sharegpt

CALLS = [("call_a", "A"), ("call_b", "B"), ("call_c", "C")]


def result_ids(form: str, record: dict[str, Any]) -> list[Any]:
    if form == "chat":
        return [m["tool_call_id"] for m in record["messages"] if m.get("role") == "tool"]
    if form == "anthropic":
        return [b["tool_use_id"] for m in record["messages"] if m["role"] == "user" for b in m["content"]
                if isinstance(b, dict) and b.get("type") == "tool_result"]  # fmt: skip
    return [i["call_id"] for i in record["input"] if i.get("type") == "function_call_output"]


def line_of(record: Any) -> bytes:
    return orjson.dumps(record)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("arrival", list(itertools.permutations(range(3))))
def test_every_permutation_of_three_calls_in_every_form(form: str, arrival: tuple[int, ...]) -> None:
    results = [(CALLS[i][0], f"value of {CALLS[i][1]}") for i in arrival]
    line = line_of(FORMS[form](CALLS, results))
    out, result = normalize_line(line)
    record = orjson.loads(out)
    assert result_ids(form, record) == ["call_a", "call_b", "call_c"]
    in_order = arrival == (0, 1, 2)
    assert result.kind is LineKind.RECORD and result.changed is not in_order
    assert (result.report.reordered, result.report.in_order) == ((0, 1) if in_order else (1, 0))
    if in_order:
        assert out is line
    # Each output still travels with its own call, and nothing else in the record moved.
    expected = FORMS[form](CALLS, [(c, f"value of {k}") for c, k in CALLS])
    assert record == expected


def test_b20_a10_and_a20_b10_stay_distinct_while_arrival_order_alone_disappears() -> None:
    calls = [("call_a", "A"), ("call_b", "B")]
    b20_a10 = chat(calls, [("call_b", "20"), ("call_a", "10")])
    a20_b10 = chat(calls, [("call_a", "20"), ("call_b", "10")])
    a10_b20 = chat(calls, [("call_a", "10"), ("call_b", "20")])  # same pairs as b20_a10, call order

    def contents(line: bytes) -> list[str]:  # what a pipeline that drops IDs renders, by position
        return [m["content"] for m in orjson.loads(line)["messages"] if m["role"] == "tool"]

    assert contents(line_of(b20_a10)) == contents(line_of(a20_b10)) == ["20", "10"]
    out_b20, _ = normalize_line(line_of(b20_a10))
    out_a20, _ = normalize_line(line_of(a20_b10))
    out_a10, _ = normalize_line(line_of(a10_b20))
    assert contents(out_b20) == ["10", "20"] and contents(out_a20) == ["20", "10"]
    assert out_b20 == out_a10  # byte for byte
    assert out_b20 != out_a20


def test_records_without_ids_pass_through_unparsed() -> None:
    line = line_of(sharegpt("what is call id?"))
    out, result = normalize_line(line)
    assert out is line and result.kind is LineKind.RECORD and not result.changed
    # Not even JSON: without a marker the line is not read at all (the fast path) ...
    garbage = b'{"conversations": [ oops'
    assert normalize_line(garbage) == (garbage, normalize_line(line)[1])
    # ... unless validation is asked for.
    out, result = normalize_line(garbage, validate=True)
    assert out is garbage and result.kind is LineKind.BAD
    assert normalize_line(line, validate=True)[1].kind is LineKind.RECORD


def test_unchanged_records_keep_their_exact_bytes() -> None:
    spaced = json.dumps(chat(CALLS[:2], [("call_a", "x"), ("call_b", "y")]), indent=None).encode()
    assert b", " in spaced
    for line in (spaced, spaced.replace(b"call_b", b"call_\\u0062"), b'  {"input": [], "call_id": 1}  '):
        out, result = normalize_line(line)
        assert out is line and not result.changed


@pytest.mark.parametrize(
    "line",
    [b'{"messages": [{"tool_call_id": ', b"tool_use_id", b'{"input": NaN, "call_id": 1}', b'{"call_id": 1e400}'],
)
def test_bad_lines_come_back_unchanged(line: bytes) -> None:
    out, result = normalize_line(line)
    assert out is line and result.kind is LineKind.BAD and not result.changed


def test_blank_lines() -> None:
    for line in (b"", b"   ", b"\r", b"\t "):
        out, result = normalize_line(line)
        assert out is line and result.kind is LineKind.BLANK


def test_kept_runs_are_reported_with_their_reason() -> None:
    cases = {
        "missing_id": chat(CALLS[:2], [("call_b", "1"), (None, "2")]),
        "duplicate_id": chat(CALLS[:2], [("call_b", "1"), ("call_b", "2")]),
        "unknown_id": anthropic(CALLS[:2], [("call_b", "1"), ("call_z", "2")]),
        "non_string_id": responses([(1, "A"), (2, "B")], [(2, "1"), (1, "2")]),
        "incomplete_run": responses(CALLS, [("call_b", "1"), ("call_a", "2")]),
    }
    for reason, record in cases.items():
        line = line_of(record)
        out, result = normalize_line(line)
        assert out is line and not result.changed, reason
        assert result.report.kept == {reason: 1}, reason


def test_mixed_chat_and_anthropic_messages_get_both_rule_sets() -> None:
    chat_part = chat(CALLS[:2], [("call_b", "1"), ("call_a", "2")])["messages"]
    anthropic_part = anthropic([("tu_a", "A"), ("tu_b", "B")], [("tu_b", "1"), ("tu_a", "2")])["messages"]
    record = {"messages": chat_part + anthropic_part}
    snapshot = copy.deepcopy(record)
    out, result = normalize_line(line_of(record))
    assert result.report.reordered == 2
    fixed = orjson.loads(out)
    assert result_ids("chat", fixed) == ["call_a", "call_b"]
    assert result_ids("anthropic", fixed) == ["tu_a", "tu_b"]
    assert record == snapshot
    # The two passes do not see each other's messages: their order does not matter.
    chat_first = order_record(order_record(record, anthropic=False)[0], chat=False)[0]
    anthropic_first = order_record(order_record(record, chat=False)[0], anthropic=False)[0]
    assert chat_first == anthropic_first == fixed


def test_a_record_with_both_messages_and_input_gets_both_forms() -> None:
    record = {
        "messages": chat(CALLS[:2], [("call_b", "1"), ("call_a", "2")])["messages"],
        "input": responses(CALLS[:2], [("call_b", "1"), ("call_a", "2")])["input"],
    }
    out, result = normalize_line(line_of(record))
    fixed = orjson.loads(out)
    assert result.report.reordered == 2
    assert result_ids("chat", fixed) == result_ids("responses", fixed) == ["call_a", "call_b"]
    assert list(fixed) == ["messages", "input"]  # key order kept


def test_a_marker_inside_text_only_costs_a_parse() -> None:
    record = {"messages": [{"role": "user", "content": "what is a tool_call_id, a tool_use_id, a call_id?"}]}
    line = line_of(record)
    out, result = normalize_line(line)
    assert out is line and result.kind is LineKind.RECORD and result.report.runs == 0


def test_non_object_json_is_a_record_left_alone() -> None:
    for line in (b'["call_id"]', b'"tool_use_id"', b"null"):
        _, result = normalize_line(line + b" ")  # the trailing space: still valid JSON
        assert result.kind is LineKind.RECORD and not result.changed


def test_crlf_and_bom_survive_a_rewrite() -> None:
    line = b"\xef\xbb\xbf" + line_of(responses(CALLS[:2], [("call_b", "1"), ("call_a", "2")])) + b"\r"
    out, result = normalize_line(line)
    assert result.changed and out.startswith(b"\xef\xbb\xbf{") and out.endswith(b"}\r")
    assert result_ids("responses", json.loads(out)) == ["call_a", "call_b"]


def test_integers_wider_than_64_bits_keep_every_digit() -> None:
    # The second has 19 digits, one below int64: orjson alone reads it as a float.
    for seed in (123456789012345678901234567890, -9223372036854775809):
        record = {**responses(CALLS[:2], [("call_b", "1"), ("call_a", "2")]), "seed": seed}
        line = json.dumps(record).encode()
        out, result = normalize_line(line)
        assert result.changed and str(seed).encode() in out
        fixed = responses(CALLS[:2], [("call_a", "2"), ("call_b", "1")])["input"]
        assert json.loads(out) == {**record, "input": fixed}


def test_lone_surrogates_and_deep_nesting_are_written_back_faithfully() -> None:
    record = chat(CALLS[:2], [("call_b", "\ud800 lone"), ("call_a", "2")])
    deep: Any = "bottom"
    for _ in range(300):  # deeper than orjson writes
        deep = [deep]
    record["extra"] = deep
    line = json.dumps(record).encode()
    out, result = normalize_line(line)
    assert result.changed
    fixed = json.loads(out)
    assert result_ids("chat", fixed) == ["call_a", "call_b"]
    assert fixed["messages"][3]["content"] == "\ud800 lone" and fixed["extra"] == deep


def test_block_keeps_every_line_and_its_missing_final_newline() -> None:
    reorder = line_of(chat(CALLS[:2], [("call_b", "1"), ("call_a", "2")]))
    block = b"\n".join([reorder, b"", b"not json call_id", b"  ", line_of(sharegpt()), reorder])
    out, tally = normalize_block(block, first_line=7)
    assert out.count(b"\n") == block.count(b"\n") and not out.endswith(b"\n")
    assert (tally.lines, tally.records, tally.changed, tally.blank, tally.bad) == (6, 3, 2, 2, 1)
    assert tally.bad_lines == [9] and tally.changed_lines == [7, 12]
    assert normalize_block(block + b"\n")[0] == out + b"\n"
    assert normalize_block(b"") == (b"", NormalizeTally())


def test_a_block_with_nothing_to_change_is_the_same_object() -> None:
    block = jsonl([sharegpt(), chat(CALLS[:2], [("call_a", "1"), ("call_b", "2")])])
    assert normalize_block(block)[0] is block


# --- properties ---------------------------------------------------------------

_records = st.one_of(
    arrived_in_any_order(CALLS),
    st.just(sharegpt()),
)
_lines = st.one_of(
    _records.map(line_of),
    st.sampled_from([b"", b" ", b"\r", b"{oops call_id", b"not json", b"[1, 2]", b"tool_use_id}"]),
    _records.map(lambda r: json.dumps(r).encode() + b"\r"),
)
_files = st.builds(
    lambda lines, final: b"\n".join(lines) + (b"\n" if final and lines else b""),
    st.lists(_lines, max_size=12),
    st.booleans(),
)


def _line_count(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


@settings(max_examples=200, deadline=None)
@given(_files)
def test_output_has_as_many_lines_as_input_always(data: bytes) -> None:
    out, tally = normalize_block(data)
    assert _line_count(out) == _line_count(data) == tally.lines
    assert out.endswith(b"\n") == data.endswith(b"\n")
    for before, after in zip(data.split(b"\n"), out.split(b"\n"), strict=True):
        if before != after:  # only records that had to move are rewritten, to the same value
            assert normalize_line(before)[1].changed
            assert json.loads(after) == order_record(json.loads(before))[0]


@settings(max_examples=100, deadline=None)
@given(_files, st.lists(st.integers(0, 10_000), max_size=6))
def test_cutting_the_stream_anywhere_gives_the_same_output(data: bytes, cuts: list[int]) -> None:
    whole, whole_tally = normalize_block(data)
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    cutter, out, tally = WholeLines(), [], NormalizeTally()
    for piece in pieces:
        for block in [*cutter.feed(piece)]:
            fresh, part = normalize_block(block, tally.lines + 1)
            out.append(fresh)
            tally.merge(part)
    for block in cutter.finish():
        fresh, part = normalize_block(block, tally.lines + 1)
        out.append(fresh)
        tally.merge(part)
    assert b"".join(out) == whole
    assert tally.as_report() == whole_tally.as_report()


@settings(max_examples=100, deadline=None)
@given(_files)
def test_edits_spliced_into_the_block_equal_the_normalized_block(data: bytes) -> None:
    edits, tally = block_edits(data)
    assert apply_edits(data, edits) == normalize_block(data)[0]
    assert len(edits) == tally.changed


def test_tally_keeps_a_bounded_number_of_line_numbers() -> None:
    tally = NormalizeTally(max_line_numbers=3)
    for _ in range(2):
        part = normalize_block(b"\n".join([b"bad call_id"] * 5))[1]
        tally.merge(part)
    report = tally.as_report()
    assert report["bad_lines"] == 10 and report["bad_line_numbers"] == [1, 2, 3]
    assert report["bad_line_numbers_truncated"] is True


@settings(max_examples=200, deadline=None)
@given(st.lists(_records, min_size=1, max_size=3))
def test_rule_sets_skipped_by_shape_change_neither_output_nor_report(records: list[Any]) -> None:
    # One record whose messages hold several forms at once, so chat and Anthropic runs meet.
    record = {
        "messages": [m for r in records for m in r.get("messages", [])],
        "input": [i for r in records for i in r.get("input", [])],
    }
    line = line_of(record)
    out, result = normalize_line(line)
    ordered, report = order_record(orjson.loads(line))  # every rule set, no byte checks
    assert result.report == report
    assert orjson.loads(out) == ordered


def _escape_letters(line: bytes, chosen: set[int], upper: bool) -> bytes:
    """The same JSON with the chosen letters and underscores inside strings written as ``\\u00XX`` escapes."""
    out = bytearray()
    inside = escaped = False
    for index, byte in enumerate(line):
        if escaped:
            escaped = False
        elif inside and byte == 0x5C:
            escaped = True
        elif byte == 0x22:
            inside = not inside
        elif inside and index in chosen and (0x61 <= byte <= 0x7A or byte == 0x5F):
            out += (f"\\u{byte:04X}" if upper else f"\\u{byte:04x}").encode()
            continue
        out.append(byte)
    return bytes(out)


_tricky_text = st.sampled_from(
    ["tool_call_id", '"tool_use_id": "x"', '\\"call_id\\"', "\\u0074ool", "caf\u00e9 \u2603", "\\", ""]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_records, min_size=1, max_size=3), st.sets(st.integers(0, 1500)), st.booleans(), _tricky_text)
def test_the_byte_scan_never_skips_a_line_whose_run_could_move(
    records: list[Any], chosen: set[int], upper: bool, tricky: str
) -> None:
    """Keys spelled with escapes, markers inside strings, escaped quotes: output as if every line were parsed."""
    record = {
        "messages": [{"role": "user", "content": tricky}, *(m for r in records for m in r.get("messages", []))],
        "input": [i for r in records for i in r.get("input", [])],
    }
    line = _escape_letters(line_of(record), chosen, upper)
    assert orjson.loads(line) == record  # the escapes spell the same record
    ordered, report = order_record(record)
    if report.runs:
        assert may_hold_results(line)
    out, result = normalize_line(line)
    assert orjson.loads(out) == ordered and (out is line) == (report.reordered == 0)
    assert result.report == report
    assert block_edits(line)[1].runs_reordered == report.reordered


def test_adversarial_lines_for_the_byte_scan() -> None:
    reversed_chat = line_of(chat(CALLS[:2], [("call_b", "1"), ("call_a", "2")]))
    for spelled in (
        reversed_chat.replace(b"tool_call_id", b"tool_call\\u005Fid"),  # no "call_id" left in the bytes
        reversed_chat.replace(b"tool_call_id", b"\\u0074ool_c\\u0061ll_id").replace(b"tool_calls", b"tool\\u005fcalls"),
    ):
        assert may_hold_results(spelled) and normalize_line(spelled)[1].changed
        assert block_edits(spelled)[1].changed == 1
    # A marker inside a string, between escaped quotes: a parse that finds nothing to move.
    decoy = line_of({"messages": [{"role": "user", "content": '"tool_call_id": "a"'}]})
    assert b'\\"tool_call_id\\"' in decoy and may_hold_results(decoy)
    assert normalize_line(decoy)[0] is decoy
    # Escapes of characters no marker holds (non-ASCII text) keep the fast path.
    assert not may_hold_results(line_of(sharegpt("caf\u00e9 \u2603")).replace(b"\xc3\xa9", b"\\u00e9"))
