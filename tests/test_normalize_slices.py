"""How a plain JSONL file is cut for workers, and how their results are put back together.

The process that coordinates workers plans slices by reading only a small
window at each cut, hands each worker an offset and a length, and numbers lines
only as results come back in order. These tests pin the cutting (every slice
whole lines, the file covered once), the renumbering, and both ways a pool can
start (fork when no other thread runs, spawn otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.normalize import jsonl, pool
from proxy.normalize.cli import NormalizeJob, run_normalize
from proxy.normalize.core import NormalizeTally
from proxy.normalize.files import NormalizeFailed
from tests.dataset_records import chat, sharegpt

ROOT = Path(__file__).resolve().parent.parent
AB = [("call_a", "A"), ("call_b", "B")]


def _slices_of(tmp_path: Path, data: bytes, block_size: int) -> list[tuple[int, int]]:
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    fd = os.open(source, os.O_RDONLY)
    try:
        return list(jsonl.plan_slices(fd, len(data), block_size))
    finally:
        os.close(fd)


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    final_newline=st.booleans(),
    block_size=st.integers(1, 120),
    probe=st.sampled_from([1, 3, 64 << 10]),
)
def test_slices_are_whole_lines_covering_the_file_once(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], final_newline: bool, block_size: int, probe: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    original = jsonl.PROBE_SIZE
    jsonl.PROBE_SIZE = probe  # a small window: lines longer than it are followed across reads
    try:
        slices = _slices_of(tmp_path_factory.mktemp("s"), data, block_size)
    finally:
        jsonl.PROBE_SIZE = original
    position = 0
    for offset, length in slices:
        assert offset == position and length > 0
        piece = data[offset : offset + length]
        assert piece.endswith(b"\n") or offset + length == len(data)
        # A slice ends at the first line end at or after block_size bytes, never sooner.
        assert length >= block_size or offset + length == len(data)
        assert b"\n" not in piece[block_size - 1 : -1]
        position += length
    assert position == len(data)


def test_renumber_shifts_only_the_line_numbers() -> None:
    tally = NormalizeTally(lines=5, changed=2, bad=1, changed_lines=[1, 4], bad_lines=[2])
    tally.renumber(100)
    assert (tally.changed_lines, tally.bad_lines, tally.lines) == ([101, 104], [102], 5)


def _dataset(tmp_path: Path) -> Path:
    reversed_pair = orjson.dumps(chat(AB, [("call_b", "B"), ("call_a", "A")]))
    rows = [reversed_pair if n % 3 == 0 else orjson.dumps(sharegpt(f"turn {n}")) for n in range(600)]
    rows[250] = b'{"messages": [{"role": "tool", "tool_call_id": "x"'  # bad, with a marker
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(rows) + b"\n")
    return source


def _run(tmp_path: Path, source: Path, workers: int, tag: str) -> tuple[bytes, dict[str, object]]:
    out, report = tmp_path / f"out-{tag}.jsonl", tmp_path / f"report-{tag}.json"
    job = NormalizeJob(str(source), str(out), report=str(report), workers=workers, block_size=997)
    with open(os.devnull, "w") as quiet:
        run_normalize(job, stderr=quiet)
    return out.read_bytes(), json.loads(report.read_text())


def test_a_pool_forks_when_alone_and_spawns_beside_another_thread(tmp_path: Path) -> None:
    source = _dataset(tmp_path)
    alone = _run(tmp_path, source, 1, "one")
    assert alone[1]["bad_line_numbers"] == [251] and alone[1]["changed_line_numbers"][:2] == [1, 4]

    # The command runs no other thread: its pool forks. (This test process may hold threads
    # that earlier tests left behind, so the forking run is the real command's.)
    method = subprocess.run(
        [sys.executable, "-c", "from proxy.normalize import pool; print(pool.pool_context().get_start_method())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert method.stdout.strip() == "fork"
    out, report = tmp_path / "out-fork.jsonl", tmp_path / "report-fork.json"
    command = [sys.executable, "-m", "proxy", "normalize", str(source), "-o", str(out), "--report", str(report)]
    subprocess.run([*command, "--workers", "2"], cwd=ROOT, capture_output=True, check=True)
    forked = json.loads(report.read_text())
    assert out.read_bytes() == alone[0]
    assert {key: forked[key] for key in alone[1]} == alone[1]

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert pool.pool_context().get_start_method() == "spawn"
        assert _run(tmp_path, source, 2, "spawn") == alone
    finally:
        release.set()
        other.join()


def test_check_with_workers_reads_no_slice_in_the_coordinating_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _dataset(tmp_path)
    read_here: list[int] = []
    real_read = jsonl.read_slice

    def counting(fd: int, offset: int, length: int, name: str) -> bytes:
        read_here.append(length)  # only this process: forked workers count in their own copy
        return real_read(fd, offset, length, name)

    monkeypatch.setattr(jsonl, "read_slice", counting)
    job = NormalizeJob(str(source), check=True, workers=2, block_size=997)
    with open(os.devnull, "w") as quiet:
        assert run_normalize(job, stderr=quiet) == 1
    assert read_here == []
    out = tmp_path / "written.jsonl"
    with open(os.devnull, "w") as quiet:
        run_normalize(NormalizeJob(str(source), str(out), workers=2, block_size=997), stderr=quiet)
    assert sum(read_here) == source.stat().st_size  # writing reads each slice once, to copy it out


def test_a_worker_that_dies_is_one_clear_failure() -> None:
    with pytest.raises(NormalizeFailed, match="a worker process died; try fewer --workers"):  # noqa: SIM117
        with pool.worker_pool(1) as workers:
            workers.submit(os._exit, 3).result()


def test_a_slice_where_most_lines_moved_comes_back_whole_and_lands_in_place(tmp_path: Path) -> None:
    """Past ``JOIN_EDITS`` moved lines a worker sends its slice as one edit; file and stdin give the same."""
    reversed_pair = orjson.dumps(chat(AB, [("call_b", "B"), ("call_a", "A")]))
    rows = [reversed_pair if n % 5 else orjson.dumps(sharegpt(f"turn {n}")) for n in range(400)]
    rows[7] = b'{"messages": [{"role": "tool", "tool_call_id": "x"'  # bad, with a marker
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(rows))  # no final newline
    block = 40 * len(reversed_pair)  # about 40 lines a slice, more than JOIN_EDITS of them moved
    assert block // len(reversed_pair) > jsonl.JOIN_EDITS
    outputs = []
    for workers in (1, 2):
        out, report = tmp_path / f"out-{workers}.jsonl", tmp_path / f"report-{workers}.json"
        with open(os.devnull, "w") as quiet:
            run_normalize(
                NormalizeJob(str(source), str(out), report=str(report), workers=workers, block_size=block),
                stderr=quiet,
            )
        outputs.append((out.read_bytes(), json.loads(report.read_text())))
    with open(source, "rb") as stdin, open(os.devnull, "w") as quiet:
        piped = tmp_path / "out-stdin.jsonl"
        run_normalize(NormalizeJob("-", str(piped), workers=2, block_size=block), stdin=stdin, stderr=quiet)
    (one, one_report), (two, two_report) = outputs
    assert one == two == piped.read_bytes() and one_report == two_report
    assert one_report["records_changed"] == 319 and one_report["bad_line_numbers"] == [8]
    expected = orjson.dumps(chat(AB, [("call_a", "A"), ("call_b", "B")]))
    assert one.split(b"\n")[1] == expected and not one.endswith(b"\n")
