"""Dataset normalizing: the proxy's ordering rules applied to the records people train on.

The public surface, for training pipelines and for ``toolpair normalize``:

- ``normalize_record(record)``: one record (a dict, as ``datasets`` hands it to
  ``Dataset.map``) in, the same record with its tool results in call order out,
  plus a ``toolpair`` entry saying what happened.
- ``normalize_line`` / ``normalize_block``: JSONL bytes in, bytes out; records
  that do not change come back as the very same bytes.
- ``order_record``: the rules on a parsed record, with the report as a value.

Modules: ``core`` (one record or line, pure), ``jsonl`` (blocks and JSONL files),
``parquet`` (Parquet files, by row group; needs ``pyarrow``), ``files`` (the
output file), ``cli`` (one run of the command).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.normalize.core import LineKind, LineResult, NormalizeTally, may_hold_results, normalize_line, order_record
from proxy.normalize.jsonl import WholeLines, apply_edits, block_edits, normalize_block
from proxy.order import KeptReason, OrderReport

__all__ = [
    "REPORT_KEY",
    "LineKind",
    "LineResult",
    "NormalizeTally",
    "WholeLines",
    "apply_edits",
    "block_edits",
    "may_hold_results",
    "normalize_block",
    "normalize_line",
    "normalize_record",
    "order_record",
]

REPORT_KEY = "toolpair"
"""The key ``normalize_record`` adds for what happened (a column, under ``Dataset.map``)."""

_FIELDS = ("messages", "input")  # Chat Completions or Anthropic, and Responses


def normalize_record(record: Mapping[str, Any], *, with_report: bool = True) -> dict[str, Any]:
    """The record with each run of tool results in call order: a function for ``Dataset.map``.

    ``messages`` (Chat Completions or Anthropic) and ``input`` (Responses) may
    be lists, as a native nested column gives them, or JSON text, as a string
    column does; text comes back as text, rewritten only when something moved.
    Every other key is kept as it is, and nothing is mutated.

    With ``with_report`` (the default) the result also holds ``"toolpair"``:
    ``changed`` (bool), ``bad`` (a field held text that is not JSON; it is left
    as it was), ``runs_reordered``, ``runs_in_order``, and ``runs_kept``, a
    count for every reason a run keeps its order. Its shape is the same for
    every record, so it becomes one struct column. ``with_report=False`` gives
    just the record::

        dataset = dataset.map(normalize_record)                 # adds a "toolpair" column
        dataset = dataset.map(normalize_record, fn_kwargs={"with_report": False})

    >>> calls = {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}
    >>> record = {"id": 7, "messages": [calls, {"role": "tool", "tool_call_id": "b"},
    ...                                 {"role": "tool", "tool_call_id": "a"}]}
    >>> out = normalize_record(record)
    >>> [m.get("tool_call_id") for m in out["messages"]], out["id"]
    ([None, 'a', 'b'], 7)
    >>> out["toolpair"]["changed"], out["toolpair"]["runs_reordered"]
    (True, 1)
    """
    fresh = dict(record)
    changed = bad = False
    report = OrderReport()
    for name in _FIELDS:
        value = fresh.get(name)
        if isinstance(value, str | bytes):
            text = value.encode() if isinstance(value, str) else value
            out, result = normalize_line(text, field=name)
            bad = bad or result.kind is LineKind.BAD
            found = result.report
            if out is not text:
                fresh[name] = out.decode() if isinstance(value, str) else out
                changed = True
        else:
            ordered, found = order_record({name: value})
            if ordered[name] is not value:
                fresh[name] = ordered[name]
                changed = True
        report = report.merged(found)
    if with_report:
        fresh[REPORT_KEY] = {
            "changed": changed,
            "bad": bad,
            "runs_reordered": report.reordered,
            "runs_in_order": report.in_order,
            "runs_kept": {reason.value: report.kept.get(reason.value, 0) for reason in KeptReason},
        }
    return fresh
