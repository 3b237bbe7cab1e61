"""Dataset records in call order: the proxy's ordering rules applied to one record or one JSONL line.

Pure, no I/O. A line goes in as bytes (without its ``\\n``) and comes out as
bytes, with what happened to it:

- A line that holds none of the ID markers (``call_id``, which ``tool_call_id``
  contains, and ``tool_use_id``), and no ``\\u00XX`` escape that could spell
  one, is not parsed at all (``may_hold_results``): it cannot hold a run that
  could be reordered. This is the same fast path the proxy takes.
- A record whose runs are already in call order (or must keep their order) comes
  back as the very same bytes. Only a record that changes is re-serialized.
- A line that is not JSON comes back unchanged and is counted as bad; a blank
  line comes back unchanged.

Which rules apply to a parsed record (form detection, per record, by shape):

- ``messages`` (a list) is checked with the Chat Completions rules and then with
  the Anthropic rules. Each set only sees its own shapes: the chat rules permute
  ``role: "tool"`` messages after an assistant ``tool_calls`` turn, the Anthropic
  rules permute ``tool_result`` blocks inside the ``role: "user"`` messages after
  an assistant turn with ``tool_use`` blocks. So a chat list is untouched by the
  Anthropic rules and the other way round, and a list holding both forms (a
  converted or mixed trace) gets both, with the same result in either order.
- ``input`` (a list) is checked with the Responses rules.
- Anything else (ShareGPT ``conversations``, plain text, non-objects) passes
  through unchanged.

A parsed line skips a rule set whose shape its bytes cannot hold: the chat rules
need a ``tool_calls`` key, the Anthropic rules a ``tool_result`` block, the
Responses rules a ``*_call_output`` item, so a line without those bytes has no
run of that form to move or to count. On short chat records this halves the
time spent in the rules. A line with an escape that could spell a shape
(``"tool\\u005fcalls"``) gets every rule set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, NoReturn

import orjson

from proxy._types import JSON
from proxy.normalize.walk import clean_anthropic_runs, clean_chat_runs, clean_responses_runs
from proxy.order import NO_RUNS, OrderReport, order_anthropic_results, order_chat_results, order_responses_items

try:
    from proxy.normalize._scan import scan as _scan_line
    from proxy.normalize._scan import scan_block as _scan_block
except ImportError:  # built without a C compiler: every line is parsed in Python
    _scan_line = _scan_block = None  # type: ignore[assignment]

__all__ = [
    "ID_MARKERS",
    "LineKind",
    "LineResult",
    "NormalizeTally",
    "normalize_line",
    "normalize_marked_line",
    "may_hold_results",
    "native_scan",
    "native_scan_block",
    "order_parsed",
    "order_record",
    "quick_marked_line",
]

ANTHROPIC_MARKER = b"tool_use_id"
RESPONSES_MARKER = b"call_id"
ID_MARKERS = (RESPONSES_MARKER, ANTHROPIC_MARKER)
"""A line holding neither is never parsed (``call_id`` is inside ``tool_call_id`` too)."""
_LETTER_ESCAPE = b"\\u00"
_MARKER_LETTER_ESCAPE = re.compile(rb"\\u00[5-7]")
"""A JSON escape of a code point from U+0050 to U+007F: every marker's letters and ``_`` are in there."""
CHAT_SHAPE = b"tool_calls"  # a line without it has no chat run
ANTHROPIC_SHAPE = b"tool_result"  # a line without it has no Anthropic run
RESPONSES_SHAPE = b"call_output"  # nor without it a Responses one (function_call_output, custom_tool_call_output)

_NO_RUNS = NO_RUNS

native_scan: Callable[[bytes], tuple[bytes, int, int] | None] | None = _scan_line
"""``quick_marked_line`` decided on the line's bytes, in C (``_scan.c``): None where it was not built.

It answers (the very line, or the line with whole result objects moved; runs
reordered; runs in order) only where its answer is the one the Python path
gives, and None for every other line, which then takes the Python path.
"""

ScanBlock = Callable[
    [bytes], tuple[list[tuple[int, int, bytes, int]], int, int, int, int, int, list[tuple[int, int, int]]]
]
native_scan_block: ScanBlock | None = _scan_block
"""``native_scan`` over every line of a block, for ``jsonl.block_edits``: None where it was not built.

Returns the moved lines as (start, end, new bytes, index), the lines answered,
runs reordered, runs in order, blank lines, lines left unread (no "_" and no
backslash), and as (start, end, index) the lines it did not answer.
"""
# orjson reads integers outside int64/uint64 as floats, losing digits: positive
# ones of 20 digits, negative ones from 19 (-9223372036854775809). A changed line
# with a run of 19 digits (even inside a string) is re-read exactly instead.
# Mapping every digit to "0" and searching is several times faster than a regex.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_NINETEEN_DIGITS = b"0" * 19
_BOM = b"\xef\xbb\xbf"
_loads = orjson.loads


