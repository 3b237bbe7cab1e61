"""The Python API for training pipelines: ``normalize_record`` on plain dicts and through ``Dataset.map``."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from datasets import Dataset

from proxy.normalize import REPORT_KEY, normalize_record
from tests.dataset_records import TOOLS, anthropic, chat, responses

ROOT = Path(__file__).resolve().parent.parent
AB = [("call_a", "A"), ("call_b", "B")]
NO_KEPT = {"missing_id": 0, "non_string_id": 0, "duplicate_id": 0, "unknown_id": 0, "incomplete_run": 0}


def tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def test_one_record_in_each_form_and_what_happened() -> None:
    reversed_chat = {"id": 1, **chat(AB, [("call_b", "20"), ("call_a", "10")])}
    snapshot = copy.deepcopy(reversed_chat)
    out = normalize_record(reversed_chat)
    assert tool_contents(out["messages"]) == ["10", "20"] and out["id"] == 1 and out["tools"] == TOOLS
    assert out[REPORT_KEY] == {
        "changed": True,
        "bad": False,
        "runs_reordered": 1,
        "runs_in_order": 0,
        "runs_kept": NO_KEPT,
    }
    assert reversed_chat == snapshot  # nothing mutated

    kept = normalize_record(anthropic(AB, [("call_b", "2"), ("call_z", "1")]))
    assert kept[REPORT_KEY]["changed"] is False and kept[REPORT_KEY]["runs_kept"]["unknown_id"] == 1

    items = normalize_record(responses(AB, [("call_b", "2"), ("call_a", "1")]), with_report=False)
    assert REPORT_KEY not in items
    assert [i["call_id"] for i in items["input"] if i.get("type") == "function_call_output"] == ["call_a", "call_b"]

    # JSON text stays text; unchanged text is the very same string; text that is not JSON is left and flagged.
    text = json.dumps(chat(AB, [("call_b", "20"), ("call_a", "10")])["messages"])
    fixed = normalize_record({"messages": text})
    assert isinstance(fixed["messages"], str) and tool_contents(json.loads(fixed["messages"])) == ["10", "20"]
    in_order = json.dumps(chat(AB, [("call_a", "1"), ("call_b", "2")])["messages"], indent=2)
    assert normalize_record({"messages": in_order})["messages"] is in_order
    broken = normalize_record({"messages": '[{"tool_call_id": '})
    assert broken["messages"] == '[{"tool_call_id": ' and broken[REPORT_KEY]["bad"] is True


def dataset_rows() -> list[dict[str, Any]]:
    rows = []
    for n in range(8):
        order = [("call_b", f"B{n}"), ("call_a", f"A{n}")] if n % 2 == 0 else [("call_a", f"A{n}"), ("call_b", f"B{n}")]
        rows.append({"id": n, "messages": chat(AB, order)["messages"], "tools": json.dumps(TOOLS)})
    return rows


def test_through_dataset_map_with_a_report_column() -> None:
    dataset = Dataset.from_list(dataset_rows())
    mapped = dataset.map(normalize_record)
    assert mapped.column_names == ["id", "messages", "tools", REPORT_KEY]
    assert mapped.features["messages"] == dataset.features["messages"]  # no field added to the messages
    for row in mapped:
        assert tool_contents(row["messages"]) == [f"A{row['id']}", f"B{row['id']}"]
        assert row[REPORT_KEY]["changed"] is (row["id"] % 2 == 0)
        assert row[REPORT_KEY]["runs_reordered"] + row[REPORT_KEY]["runs_in_order"] == 1
    assert sum(mapped[REPORT_KEY][i]["changed"] for i in range(8)) == 4
    assert mapped.filter(lambda row: row[REPORT_KEY]["changed"]).num_rows == 4


def test_through_dataset_map_without_a_report_keeps_the_features_and_other_columns() -> None:
    dataset = Dataset.from_list(dataset_rows())
    mapped = dataset.map(normalize_record, fn_kwargs={"with_report": False})
    assert mapped.features == dataset.features
    for old, new in zip(dataset, mapped, strict=True):
        assert (new["id"], new["tools"]) == (old["id"], old["tools"])
        assert sorted(map(orjson.dumps, new["messages"])) == sorted(map(orjson.dumps, old["messages"]))
        assert (new == old) is (old["id"] % 2 == 1)


def test_through_dataset_map_on_a_json_text_column_in_worker_processes() -> None:
    rows = [{**row, "messages": json.dumps(row["messages"])} for row in dataset_rows()]
    mapped = Dataset.from_list(rows).map(normalize_record, num_proc=2)
    for old, new in zip(rows, mapped, strict=True):
        assert tool_contents(json.loads(new["messages"])) == [f"A{old['id']}", f"B{old['id']}"]
        assert (new["messages"] == old["messages"]) is (old["id"] % 2 == 1)


def test_normalize_starts_without_loading_the_http_server(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(orjson.dumps(chat(AB, [("call_b", "2"), ("call_a", "1")])) + b"\n")
    script = (
        "import sys\n"
        "from proxy.__main__ import main\n"
        f"code = main(['normalize', {str(source)!r}, '--check'])\n"
        "print(sorted(m for m in ('aiohttp', 'yaml', 'jinja2', 'proxy.cli', 'multiprocessing') if m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr  # the record would change
    assert done.stdout.strip() == b"[]"
