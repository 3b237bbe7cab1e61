"""``toolpair normalize`` on real files, through the real command (``python -m proxy normalize``)."""

from __future__ import annotations

import gzip
import json
import os
import pty
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.normalize import normalize_line
from proxy.normalize.cli import NormalizeFailed, NormalizeJob, run_normalize
from proxy.normalize.jsonl import _FileSlice, _slice_edits
from tests.dataset_records import anthropic, chat, jsonl, responses, sharegpt
from tests.real_engine import TEMPLATE, RealEngine
from tests.support import memory

ROOT = Path(__file__).resolve().parent.parent
AB = [("call_a", "A"), ("call_b", "B")]
ABC = [("call_a", "A"), ("call_b", "B"), ("call_c", "C")]


def toolpair(*args: str | Path, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "proxy", "normalize", *map(str, args)]
    return subprocess.run(command, cwd=ROOT, input=stdin, capture_output=True, timeout=timeout, check=False)


def lines_of(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def tool_contents(line: bytes) -> list[str]:
    return [m["content"] for m in orjson.loads(line)["messages"] if m["role"] == "tool"]


# A file with every kind of line: records to fix in each form, records already in
# order, a record without IDs, blank and whitespace lines, bad lines with and
# without an ID marker, a CRLF line, and a last line without its newline.
MIXED_LINES = [
    orjson.dumps(chat(AB, [("call_b", "20"), ("call_a", "10")])),  # 1 changes
    orjson.dumps(sharegpt()),  # 2
    b"",  # 3 blank
    b'{"messages": [{"role": "tool", "tool_call_id": "x"',  # 4 bad, has a marker
    orjson.dumps(anthropic(ABC, [("call_a", "1"), ("call_b", "2"), ("call_c", "3")])),  # 5 in order
    b"   ",  # 6 blank
    json.dumps(responses(ABC, [("call_c", "3"), ("call_a", "1"), ("call_b", "2")])).encode() + b"\r",  # 7 changes
    b"this line is not json and names no id",  # 8 not parsed: no marker
    orjson.dumps(chat(AB, [("call_b", "1"), ("call_b", "2")])),  # 9 kept: duplicate_id
    orjson.dumps(anthropic(AB, [("call_b", "2"), ("call_a", "1")])),  # 10 changes, no final newline
]
MIXED = b"\n".join(MIXED_LINES)
MIXED_REPORT = {
    "check": False,
    "lines": 10,
    "records_read": 7,
    "records_changed": 3,
    "blank_lines": 2,
    "runs_reordered": 3,
    "runs_in_order": 1,
    "runs_kept": {"duplicate_id": 1},
    "bad_lines": 1,
    "bad_line_numbers": [4],
    "bad_line_numbers_truncated": False,
    "changed_line_numbers": [1, 7, 10],
    "changed_line_numbers_truncated": False,
}


def check_mixed_output(out: bytes) -> None:
    before, after = lines_of(MIXED), lines_of(out)
    assert len(after) == len(before) == 10 and not out.endswith(b"\n")
    for number, (old, new) in enumerate(zip(before, after, strict=True), 1):
        if number in (1, 7, 10):
            assert new != old and json.loads(new) != json.loads(old)
        else:
            assert new == old, number
    assert tool_contents(after[0]) == ["10", "20"]
    assert after[6].endswith(b"\r")
    assert [i["call_id"] for i in json.loads(after[6])["input"][4:]] == ["call_a", "call_b", "call_c"]
    assert [b["tool_use_id"] for b in json.loads(after[9])["messages"][2]["content"]] == ["call_a", "call_b"]


def test_mixed_file_with_bad_and_blank_lines(tmp_path: Path) -> None:
    source, out, report = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "report.json"
    source.write_bytes(MIXED)
    done = toolpair(source, "-o", out, "--report", report)
    assert done.returncode == 0, done.stderr
    check_mixed_output(out.read_bytes())
    assert json.loads(report.read_text()) == {"input": str(source), **MIXED_REPORT}
    assert done.stdout == b""
    assert b"1 bad line(s) copied through unchanged (first at line 4)" in done.stderr
    assert b"Traceback" not in done.stderr


def test_validate_also_counts_bad_lines_without_id_markers(tmp_path: Path) -> None:
    source, out, report = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "report.json"
    source.write_bytes(MIXED)
    assert toolpair(source, "-o", out, "--report", report, "--validate").returncode == 0
    check_mixed_output(out.read_bytes())
    summary = json.loads(report.read_text())
    assert (summary["bad_lines"], summary["bad_line_numbers"], summary["records_read"]) == (2, [4, 8], 6)


def test_gzip_round_trip(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl.gz").write_bytes(gzip.compress(MIXED))
    assert toolpair(tmp_path / "in.jsonl.gz", "-o", tmp_path / "out.jsonl.gz").returncode == 0
    compressed = (tmp_path / "out.jsonl.gz").read_bytes()
    assert compressed[:2] == b"\x1f\x8b"
    check_mixed_output(gzip.decompress(compressed))
    # gzip in, plain out; plain in, gzip out: the same lines.
    assert toolpair(tmp_path / "in.jsonl.gz", "-o", tmp_path / "plain.jsonl").returncode == 0
    assert (tmp_path / "plain.jsonl").read_bytes() == gzip.decompress(compressed)
    assert toolpair(tmp_path / "plain.jsonl", "-o", tmp_path / "again.jsonl.gz").returncode == 0
    assert gzip.decompress((tmp_path / "again.jsonl.gz").read_bytes()) == gzip.decompress(compressed)


def test_stdin_to_stdout_plain_and_gzip() -> None:
    plain = toolpair("-", stdin=MIXED)
    assert plain.returncode == 0
    check_mixed_output(plain.stdout)
    assert toolpair("-", stdin=gzip.compress(MIXED)).stdout == plain.stdout


def test_check_exit_codes_and_nothing_written(tmp_path: Path) -> None:
    source, fixed, report = tmp_path / "in.jsonl", tmp_path / "fixed.jsonl", tmp_path / "report.json"
    source.write_bytes(MIXED)
    before = sorted(tmp_path.iterdir())
    failed = toolpair(source, "--check")
    assert failed.returncode == 1 and failed.stdout == b""
    assert b"3 of 7 records would change (lines 1, 7, 10)" in failed.stderr
    assert sorted(tmp_path.iterdir()) == before

    assert toolpair(source, "-o", fixed).returncode == 0
    passed = toolpair(fixed, "--check", "--report", report)
    assert passed.returncode == 0 and passed.stdout == b""
    summary = json.loads(report.read_text())
    assert summary["check"] is True and summary["records_changed"] == 0 and summary["runs_in_order"] == 4

    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(jsonl([sharegpt(), chat(AB, [("call_a", "1"), ("call_b", "2")])]))
    assert toolpair(clean, "--check").returncode == 0
    assert toolpair("-", "--check", stdin=MIXED).returncode == 1


def test_b20_a10_and_a20_b10_give_distinct_model_inputs_after_normalizing(
    tmp_path: Path, real_engine: RealEngine
) -> None:
    """The issue's pair, rendered with the engine's own template code and tokenized by the real model.

    A pipeline that drops ``tool_call_id`` renders results by position, so before
    normalizing the two records become the same input IDs; afterwards they differ,
    while a record that differs from "B->20, A->10" only in arrival order becomes
    the very same line.
    """
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    config = json.loads(TEMPLATE.read_text())
    render = Jinja2ChatFormatter(config["chat_template"], config["eos_token"], config["bos_token"], False)

    def input_ids(line: bytes) -> list[int]:
        record = orjson.loads(line)
        for message in record["messages"]:
            message.pop("tool_call_id", None)  # what the lossy pipeline does
        prompt = render(messages=record["messages"], tools=record["tools"]).prompt
        request = urllib.request.Request(
            real_engine.url + "/extras/tokenize",
            data=json.dumps({"input": prompt}).encode(),
            headers={"Authorization": f"Bearer {real_engine.api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            tokens: list[int] = json.load(response)["tokens"]
        return tokens

    records = [
        chat(AB, [("call_b", "20"), ("call_a", "10")]),  # B->20, A->10, B's result arrived first
        chat(AB, [("call_a", "20"), ("call_b", "10")]),  # A->20, B->10
        chat(AB, [("call_a", "10"), ("call_b", "20")]),  # B->20, A->10, in call order
    ]
    source, out = tmp_path / "traces.jsonl", tmp_path / "fixed.jsonl"
    source.write_bytes(jsonl(records))
    raw = lines_of(source.read_bytes())
    assert input_ids(raw[0]) == input_ids(raw[1])  # the bug: two meanings, one training input

    assert toolpair(source, "-o", out).returncode == 0
    fixed = lines_of(out.read_bytes())
    assert input_ids(fixed[0]) != input_ids(fixed[1])
    assert fixed[0] == fixed[2] == raw[2]
    assert tool_contents(fixed[0]) == ["10", "20"] and tool_contents(fixed[1]) == ["20", "10"]


def test_workers_write_the_same_bytes_as_one(tmp_path: Path) -> None:
    # Over 4 MiB per task: several tasks in flight, results spliced back in order.
    variety = [orjson.dumps(chat(AB, [(f"call_{c}", f"{c}-{n}") for c in "ba"])) for n in range(40)]
    variety += [*MIXED_LINES[:-1], orjson.dumps(sharegpt("x" * 3000))]
    body = b"\n".join(variety * 300)
    assert len(body) > 9 * (1 << 20)
    source = tmp_path / "big.jsonl"
    source.write_bytes(body + b"\n" + MIXED_LINES[-1])
    runs = {}
    for workers in ("1", "3"):
        out, report = tmp_path / f"out{workers}.jsonl", tmp_path / f"report{workers}.json"
        done = toolpair(source, "-o", out, "--report", report, "--workers", workers)
        assert done.returncode == 0, done.stderr
        runs[workers] = (out.read_bytes(), json.loads(report.read_text()))
    assert runs["1"] == runs["3"]
    assert runs["1"][1]["records_changed"] == 300 * 42 + 1  # 40 + lines 1 and 7 of MIXED, then its line 10


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz"])  # workers read a plain file themselves
def test_workers_in_process_with_tiny_blocks_match_one_worker(tmp_path: Path, name: str) -> None:
    source = tmp_path / name
    data = MIXED * 20
    source.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    results = []
    for workers in (1, 3):
        out, report = tmp_path / f"o{workers}.jsonl", tmp_path / f"r{workers}.json"
        job = NormalizeJob(str(source), str(out), report=str(report), workers=workers, block_size=700)
        with open(os.devnull, "w") as quiet:
            assert run_normalize(job, stderr=quiet) == 0
        results.append((out.read_bytes(), json.loads(report.read_text())))
    assert results[0] == results[1]
    assert results[0][1]["lines"] == MIXED.count(b"\n") * 20 + 1


def test_a_worker_refuses_a_file_that_changed_under_it(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(MIXED)
    info = source.stat()
    good = _FileSlice(str(source), info.st_dev, info.st_ino, 0, 20)
    assert _slice_edits(good, 1, False)[1].lines == 1
    with pytest.raises(NormalizeFailed, match="shrank"):
        _slice_edits(_FileSlice(str(source), info.st_dev, info.st_ino, len(MIXED) - 5, 10), 1, False)
    other = tmp_path / "other.jsonl"
    other.write_bytes(MIXED)
    with pytest.raises(NormalizeFailed, match="replaced"):
        _slice_edits(_FileSlice(str(other), info.st_dev, info.st_ino, 0, 20), 1, False)


def test_rewriting_a_file_in_place(tmp_path: Path) -> None:
    source = tmp_path / "data.jsonl"
    source.write_bytes(MIXED)
    source.chmod(0o640)
    assert toolpair(source, "-o", source).returncode == 0
    check_mixed_output(source.read_bytes())
    assert source.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["data.jsonl"]  # no temporary file left behind


def _progress_of(args: list[str], stdin: int | None = None) -> str:
    """Run with stderr on a pseudo-terminal and return the last state of the progress line."""
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "proxy", "normalize", *args]
    with subprocess.Popen(command, cwd=ROOT, stdin=stdin, stdout=subprocess.DEVNULL, stderr=follower) as child:
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed: the child is gone
                break
            if not chunk:
                break
            drawn += chunk
        assert child.wait(30) == 0
    os.close(leader)
    frames = re.findall(r"\r([^\r\n]*)\x1b\[K", drawn.decode())
    assert frames, drawn
    return frames[-1]


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes((MIXED + b"\n") * 50)
    last = _progress_of([str(source), "-o", str(tmp_path / "out.jsonl")])
    assert "500 lines" in last and "MB/s" in last and "100%" in last and "ETA 0:00" in last
    with source.open("rb") as redirected:  # `< file`: stdin is the file, so its size is known
        last = _progress_of(["-"], stdin=redirected.fileno())
    assert "500 lines" in last and "ETA 0:00" in last
    # Not a terminal: nothing on stderr but the bad-line notice.
    quiet = toolpair(source, "-o", tmp_path / "out2.jsonl")
    assert quiet.stderr.count(b"\n") == 1 and b"bad line" in quiet.stderr


def test_progress_without_a_known_size_has_no_eta(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes((MIXED + b"\n") * 50)
    feeder = subprocess.Popen(["cat", str(source)], stdout=subprocess.PIPE)
    assert feeder.stdout is not None
    last = _progress_of(["-"], stdin=feeder.stdout.fileno())
    feeder.stdout.close()
    feeder.wait()
    assert "500 lines" in last and "MB/s" in last and "ETA" not in last


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ["missing.jsonl"], b"cannot read missing.jsonl: No such file or directory"),
        ("corrupt", ["bad.jsonl.gz", "-o", "out.jsonl"], b"cannot read bad.jsonl.gz"),
        ("truncated", ["cut.jsonl.gz", "-o", "out.jsonl"], b"cannot read cut.jsonl.gz"),
        ("plain", ["in.jsonl", "-o", "no/such/dir/out.jsonl"], b"cannot write no/such/dir/out.jsonl"),
        ("plain", ["in.jsonl", "--check", "-o", "out.jsonl"], b"not allowed with argument"),
        ("plain", ["in.jsonl", "--workers", "0"], b"must be at least 1"),
    ],
)
def test_file_problems_exit_2_with_a_message(
    tmp_path: Path, setup: str | None, args: list[str], message: bytes
) -> None:
    whole = gzip.compress(MIXED * 200)
    if setup == "corrupt":
        (tmp_path / "bad.jsonl.gz").write_bytes(whole[:20] + b"\x00" * 200 + whole[220:])
    elif setup == "truncated":
        (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    elif setup == "plain":
        (tmp_path / "in.jsonl").write_bytes(MIXED)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "normalize", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr and b"Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temporary file


def test_a_reader_that_leaves_early_ends_the_run_quietly(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes((MIXED + b"\n") * 20000)
    command = [sys.executable, "-m", "proxy", "normalize", str(source)]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        assert child.stdout.read(100)
        child.stdout.close()
        errors = child.stderr.read()
        assert child.wait(30) == 1
    assert b"Traceback" not in errors and b"Broken pipe" not in errors


def test_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    def peak_rss_kb(path: Path) -> int:
        call = f"main(['normalize', {str(path)!r}, '-o', {str(tmp_path / 'out.jsonl')!r}])"
        return memory.peak_rss_kb("from proxy.cli import main", call, timeout=120)

    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    small.write_bytes(MIXED)
    large.write_bytes((MIXED + b"\n") * 20000)
    assert large.stat().st_size > 40_000_000
    growth_mb = (peak_rss_kb(large) - peak_rss_kb(small)) / 1024
    assert growth_mb < 16, f"peak memory grew by {growth_mb:.0f} MB for a {large.stat().st_size >> 20} MB file"


# --- the line-count guarantee over generated files ----------------------------

_line = st.one_of(
    st.builds(
        lambda form, order: orjson.dumps(form(ABC, [(ABC[i][0], str(i)) for i in order])),
        st.sampled_from([chat, anthropic, responses]),
        st.permutations(range(3)),
    ),
    st.sampled_from([b"", b"  ", b"\r", b"{call_id", b"no json", b'{"conversations": []}']),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b),
)


@settings(max_examples=40, deadline=None)
@given(
    lines=st.lists(_line, max_size=20),
    final_newline=st.booleans(),
    gz_in=st.booleans(),
    gz_out=st.booleans(),
    block_size=st.sampled_from([None, 1, 7, 64]),
)
def test_output_has_as_many_lines_as_the_input_file(
    lines: list[bytes], final_newline: bool, gz_in: bool, gz_out: bool, block_size: int | None
) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / ("in.jsonl.gz" if gz_in else "in.jsonl")
        target = Path(folder) / ("out.jsonl.gz" if gz_out else "out.jsonl")
        source.write_bytes(gzip.compress(data) if gz_in else data)
        job = NormalizeJob(str(source), str(target), block_size=block_size)
        with open(os.devnull, "w") as quiet:
            assert run_normalize(job, stderr=quiet) == 0
        out = gzip.decompress(target.read_bytes()) if gz_out else target.read_bytes()
    count = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    assert out.count(b"\n") + (1 if out and not out.endswith(b"\n") else 0) == count
    assert out.endswith(b"\n") == data.endswith(b"\n")
    assert [normalize_line(line)[0] for line in data.split(b"\n")] == out.split(b"\n")