class LineKind(StrEnum):
    """What a line turned out to be."""

    RECORD = "record"  # a JSON value, or a line without ID markers, which is not parsed
    BLANK = "blank"  # empty or whitespace only
    BAD = "bad"  # not JSON, or JSON toolpair cannot read and write back faithfully


class LineResult(NamedTuple):
    """What normalizing one line did: its kind, whether it changed, its runs.

    A named tuple, not a frozen dataclass: one is made per parsed line, and a
    tuple is made several times faster.
    """

    kind: LineKind
    changed: bool = False
    report: OrderReport = _NO_RUNS


_UNPARSED = LineResult(LineKind.RECORD)
_BLANK = LineResult(LineKind.BLANK)
_BAD = LineResult(LineKind.BAD)


def order_record(
    record: JSON, *, chat: bool = True, anthropic: bool = True, responses: bool = True
) -> tuple[JSON, OrderReport]:
    """Put each run of one dataset record in call order; the same object when nothing moved.

    The flags switch a form's rules off, for callers that know the form.

    >>> calls = {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}
    >>> record = {"messages": [calls, {"role": "tool", "tool_call_id": "b"},
    ...                        {"role": "tool", "tool_call_id": "a"}]}
    >>> out, report = order_record(record)
    >>> [m.get("tool_call_id") for m in out["messages"]], report.reordered
    ([None, 'a', 'b'], 1)
    """
    if not isinstance(record, dict):
        return record, _NO_RUNS
    report = _NO_RUNS
    changes: dict[str, Any] | None = None
    messages = record.get("messages")
    if isinstance(messages, list):
        ordered = messages
        if chat:
            ordered, report = order_chat_results(ordered)
        if anthropic:
            ordered, found = order_anthropic_results(ordered)
            report = report.merged(found)
        if ordered is not messages:
            changes = {"messages": ordered}
    if responses:
        items = record.get("input")
        if isinstance(items, list):
            ordered, found = order_responses_items(items)
            report = report.merged(found)
            if ordered is not items:
                changes = {**changes, "input": ordered} if changes else {"input": ordered}
    return ({**record, **changes} if changes else record), report


def order_parsed(
    record: JSON, *, chat: bool = True, anthropic: bool = True, responses: bool = True
) -> tuple[JSON, int, int] | None:
    """``order_record`` for a record just parsed from JSON: the result and its runs reordered and in order.

    None when a run is not clean (see ``walk``): ``order_record`` then decides
    the record and says why a run keeps its order. When this returns a result,
    it is the one ``order_record`` gives, and so are the counts.
    """
    if type(record) is not dict:
        return record, 0, 0
    reordered = in_order = 0
    changes: dict[str, Any] | None = None
    messages = record.get("messages")
    if type(messages) is list:
        ordered = messages
        if chat:
            walked = clean_chat_runs(ordered)
            if walked is None:
                return None
            ordered, moved, kept_order = walked
            reordered += moved
            in_order += kept_order
        if anthropic:
            walked = clean_anthropic_runs(ordered)
            if walked is None:
                return None
            ordered, moved, kept_order = walked
            reordered += moved
            in_order += kept_order
        if ordered is not messages:
            changes = {"messages": ordered}
    if responses:
        items = record.get("input")
        if type(items) is list:
            walked = clean_responses_runs(items)
            if walked is None:
                return None
            ordered, moved, kept_order = walked
            reordered += moved
            in_order += kept_order
            if ordered is not items:
                changes = {**changes, "input": ordered} if changes else {"input": ordered}
    return ({**record, **changes} if changes else record), reordered, in_order


_COUNTED: dict[tuple[int, int], OrderReport] = {(0, 0): _NO_RUNS}


def _counted(reordered: int, in_order: int) -> OrderReport:
    """The report of runs that were all clean: one shared instance per pair of counts."""
    report = _COUNTED.get((reordered, in_order))
    if report is None:
        report = _COUNTED[reordered, in_order] = OrderReport(reordered, in_order)
    return report


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range")
    return value


def _load_exact(line: bytes) -> JSON:
    """Read a line with the standard library: exact integers, lone surrogates, a BOM."""
    return json.loads(line, parse_constant=_reject_constant, parse_float=_finite_float)


def _load(line: bytes) -> tuple[JSON, bool] | None:
    """The record and whether it was read exactly by the standard library; None if unreadable."""
    try:
        return orjson.loads(line), False
    except orjson.JSONDecodeError:
        pass
    try:
        return _load_exact(line), True
    except (ValueError, RecursionError):
        return None


