"""``toolpair normalize`` on Parquet files written by ``datasets`` and ``pyarrow``, through the real command."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.normalize import parquet
from tests.dataset_records import TOOLS, anthropic, chat, responses, sharegpt
from tests.support import memory

ROOT = Path(__file__).resolve().parent.parent
AB = [("call_a", "A"), ("call_b", "B")]
ABC = [("call_a", "A"), ("call_b", "B"), ("call_c", "C")]


def toolpair(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "proxy", "normalize", *map(str, args)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120, check=False)


def tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def chat_rows() -> list[dict[str, Any]]:
    """A chat-format tool-calling dataset: rows to fix, rows in order, plain turns, a kept run."""
    rows = []
    for n in range(12):
        if n % 4 == 0:  # results arrived reversed
            record = chat(AB, [("call_b", f"B{n}"), ("call_a", f"A{n}")])
        elif n % 4 == 1:  # three calls, already in order
            record = chat(ABC, [("call_a", f"A{n}"), ("call_b", f"B{n}"), ("call_c", f"C{n}")])
        elif n % 4 == 2:  # a plain exchange: no tool fields at all
            record = {"messages": [{"role": "user", "content": f"hi {n}"}, {"role": "assistant", "content": "hello"}]}
        else:  # a duplicate ID: kept as it came
            record = chat(AB, [("call_b", f"B{n}"), ("call_b", f"b{n}")])
        row = {"id": n, "source": "synthetic", "messages": record["messages"], "tools": json.dumps(TOOLS)}
        rows.append({**row, "score": n / 10})
    return rows


def test_a_datasets_parquet_file_round_trips_with_its_features(tmp_path: Path) -> None:
    rows = chat_rows()
    written = Dataset.from_list(rows)
    source, out, report = tmp_path / "train.parquet", tmp_path / "fixed.parquet", tmp_path / "report.json"
    written.to_parquet(str(source))

    done = toolpair(source, "-o", out, "--report", report)
    assert done.returncode == 0, done.stderr
    summary = json.loads(report.read_text())
    assert summary["format"] == "parquet" and summary["columns"] == ["messages"]
    assert (summary["rows"], summary["records_read"], summary["records_changed"]) == (12, 12, 3)
    assert (summary["runs_reordered"], summary["runs_in_order"], summary["runs_kept"]) == (3, 3, {"duplicate_id": 3})
    assert summary["changed_row_indices"] == [0, 4, 8]

    before, after = Dataset.from_parquet(str(source)), Dataset.from_parquet(str(out))
    assert after.features == before.features == written.features
    assert after.num_rows == before.num_rows
    # The schema, its metadata included, is the input's: no field added to any struct.
    assert pq.read_schema(out).equals(pq.read_schema(source), check_metadata=True)
    for row, (old, new) in enumerate(zip(before, after, strict=True)):
        for other in ("id", "source", "tools", "score"):
            assert new[other] == old[other]
        if row % 4 == 0:
            assert tool_contents(new["messages"]) == [f"A{row}", f"B{row}"]
            assert [m["tool_call_id"] for m in new["messages"] if m["role"] == "tool"] == ["call_a", "call_b"]
            # The same messages, every field as it was (nulls included), in another order.
            assert sorted(map(orjson.dumps, new["messages"])) == sorted(map(orjson.dumps, old["messages"]))
        else:
            assert new == old
    # "Unchanged" for a nested column: each message keeps exactly the fields the input had,
    # the ones Arrow filled with null for a plain turn staying null, not becoming values.
    plain = after[2]["messages"][0]
    assert plain["tool_calls"] is None and plain["tool_call_id"] is None and plain["content"] == "hi 2"

    assert toolpair(out, "--check").returncode == 0
    renamed = tmp_path / "train.bin"  # told by its magic bytes, not its name
    renamed.write_bytes(source.read_bytes())
    checked = toolpair(renamed, "--check")
    assert checked.returncode == 1 and b"3 of 12 records would change (rows 0, 4, 8)" in checked.stderr


def test_unchanged_rows_are_the_inputs_values_at_the_arrow_level(tmp_path: Path) -> None:
    source, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(chat_rows()), source, row_group_size=5)
    assert toolpair(source, "-o", out).returncode == 0
    old, new = pq.read_table(source), pq.read_table(out)
    assert pq.ParquetFile(out).metadata.num_row_groups == pq.ParquetFile(source).metadata.num_row_groups == 3
    assert new.schema.equals(old.schema, check_metadata=True)
    for name in ("id", "source", "tools", "score"):
        assert new.column(name).equals(old.column(name))
    for row in range(old.num_rows):
        same = new.column("messages")[row].equals(old.column("messages")[row])
        assert same is (row % 4 != 0), row


def test_json_text_columns_keep_their_exact_text_unless_they_move(tmp_path: Path) -> None:
    cells = [
        orjson.dumps(chat(AB, [("call_b", "20"), ("call_a", "10")])["messages"]).decode(),  # 0 changes
        json.dumps(anthropic(ABC, [("call_c", "3"), ("call_a", "1"), ("call_b", "2")])["messages"]),  # 1 changes
        json.dumps(chat(AB, [("call_a", "1"), ("call_b", "2")])["messages"], indent=1),  # 2 in order, spaced
        None,  # 3 no conversation
        '[{"role": "tool", "tool_call_id": ',  # 4 not JSON
        json.dumps(sharegpt()["conversations"]),  # 5 no IDs: not even parsed
    ]
    table = pa.table({"messages": pa.array(cells, pa.large_string()), "row": list(range(6))})
    source, out, report = tmp_path / "text.pq", tmp_path / "out.pq", tmp_path / "r.json"
    pq.write_table(table, source, row_group_size=2, compression="zstd")

    done = toolpair(source, "-o", out, "--report", report)
    assert done.returncode == 0, done.stderr
    assert b"1 bad row(s) copied through unchanged (first at row 4)" in done.stderr
    result = pq.read_table(out)
    assert result.schema.equals(table.schema) and result.column("row").to_pylist() == list(range(6))
    assert pq.ParquetFile(out).metadata.row_group(0).column(0).compression == "ZSTD"
    fixed = result.column("messages").to_pylist()
    assert [fixed[i] == cells[i] for i in range(6)] == [False, False, True, True, True, True]
    assert tool_contents(json.loads(fixed[0])) == ["10", "20"]
    blocks = json.loads(fixed[1])[2]["content"]
    assert [b["tool_use_id"] for b in blocks] == ["call_a", "call_b", "call_c"]
    summary = json.loads(report.read_text())
    assert (summary["rows"], summary["records_read"], summary["blank_rows"], summary["bad_rows"]) == (6, 4, 1, 1)
    assert summary["changed_row_indices"] == [0, 1] and summary["bad_row_indices"] == [4]


def test_nested_anthropic_and_responses_columns_together(tmp_path: Path) -> None:
    def all_lists(record: dict[str, Any]) -> list[dict[str, Any]]:
        # Arrow needs one type per field: Anthropic content as a list of blocks throughout.
        def blocks(content: Any) -> list[dict[str, Any]]:
            return content if isinstance(content, list) else [{"type": "text", "text": content}]

        return [{**m, "content": blocks(m["content"])} for m in record["messages"]]

    rows = [
        {
            "messages": all_lists(anthropic(AB, [("call_b", "2"), ("call_a", "1")])),
            "input": responses(ABC, [("call_b", "2"), ("call_c", "3"), ("call_a", "1")])["input"],
        },
        {
            "messages": all_lists(anthropic(AB, [("call_a", "1"), ("call_b", "2")])),
            "input": responses(AB, [("call_a", "1"), ("call_b", "2")])["input"],
        },
    ]
    source, out, report = tmp_path / "both.parquet", tmp_path / "out.parquet", tmp_path / "r.json"
    pq.write_table(pa.Table.from_pylist(rows), source)
    assert toolpair(source, "-o", out, "--report", report).returncode == 0
    fixed = pq.read_table(out).to_pylist()
    assert [b["tool_use_id"] for b in fixed[0]["messages"][2]["content"]] == ["call_a", "call_b"]
    assert [i["call_id"] for i in fixed[0]["input"] if i["type"] == "function_call_output"] == [
        "call_a",
        "call_b",
        "call_c",
    ]
    assert fixed[1] == pq.read_table(source).to_pylist()[1]
    summary = json.loads(report.read_text())
    assert summary["columns"] == ["messages", "input"]
    assert (summary["records_changed"], summary["runs_reordered"], summary["runs_in_order"]) == (1, 2, 2)


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda p: p.write_bytes(b'{"messages": []}\n'), ["-o", "out.parquet"], b"is not a Parquet file"),
        (lambda p: pq.write_table(pa.table({"text": ["hi"]}), p), ["-o", "out.parquet"], b"no 'messages' or 'input'"),
        (lambda p: pq.write_table(pa.table({"messages": [1]}), p), ["--check"], b"'messages' of"),
        (lambda p: pq.write_table(pa.table({"messages": ["[]"]}), p), [], b"Parquet output needs a file"),
        (lambda p: None, ["--check"], b"cannot read"),
    ],
    ids=["not-parquet", "no-column", "wrong-type", "no-output", "missing"],
)
def test_parquet_problems_exit_2_with_a_message(tmp_path: Path, make: Any, args: list[str], message: bytes) -> None:
    source = tmp_path / "in.parquet"
    make(source)
    before = sorted(p.name for p in tmp_path.iterdir())
    command = [sys.executable, "-m", "proxy", "normalize", str(source), *args]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=60, check=False, env=_env())
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and b"Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temporary file


def test_parquet_from_stdin_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "normalize", "-", "--format", "parquet", "--check"],
        cwd=ROOT,
        input=b"PAR1",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and b"not stdin" in done.stderr


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_memory_holds_one_row_group_not_the_file(tmp_path: Path) -> None:
    cell = json.dumps(chat(AB, [("call_b", "x" * 400), ("call_a", "y" * 400)])["messages"])
    group = pa.table({"messages": [cell] * 4000, "n": list(range(4000))})  # about 5 MB a row group

    def peak_rss_kb(groups: int) -> int:
        path = tmp_path / f"in{groups}.parquet"
        with pq.ParquetWriter(path, group.schema) as writer:
            for _ in range(groups):
                writer.write_table(group)
        call = f"main([{str(path)!r}, '-o', {str(tmp_path / f'out{groups}.parquet')!r}])"
        return memory.peak_rss_kb("from proxy.normalize.cli import main", call, timeout=300)

    # Measured: about 25 MB more for 24 row groups than for 2, and no more for 48 (the
    # allocator's pools fill once); a run that held the file would grow by over 110 MB.
    growth_mb = (peak_rss_kb(24) - peak_rss_kb(2)) / 1024
    assert pq.ParquetFile(tmp_path / "out24.parquet").metadata.num_rows == 24 * 4000
    assert growth_mb < 60, f"peak memory grew by {growth_mb:.0f} MB for 22 more row groups (about 110 MB of cells)"


def test_without_pyarrow_parquet_is_a_clear_error(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"messages": ["[]"]}), source)
    script = (
        "import sys\n"
        "sys.modules['pyarrow'] = sys.modules['pyarrow.parquet'] = None  # as if the extra were not installed\n"
        "from proxy.normalize.cli import main\n"
        f"sys.exit(main([{str(source)!r}, '--check']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert b"pip install 'toolpair[parquet]'" in done.stderr and b"Traceback" not in done.stderr


# --- the nested fast way decides and writes exactly as the general way ------------

_ID = st.sampled_from(["a", "b", "c", "a", "b", "c", "", None])


def _message(role: str, **fields: Any) -> dict[str, Any]:
    return {"role": role, "content": None, "tool_calls": None, "tool_call_id": None, **fields}


@st.composite
def _chat_row(draw: st.DrawFn) -> list[Any]:
    """Rounds of calls and results (often a run, in or out of order), with other turns and nulls between."""
    row: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["round", "round", "results", "other", "null"]))
        if kind == "round":
            ids = draw(st.lists(_ID, min_size=1, max_size=3))
            calls = [None if draw(st.integers(0, 9)) == 0 else {"id": i, "type": "function"} for i in ids]
            row.append(_message("assistant", tool_calls=calls))
            row.extend(_message("tool", tool_call_id=i) for i in draw(st.permutations(ids)))
        elif kind == "results":
            row.extend(_message("tool", tool_call_id=i, content="r") for i in draw(st.lists(_ID, max_size=2)))
        elif kind == "other":
            row.append(_message(draw(st.sampled_from(["user", "system", "assistant"])), content="x"))
        else:
            row.append(None)
    return row


@st.composite
def _anthropic_row(draw: st.DrawFn) -> list[Any]:
    row: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["round", "round", "other", "null"]))
        if kind == "round":
            ids = draw(st.lists(_ID, min_size=1, max_size=3))
            uses = [{"type": "tool_use", "id": i, "tool_use_id": None} for i in ids]
            row.append({"role": "assistant", "content": uses})
            results = [{"type": "tool_result", "id": None, "tool_use_id": i} for i in draw(st.permutations(ids))]
            if draw(st.booleans()):
                results.insert(0, {"type": "text", "id": None, "tool_use_id": None})
            row.append({"role": "user", "content": results})
        elif kind == "other":
            row.append({"role": draw(st.sampled_from(["user", "assistant"])), "content": None})
        else:
            row.append(None)
    return row


@st.composite
def _input_row(draw: st.DrawFn) -> list[Any]:
    row: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["round", "round", "other", "null"]))
        if kind == "round":
            ids = draw(st.lists(_ID, min_size=1, max_size=3))
            row.extend({"type": "function_call", "call_id": i} for i in ids)
            output = draw(st.sampled_from(["function_call_output", "custom_tool_call_output"]))
            row.extend({"type": output, "call_id": i} for i in draw(st.permutations(ids)))
        elif kind == "other":
            row.append({"type": draw(st.sampled_from(["message", None])), "call_id": None})
        else:
            row.append(None)
    return row


_CHAT_TYPE = pa.list_(
    pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(pa.struct([("id", pa.string()), ("type", pa.string())]))),
            ("tool_call_id", pa.string()),
        ]
    )
)
_ANTHROPIC_TYPE = pa.large_list(
    pa.struct(
        [
            ("role", pa.string()),
            (
                "content",
                pa.list_(pa.struct([("type", pa.string()), ("id", pa.string()), ("tool_use_id", pa.string())])),
            ),
        ]
    )
)
_INPUT_TYPE = pa.list_(pa.struct([("type", pa.large_string()), ("call_id", pa.string())]))
_FORMS = {
    "chat": ("messages", _chat_row(), _CHAT_TYPE),
    "anthropic": ("messages", _anthropic_row(), _ANTHROPIC_TYPE),
    "responses": ("input", _input_row(), _INPUT_TYPE),
}


@settings(max_examples=120, deadline=None)
@given(
    form=st.sampled_from(sorted(_FORMS)),
    data=st.data(),
    chunks=st.integers(1, 3),
)
def test_the_nested_fast_way_matches_the_general_way(form: str, data: st.DataObject, chunks: int) -> None:
    name, element, kind = _FORMS[form]
    rows = data.draw(st.lists(st.one_of(st.none(), element), min_size=1, max_size=12))
    array = pa.array(rows, type=kind)
    cut = sorted({0, len(rows), *data.draw(st.lists(st.integers(0, len(rows)), max_size=chunks - 1))})
    column = pa.chunked_array([array.slice(a, b - a) for a, b in itertools.pairwise(cut)] or [array], type=kind)
    fast_column, fast_results = parquet._normalize_column(name, "nested", column, False)
    slow_column, slow_results = parquet._normalize_rows(name, "nested", column, False)
    assert fast_column.type == slow_column.type == kind
    assert fast_column.to_pylist() == slow_column.to_pylist()
    assert fast_results == slow_results


def test_the_fast_way_rebuilds_a_reordered_chat_column_in_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [chat(AB, [("call_b", "B"), ("call_a", "A")])["messages"], None, [{"role": "user", "content": "hi"}]]
    column = pa.chunked_array([pa.array(rows)])
    monkeypatch.setattr(parquet, "_with_rows_replaced", None)  # the general rebuild must not run
    fresh, results = parquet._normalize_column("messages", "nested", column, False)
    assert tool_contents(fresh.to_pylist()[0]) == ["A", "B"]
    assert [(r.kind.value, r.changed, r.report.reordered) for r in results] == [
        ("record", True, 1),
        ("blank", False, 0),
        ("record", False, 0),
    ]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_changed_text_cells_are_built_as_pyarrow_would(kind: pa.DataType) -> None:
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    values: list[Any] = ["[]", "", '["é 🙂"]'] if text else [b"[]", b"", "é 🙂".encode()]
    built = parquet._texts(values, kind)
    assert built.type == kind and built.equals(pa.array(values, type=kind))


def test_workers_normalize_row_groups_in_parallel_and_write_the_same_file(tmp_path: Path) -> None:
    rows = chat_rows() * 25  # 300 rows in row groups of 40: eight groups, the last one short
    source = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source, row_group_size=40)
    runs = {}
    for workers in ("1", "2"):
        out, report = tmp_path / f"out{workers}.parquet", tmp_path / f"report{workers}.json"
        done = toolpair(source, "-o", out, "--report", report, "--workers", workers)
        assert done.returncode == 0, done.stderr
        runs[workers] = (pq.read_table(out), json.loads(report.read_text()), pq.ParquetFile(out).metadata)
    one, two = runs["1"], runs["2"]
    assert two[0].equals(one[0]) and two[1] == one[1]
    assert two[2].num_row_groups == one[2].num_row_groups == 8
    assert one[1]["records_changed"] == 75 and one[1]["changed_row_indices"][:3] == [0, 4, 8]
    assert one[1]["changed_row_indices"][-1] == 296  # row numbers run on across row groups
    checked = toolpair(source, "--check", "--workers", "2")
    assert checked.returncode == 1 and b"75 of 300 records would change" in checked.stderr


def test_a_parquet_worker_refuses_a_file_that_was_replaced(tmp_path: Path) -> None:
    source = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(chat_rows()), source)
    info = source.stat()
    kinds: dict[str, Any] = {"messages": "nested"}
    table, tally = parquet._row_group_in_worker(str(source), info.st_dev, info.st_ino, 0, 0, kinds, False)
    assert table.num_rows == tally.lines == 12
    other = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist(chat_rows()), other)
    with pytest.raises(parquet.NormalizeFailed, match="replaced"):
        parquet._row_group_in_worker(str(other), info.st_dev, info.st_ino, 0, 0, kinds, False)
