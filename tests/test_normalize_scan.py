"""The native scan (``proxy/normalize/_scan.c``) answers a line only as the Python path would.

For every line it answers, the bytes out (the very line object when nothing
moved), the runs reordered and the runs in order must be what
``normalize_marked_line`` gives, and that path must not call the line bad. The
lines here are the records of all three forms written in several ways (orjson,
the standard library with spaces, ASCII escapes, letters of keys escaped), with
adversarial strings inside (keys and quotes inside strings, escapes of every
kind, non-ASCII text, control characters), and then damaged byte by byte. The
scan may decline any of them; it must never answer one differently.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.normalize import jsonl
from proxy.normalize.core import LineKind, native_scan, normalize_marked_line
from tests.dataset_records import FORMS
from tests.test_normalize_core import _escape_letters
from tests.test_order_reference import anthropic_lists, chat_lists, responses_lists

CALLS = [("call_a", "A"), ("call_b", "B"), ("call_c", "C")]


def _scan(line: bytes) -> tuple[bytes, int, int] | None:
    assert native_scan is not None, "proxy/normalize/_scan.c was not built: install with a C compiler"
    return native_scan(line)


def _agrees(line: bytes) -> bool:
    """Check the scan against the Python path on one line; whether the scan answered."""
    answer = _scan(line)
    if answer is None:
        return False
    out, reordered, in_order = answer
    expected, result = normalize_marked_line(line)
    assert result.kind is LineKind.RECORD, line
    assert (out is line) == (expected is line), line
    assert out == expected, line
    assert (reordered, in_order, {}) == (result.report.reordered, result.report.in_order, result.report.kept), line
    return True


def test_the_native_scan_is_built() -> None:
    assert native_scan is not None


@pytest.mark.parametrize("form", sorted(FORMS))
def test_compact_records_are_answered_in_every_arrival_order(form: str) -> None:
    for size in (1, 2, 3):
        for arrival in itertools.permutations(range(size)):
            record = FORMS[form](CALLS[:size], [(CALLS[i][0], f"out {i}") for i in arrival])
            line = orjson.dumps(record)
            assert _agrees(line), (form, arrival)
            _, reordered, _ = _scan(line)  # type: ignore[misc]
            assert reordered == (list(arrival) != sorted(arrival))


def test_what_it_declines() -> None:
    moved = orjson.dumps(FORMS["chat"](CALLS[:2], [("call_b", "1"), ("call_a", "2")]))
    in_order = orjson.dumps(FORMS["chat"](CALLS[:2], [("call_a", "1"), ("call_b", "2")]))
    spaced = json.dumps(orjson.loads(moved)).encode()
    declined = [
        spaced,  # must change, but is not in orjson's compact form
        moved.replace(b'"messages"', b'"messages":[],"messages"'),  # a repeated key
        moved.replace(b"tool_call_id", b"tool\\u005fcall_id"),  # a key spelled with an escape
        moved.replace(b'"call_b"', b'"call_\\u0062"'),  # an ID spelled with an escape
        moved[:-1],  # not JSON
        moved + b"x",
        moved.replace(b'"role":"tool"', b'"role":"tool","x":1e5', 1),  # an exponent
        moved.replace(b'"role":"tool"', b'"role":"tool","x":12345678901234567890', 1),  # 20 digits
        moved.replace(b'"role":"tool"', b'"role":"tool","x":"\\ud800"', 1),  # a lone surrogate
        moved.replace(b'"role":"tool"', b'"role":"tool","x":"\xff"', 1),  # not UTF-8
        moved.replace(b'"role":"tool"', b'"role":"tool","x":"\x01"', 1),  # a raw control character
        moved.replace(b'"role":"tool"', b'"role":"tool","x":' + b"[" * 100 + b"]" * 100, 1),  # deep
        b"[" + moved + b"]",  # not an object
        orjson.dumps(FORMS["chat"](CALLS[:2], [("call_b", "1"), ("call_b", "2")])),  # a repeated result ID
    ]
    for form in FORMS:  # runs that proxy.order keeps in their order, for a reason it names
        for calls, results in [
            (CALLS[:2], [("call_b", "1")]),  # a short run
            (CALLS[:2], [("call_b", "1"), ("call_b", "2")]),  # a repeated result ID
            ([("call_a", "A"), ("call_a", "B")], [("call_a", "1"), ("call_a", "2")]),  # a repeated call ID
            (CALLS[:2], [("call_b", "1"), ("call_z", "2")]),  # an unknown ID
            (CALLS[:2], [("call_b", "1"), (None, "2")]),  # a missing ID
            ([("", "A"), ("call_b", "B")], [("call_b", "1"), ("", "2")]),  # an empty ID
            ([("", "A"), ("call_b", "B")], [("", "1"), ("call_b", "2")]),
            ([("", "A")], [("", "1")]),
            ([(7, "A"), ("call_b", "B")], [("call_b", "1"), (7, "2")]),  # not a string
        ]:
            declined.append(orjson.dumps(FORMS[form](calls, results)))
    for line in declined:
        assert _scan(line) is None, line
    # Unchanged lines need not be compact: only a line that changes is written anew.
    assert _scan(json.dumps(orjson.loads(in_order)).encode()) is not None


_tricky = st.sampled_from(
    [
        "tool_call_id",
        '"tool_use_id": "call_a"',
        '\\"call_id\\"',
        '{"role": "tool", "tool_call_id": "call_b"}',
        "\\u0074ool",
        "caf\u00e9 \u2603 \U0001f600",
        "\\",
        "/ \x7f \x00 \x1f \x08 \t \n \r \u2028",
        "",
        "]}],",
    ]
)


def _records(tricky: str) -> st.SearchStrategy[Any]:
    def with_text(record: Any) -> Any:
        if isinstance(record, dict) and isinstance(record.get("messages"), list):
            return {**record, "messages": [{"role": "user", "content": tricky}, *record["messages"]]}
        return record

    clean = st.builds(
        lambda form, arrival, n: FORMS[form](CALLS[:n], [(CALLS[i][0], tricky or str(i)) for i in arrival if i < n]),
        st.sampled_from(sorted(FORMS)),
        st.permutations(range(3)),
        st.integers(1, 3),
    )
    damaged = st.one_of(
        st.builds(lambda m: {"messages": m}, chat_lists()),
        st.builds(lambda m: {"messages": m}, anthropic_lists()),
        st.builds(lambda m: {"input": m}, responses_lists()),
    )
    return st.one_of(clean, damaged).map(with_text)


def _writings(record: Any) -> list[bytes]:
    out = [json.dumps(record).encode(), json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()]
    with contextlib.suppress(TypeError):  # an integer wider than 64 bits
        out.append(orjson.dumps(record))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), _tricky)
def test_every_line_it_answers_is_answered_as_the_python_path_does(data: st.DataObject, tricky: str) -> None:
    record = data.draw(_records(tricky))
    for line in _writings(record):
        _agrees(line)
        _agrees(_escape_letters(line, data.draw(st.sets(st.integers(0, len(line)), max_size=3)), True))
        _agrees(_escape_letters(line, data.draw(st.sets(st.integers(0, len(line)), max_size=3)), False))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_bytes_are_declined_or_answered_as_the_python_path_does(data: st.DataObject) -> None:
    record = data.draw(_records(data.draw(_tricky)))
    line = data.draw(st.sampled_from(_writings(record)))
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(line)))
        action = data.draw(st.sampled_from(["cut", "insert", "replace", "delete", "repeat"]))
        byte = bytes([data.draw(st.sampled_from(list(b'"\\{}[],:0123456789.-eE tfnul \x00\x7f\x80\xc3\xff')))])
        if action == "cut":
            line = line[:where]
        elif action == "insert":
            line = line[:where] + byte + line[where:]
        elif action == "replace":
            line = line[:where] + byte + line[where + 1 :]
        elif action == "delete":
            line = line[:where] + line[where + 1 :]
        else:  # a slice written twice: repeated keys, elements, IDs
            size = data.draw(st.integers(1, 40))
            line = line[: where + size] + line[where : where + size] + line[where + size :]
    line = line.replace(b"\n", b" ")
    if _scan(line) is not None:
        assert _agrees(line)


_VALUES = ["1.5", "-0", "0", "-12", "123456789012345", "true", "false", "null", "{}", "[]"]
_STRINGS = ['"\\u00e9"', '"\\/"', '"\\u001F"', '"\\u001f"', '"\\t"', '"\\u0009"']


@pytest.mark.parametrize("text", [*_VALUES, *_STRINGS])
def test_values_orjson_writes_differently_only_stop_a_rewrite(text: str) -> None:
    moved = FORMS["responses"](CALLS[:2], [("call_b", "1"), ("call_a", "2")])
    kept = FORMS["responses"](CALLS[:2], [("call_a", "1"), ("call_b", "2")])
    for record in (moved, kept):
        line = orjson.dumps(record)[:-1] + b',"extra":' + text.encode() + b"}"
        answered = _agrees(line)
        canonical = orjson.dumps(orjson.loads(line)) == line
        if record is kept or (canonical and "." not in text):  # a float: the Python path writes the line
            assert answered, line


_INSIDE = ['\\"', "\\\\", "\\n", "\\u0041", "\u00e9", "\u20ac", "\U0001f600", "\x7f", '","call_id":"call_a']
"""What may stop a run of plain bytes inside a string: escapes, non-ASCII text, DEL, a key-like text."""


@pytest.mark.parametrize("inside", _INSIDE)
def test_every_byte_offset_in_a_long_string_is_read(inside: str) -> None:
    """The scan skips plain bytes 8 at a time: whatever stops a run, and a string's end, at every offset."""
    for before in range(0, 19):
        for after in (0, 1, 7, 8, 9, 40):
            output = "x" * before + inside + "y" * after
            for arrival in ((1, 0), (0, 1)):
                record = FORMS["chat"](CALLS[:2], [(CALLS[i][0], output if i else "z" * before) for i in arrival])
                line = orjson.dumps(record)
                assert _agrees(line), (inside, before, after, arrival)
    for before in range(0, 19):  # a raw control byte: not JSON, declined wherever it is
        record = FORMS["chat"](CALLS[:2], [("call_b", "x" * before + "\x01" + "y" * 9), ("call_a", "2")])
        line = orjson.dumps(record).replace(b"\\u0001", b"\x01")
        assert _scan(line) is None, before


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.lists(st.integers(0, 6), min_size=1, max_size=12), st.booleans(), st.integers(1, 5000))
def test_a_block_through_the_native_scan_equals_the_block_in_python(
    data: st.DataObject, kinds: list[int], final_newline: bool, first_line: int
) -> None:
    """Lines it answers, lines it leaves to Python, blank and bad ones: merged back in line order."""
    lines = []
    for kind in kinds:
        if kind <= 2:
            lines.append(data.draw(st.sampled_from(_writings(data.draw(_records(data.draw(_tricky)))))))
        elif kind == 3:
            lines.append(data.draw(st.sampled_from([b"", b"  ", b"\t\r", b"\x0b\x0c"])))
        elif kind == 4:
            lines.append(data.draw(st.sampled_from([b"{oops call_id", b"not json", b"[1]", b"tool_use_id}", b"a_b"])))
        elif kind == 5:  # a CRLF line, or one with a BOM
            record = data.draw(_records(data.draw(_tricky)))
            line = data.draw(st.sampled_from(_writings(record)))
            lines.append(line + b"\r" if data.draw(st.booleans()) else b"\xef\xbb\xbf" + line)
        else:
            lines.append(json.dumps({"conversations": [{"from": "human", "value": data.draw(_tricky)}]}).encode())
    block = b"\n".join(line.replace(b"\n", b" ") for line in lines) + (b"\n" if final_newline else b"")
    native = jsonl.block_edits(block, first_line)
    saved = jsonl.native_scan_block
    jsonl.native_scan_block = None
    try:
        python = jsonl.block_edits(block, first_line)
    finally:
        jsonl.native_scan_block = saved
    assert native[0] == python[0]
    assert native[1].as_report() == python[1].as_report()


def test_line_numbers_kept_are_the_first_thousand_across_both_paths() -> None:
    moved = orjson.dumps(FORMS["chat"](CALLS[:2], [("call_b", "1"), ("call_a", "2")]))
    lines = [moved + b"\r" if i % 7 == 3 else moved for i in range(2500)]  # a CR line is left to Python
    block = b"\n".join(lines)
    native = jsonl.block_edits(block, 11)
    saved = jsonl.native_scan_block
    jsonl.native_scan_block = None
    try:
        python = jsonl.block_edits(block, 11)
    finally:
        jsonl.native_scan_block = saved
    assert native[0] == python[0]
    report = native[1].as_report()
    assert report == python[1].as_report()
    assert report["records_changed"] == 2500 and report["changed_line_numbers"] == list(range(11, 1011))