def _dump(value: JSON, exact: bool) -> bytes | None:
    if not exact:
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:  # nested deeper than orjson writes
            pass
    try:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            return text.encode()
        except UnicodeEncodeError:  # a lone surrogate: only an escape can carry it
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, RecursionError):
        return None


def may_hold_results(line: bytes) -> bool:
    """Whether the line may hold a tool result; False means it needs no parse.

    Conservative by construction: every result that could move is found by
    its ID key (``tool_call_id``, ``tool_use_id``, ``call_id``), and a key is in
    the bytes either as written, which the substring searches see, or with a
    letter spelled as a ``\\u00XX`` escape, which sends the line to the parser
    (JSON has no other way to write a letter or ``_``). A marker inside a string
    value only makes the answer True more often, whatever quotes or escapes are
    around it. Escapes of other characters (non-ASCII text) keep the fast path.

    >>> may_hold_results(b'{"messages": [{"role": "user", "content": "hi"}]}')
    False
    >>> may_hold_results(b'{"text": "a tool_use_id, \\\\"quoted\\\\""}')
    True
    >>> may_hold_results(rb'{"tool_call\\u005fid": "a"}'), may_hold_results(rb'{"text": "caf\\u00e9"}')
    (True, False)
    """
    if RESPONSES_MARKER in line or ANTHROPIC_MARKER in line:
        return True
    return _LETTER_ESCAPE in line and _MARKER_LETTER_ESCAPE.search(line) is not None


def normalize_line(line: bytes, *, validate: bool = False, field: str | None = None) -> tuple[bytes, LineResult]:
    """Normalize one JSONL line (given without its ``\\n``); unchanged lines come back as is.

    With ``validate``, lines without ID markers are parsed too, only so that a
    bad one is counted; they still come back as they were. With ``field``, the
    line is not a whole record but the value of that field of one (a Parquet
    cell holding the ``messages`` list as JSON text).

    >>> line = (b'{"input": [{"type": "function_call", "call_id": "a"}, {"type": "function_call", '
    ...         b'"call_id": "b"}, {"type": "function_call_output", "call_id": "b"}, '
    ...         b'{"type": "function_call_output", "call_id": "a"}]}')
    >>> out, result = normalize_line(line)
    >>> out
    b'{"input":[{"type":"function_call","call_id":"a"},{"type":"function_call","call_id":"b"},{"type":"function_call_output","call_id":"a"},{"type":"function_call_output","call_id":"b"}]}'
    >>> result.changed, result.report.reordered
    (True, 1)
    >>> normalize_line(b'{"conversations": []}')[0]
    b'{"conversations": []}'
    """
    if not may_hold_results(line):
        if not line or line.isspace():
            return line, _BLANK
        return line, (_UNPARSED if not validate or _load(line) is not None else _BAD)
    return normalize_marked_line(line, field=field)


def normalize_marked_line(line: bytes, *, field: str | None = None) -> tuple[bytes, LineResult]:
    """``normalize_line`` for a line that ``may_hold_results``: parse, order, write back if it moved."""
    try:  # orjson inline: this runs once per parsed line
        value, exact = _loads(line), False
    except orjson.JSONDecodeError:
        loaded = _load(line)
        if loaded is None:
            return line, _BAD
        value, exact = loaded
    if _LETTER_ESCAPE in line and _MARKER_LETTER_ESCAPE.search(line) is not None:
        chat = anthropic = responses = True  # a shape may be spelled with escapes: no byte check stands
    else:
        chat, anthropic, responses = CHAT_SHAPE in line, ANTHROPIC_SHAPE in line, RESPONSES_SHAPE in line
    record = value if field is None else {field: value}
    walked = order_parsed(record, chat=chat, anthropic=anthropic, responses=responses)
    if walked is None:
        ordered, report = order_record(record, chat=chat, anthropic=anthropic, responses=responses)
    else:
        ordered, reordered, in_order = walked
        report = _counted(reordered, in_order)
    if ordered is record:
        return line, LineResult(LineKind.RECORD, False, report)
    if not exact and _NINETEEN_DIGITS in line.translate(_DIGITS_AS_ZERO):
        try:
            value = _load_exact(line)
            record = value if field is None else {field: value}
            ordered, report = order_record(record, chat=chat, anthropic=anthropic, responses=responses)
            exact = True
        except (ValueError, RecursionError):
            pass  # orjson's reading stands
    body = _dump(ordered if field is None else ordered[field], exact)
    if body is None:
        return line, _BAD
    prefix = _BOM if line.startswith(_BOM) else b""
    suffix = b"\r" if line.endswith(b"\r") else b""
    return prefix + body + suffix, LineResult(LineKind.RECORD, True, report)


