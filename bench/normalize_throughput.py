"""Throughput of ``toolpair normalize`` on a generated agent dataset (a benchmark, not a test).

Generates a JSONL dataset of agent traces (default 256 MB): OpenAI chat,
Anthropic and Responses records with tool definitions and long tool outputs,
plus ShareGPT records without IDs. About 20% of the records hold a run whose
results arrived out of call order; a few hold runs that must keep their order.
Then it runs the real command (``python -m proxy normalize``) on it with one
worker and with two, and with ``--check``, and prints MB/s of input. The file
is read from the page cache after generation, so this measures the CPU path.

    python bench/normalize_throughput.py [--mb 256] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
TARGET_MBPS = 100.0

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "that",
    "file",
    "line",
    "error",
    "function",
    "return",
    "value",
    "test",
    "module",
    "import",
    "class",
    "def",
    "self",
    "config",
    "path",
    "data",
    "result",
    "output",
    "input",
    "request",
    "response",
    "server",
    "client",
    "build",
    "run",
    "check",
    "pass",
    "fail",
    "warning",
    "index",
    "list",
    "dict",
    "string",
    "number",
    "true",
    "false",
    "null",
    "none",
    "async",
    "await",
]

TOOLS = [
    ("grep", "Search files for a regular expression and return matching lines with their paths.", ["pattern", "path"]),
    ("read_file", "Read a text file from the workspace and return its contents with line numbers.", ["path"]),
    ("list_dir", "List the entries of a directory, with sizes and modification times.", ["path"]),
    ("run_tests", "Run the test suite or a subset of it and return the summary and failures.", ["target", "flags"]),
    ("web_search", "Search the web and return the top results with titles, links and snippets.", ["query"]),
    ("get_weather", "Get the current weather and a short forecast for a city.", ["city", "units"]),
    ("sql_query", "Run a read-only SQL query against the analytics warehouse.", ["query", "limit"]),
    ("edit_file", "Replace an exact string in a file with another string.", ["path", "old", "new"]),
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def tool_output(rng: random.Random) -> str:
    lines = [f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 900)}: {text(rng, 12)}"]
    lines += [text(rng, rng.randint(6, 16)) for _ in range(rng.randint(4, 24))]
    return "\n".join(lines)


def schemas(rng: random.Random) -> list[tuple[str, str, list[str]]]:
    return rng.sample(TOOLS, rng.randint(4, 8))


def chat_tools(chosen: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": doc,
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": "string", "description": f"the {p} to use"} for p in params},
                    "required": params[:1],
                },
            },
        }
        for name, doc, params in chosen
    ]


def arrival(rng: random.Random, n: int, shuffle: bool) -> list[int]:
    order = list(range(n))
    if shuffle:
        while order == sorted(order):
            rng.shuffle(order)
    return order


def chat_record(rng: random.Random, shuffle: bool, broken: bool) -> dict[str, Any]:
    chosen = schemas(rng)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + text(rng, 60)},
        {"role": "user", "content": text(rng, rng.randint(15, 60))},
    ]
    for turn in range(rng.randint(1, 3)):
        n = rng.randint(2, 4)
        calls = [
            {
                "id": f"call_{turn}_{i}_{rng.getrandbits(40):x}",
                "type": "function",
                "function": {"name": rng.choice(chosen)[0], "arguments": json.dumps({"q": text(rng, 4)})},
            }
            for i in range(n)
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for i in arrival(rng, n, shuffle and turn == 0):
            call_id: Any = None if broken and i == 0 else calls[i]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(rng)})
    messages.append({"role": "assistant", "content": text(rng, rng.randint(20, 80))})
    return {"messages": messages, "tools": chat_tools(chosen)}


def anthropic_record(rng: random.Random, shuffle: bool, broken: bool) -> dict[str, Any]:
    chosen = schemas(rng)
    messages: list[dict[str, Any]] = [{"role": "user", "content": text(rng, rng.randint(15, 60))}]
    for turn in range(rng.randint(1, 3)):
        n = rng.randint(2, 4)
        uses = [
            {"type": "tool_use", "id": f"toolu_{turn}{i}{rng.getrandbits(48):x}", "name": rng.choice(chosen)[0]}
            for i in range(n)
        ]
        for use in uses:
            use["input"] = {"pattern": text(rng, 3)}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text(rng, 20)}, *uses]})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": uses[i]["id"] if not (broken and i == 0) else uses[1]["id"],
                "content": tool_output(rng),
            }
            for i in arrival(rng, n, shuffle and turn == 0)
        ]
        messages.append({"role": "user", "content": results})
    messages.append({"role": "assistant", "content": [{"type": "text", "text": text(rng, 50)}]})
    tools = [
        {
            "name": name,
            "description": doc,
            "input_schema": {"type": "object", "properties": {p: {"type": "string"} for p in params}},
        }
        for name, doc, params in chosen
    ]
    return {"system": "You are Claude Code. " + text(rng, 80), "messages": messages, "tools": tools}


def responses_record(rng: random.Random, shuffle: bool, broken: bool) -> dict[str, Any]:
    chosen = schemas(rng)
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": text(rng, 80)},
        {"role": "user", "content": [{"type": "input_text", "text": text(rng, 40)}]},
    ]
    for turn in range(rng.randint(1, 3)):
        n = rng.randint(2, 4)
        ids = [f"call_{turn}{i}{rng.getrandbits(48):x}" for i in range(n)]
        items += [
            {"type": "function_call", "call_id": c, "name": rng.choice(chosen)[0], "arguments": '{"cmd": "ls"}'}
            for c in ids
        ]
        order = arrival(rng, n, shuffle and turn == 0)
        if broken:
            order = order[:-1]
        items += [{"type": "function_call_output", "call_id": ids[i], "output": tool_output(rng)} for i in order]
    tools = [
        {"type": "function", "name": name, "description": doc, "parameters": {"type": "object", "properties": {}}}
        for name, doc, _ in chosen
    ]
    return {"model": "gpt-5-codex", "input": items, "tools": tools}


def sharegpt_record(rng: random.Random) -> dict[str, Any]:
    turns = [
        {"from": "human" if i % 2 == 0 else "gpt", "value": text(rng, rng.randint(40, 300))}
        for i in range(rng.randint(2, 8))
    ]
    return {"conversations": turns, "source": "sharegpt"}


def record(rng: random.Random) -> dict[str, Any]:
    form = rng.random()
    if form < 0.15:
        return sharegpt_record(rng)
    shuffle = rng.random() < 0.235  # 0.85 * 0.235 ~ 20% of all records
    broken = not shuffle and rng.random() < 0.03
    if form < 0.55:
        return chat_record(rng, shuffle, broken)
    if form < 0.80:
        return anthropic_record(rng, shuffle, broken)
    return responses_record(rng, shuffle, broken)


def generate(path: Path, megabytes: int, seed: int = 7) -> int:
    """Write the dataset; returns the number of records."""
    rng = random.Random(seed)
    limit = megabytes * 1_000_000
    written = count = 0
    with path.open("wb", buffering=1 << 20) as out:
        while written < limit:
            line = orjson.dumps(record(rng)) + b"\n"
            out.write(line)
            written += len(line)
            count += 1
    return count


def run(args: list[str]) -> tuple[float, float, int]:
    """Run the real command once: wall seconds, CPU seconds (workers included), peak memory in KiB."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "proxy", "normalize", *args], cwd=ROOT, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):
        raise SystemExit(f"toolpair normalize failed with status {child.returncode}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def best_of(repeat: int, args: list[str], fresh: Path | None) -> tuple[float, float, int]:
    results = []
    for _ in range(repeat):
        if fresh is not None:  # replacing a big file costs the filesystem, not toolpair
            fresh.unlink(missing_ok=True)
        results.append(run(args))
    return min(results)


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="dataset size in MB (default 256)")
    parser.add_argument("--dir", type=Path, help="where to write the dataset (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best is reported")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="toolpair-bench-", dir=args.dir))
    try:
        data, out, report = workdir / "agents.jsonl", workdir / "out.jsonl", workdir / "report.json"
        started = time.perf_counter()
        records = generate(data, args.mb)
        size = data.stat().st_size
        print(
            f"dataset: {size / 1e6:.0f} MB, {records} records, avg {size / records / 1e3:.1f} KB/record "
            f"(generated in {time.perf_counter() - started:.0f} s)"
        )
        other = workdir / "out2.jsonl"
        configs: dict[str, tuple[list[str], Path | None]] = {
            "1 worker": (["-o", str(out), "--report", str(report)], out),
            "2 workers": (["-o", str(other), "--workers", "2"], other),
            "--check, 1 worker": (["--check"], None),
        }
        results: dict[str, float] = {}
        for label, (extra, fresh) in configs.items():
            seconds, cpu, peak_kib = best_of(args.repeat, [str(data), *extra], fresh)
            results[label] = size / 1e6 / seconds
            print(
                f"{label:>20}: {results[label]:6.1f} MB/s  ({seconds:.2f} s wall, {cpu:.2f} s CPU = "
                f"{size / 1e6 / cpu:.0f} MB per CPU-second, peak memory {peak_kib / 1024:.0f} MiB)"
            )
        same = out.read_bytes() == other.read_bytes()
        lines_in, lines_out = count_lines(data), count_lines(out)
        print(f"1 and 2 workers wrote the same bytes: {same}; lines in {lines_in}, lines out {lines_out}")
        summary = json.loads(report.read_text())
        share = summary["records_changed"] / summary["records_read"]
        print(
            f"records changed: {summary['records_changed']} of {summary['records_read']} ({share:.1%}), "
            f"runs reordered {summary['runs_reordered']}, in order {summary['runs_in_order']}, "
            f"kept {summary['runs_kept']}"
        )
        verdict = "met" if results["1 worker"] >= TARGET_MBPS else "NOT met"
        print(f"target >= {TARGET_MBPS:.0f} MB/s with one worker: {verdict} (cpus: {os.cpu_count()})")
        return 0
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