def quick_marked_line(line: bytes) -> tuple[bytes, int, int] | None:
    """``normalize_marked_line`` for the common line, without a result object: what a block costs most.

    The line's bytes (the very object when nothing moved) or its rewrite, with
    its runs reordered and in order. None sends the line to
    ``normalize_marked_line``, which gives the same answer for every line this
    one answers: a line that is not orjson's JSON, a run that is not clean, a
    rewrite that needs more than ``orjson.dumps`` (a CR ending, 19 digits).
    """
    try:
        value = _loads(line)
    except orjson.JSONDecodeError:
        return None
    if _LETTER_ESCAPE in line and _MARKER_LETTER_ESCAPE.search(line) is not None:
        walked = order_parsed(value)
    else:
        walked = order_parsed(
            value, chat=CHAT_SHAPE in line, anthropic=ANTHROPIC_SHAPE in line, responses=RESPONSES_SHAPE in line
        )
    if walked is None:
        return None
    ordered, reordered, in_order = walked
    if ordered is value:
        return line, reordered, in_order
    if line.endswith(b"\r") or _NINETEEN_DIGITS in line.translate(_DIGITS_AS_ZERO):
        return None
    try:
        return orjson.dumps(ordered), reordered, in_order
    except orjson.JSONEncodeError:
        return None


@dataclass
class NormalizeTally:
    """Counts over many lines (or Parquet rows), mergeable across blocks and workers.

    Numbers start where the caller says: JSONL lines at 1, Parquet rows at 0. At
    most ``max_line_numbers`` of each list are kept, so memory stays bounded
    however bad the input is.
    """

    lines: int = 0
    records: int = 0
    changed: int = 0
    blank: int = 0
    bad: int = 0
    runs_reordered: int = 0
    runs_in_order: int = 0
    runs_kept: dict[str, int] = field(default_factory=dict)
    bad_lines: list[int] = field(default_factory=list)
    changed_lines: list[int] = field(default_factory=list)
    max_line_numbers: int = 1000

    def add(self, line_number: int, result: LineResult) -> None:
        self.lines += 1
        kind = result.kind
        if kind is LineKind.BLANK:
            self.blank += 1
            return
        if kind is LineKind.BAD:
            self.bad += 1
            if len(self.bad_lines) < self.max_line_numbers:
                self.bad_lines.append(line_number)
            return
        self.records += 1
        if result.changed:
            self.changed += 1
            if len(self.changed_lines) < self.max_line_numbers:
                self.changed_lines.append(line_number)
        report = result.report
        if report is not _NO_RUNS:
            self.runs_reordered += report.reordered
            self.runs_in_order += report.in_order
            if report.kept:
                for reason, count in report.kept.items():
                    self.runs_kept[reason] = self.runs_kept.get(reason, 0) + count

    def renumber(self, shift: int) -> None:
        """Add ``shift`` to the line numbers kept: a block numbered from 1 placed after ``shift`` lines."""
        if shift:
            self.bad_lines = [number + shift for number in self.bad_lines]
            self.changed_lines = [number + shift for number in self.changed_lines]

    def merge(self, other: NormalizeTally) -> None:
        """Add the counts of ``other``, which covers lines after this one's."""
        self.lines += other.lines
        self.records += other.records
        self.changed += other.changed
        self.blank += other.blank
        self.bad += other.bad
        self.runs_reordered += other.runs_reordered
        self.runs_in_order += other.runs_in_order
        for reason, count in other.runs_kept.items():
            self.runs_kept[reason] = self.runs_kept.get(reason, 0) + count
        room = self.max_line_numbers
        self.bad_lines.extend(other.bad_lines[: room - len(self.bad_lines)])
        self.changed_lines.extend(other.changed_lines[: room - len(self.changed_lines)])

    def as_report(self, *, rows: bool = False) -> dict[str, Any]:
        """The ``--report`` document; ``rows`` names Parquet rows (numbered from 0) instead of lines."""
        unit, numbers = ("row", "indices") if rows else ("line", "numbers")
        return {
            f"{unit}s": self.lines,
            "records_read": self.records,
            "records_changed": self.changed,
            f"blank_{unit}s": self.blank,
            "runs_reordered": self.runs_reordered,
            "runs_in_order": self.runs_in_order,
            "runs_kept": dict(sorted(self.runs_kept.items())),
            f"bad_{unit}s": self.bad,
            f"bad_{unit}_{numbers}": list(self.bad_lines),
            f"bad_{unit}_{numbers}_truncated": self.bad > len(self.bad_lines),
            f"changed_{unit}_{numbers}": list(self.changed_lines),
            f"changed_{unit}_{numbers}_truncated": self.changed > len(self.changed_lines),
        }
