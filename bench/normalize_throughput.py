"""Throughput of ``toolpair normalize`` on generated datasets (a benchmark, not a test).

Three shapes, each generated once and then normalized by the real command
(``python -m proxy normalize``) with one worker, two workers and ``--check``:

- ``long``: agent traces of about 8.6 KB a record (default 256 MB): OpenAI chat,
  Anthropic and Responses records with tool definitions and long tool outputs,
  plus ShareGPT records without IDs. About 20% of the records hold a run whose
  results arrived out of call order; a few hold runs that must keep their order.
- ``short``: a chat-format tool-calling dataset of about 1 KB a record (default
  105 MB): half are one assistant turn with two parallel calls and their two
  results (a fifth of those arrived reversed), half plain user/assistant turns.

- ``mixed``: short records of about 560 bytes (default 90 MB) in all three
  dialects, each with two parallel calls and their results, half reversed and
  half in call order: every line needs a parse, half of them a rewrite.

The floor for every shape is the plain loop ``orjson_loop`` (in this file):
one process that ``orjson.loads`` and ``orjson.dumps`` every line, started and
timed like the real command and interleaved with it. Each configuration prints
its ratio to that loop (``x orjson loop``; above 1 is faster), on wall time and
on CPU time.

It prints MB/s of input (wall clock) and MB per CPU-second (the workers'
included), which is the steadier figure on a machine others are using too. The
file is read from the page cache after generation, so this measures the CPU
path. ``--against DIR`` runs the same commands from another checkout (say, the
main branch), interleaved with this one's, and prints the ratio.

``--parquet`` also writes the short dataset as Parquet (a nested ``messages``
column, and one of JSON text) and times ``toolpair normalize`` on both.

    python bench/normalize_throughput.py [--shape all|long|short|mixed] [--mb 256] [--short-mb 105]
                                         [--mixed-mb 90]
                                         [--parquet] [--against DIR] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


def long_record(rng: random.Random) -> dict[str, Any]:
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


def short_record(rng: random.Random) -> dict[str, Any]:
    """About 1 KB: a tool round with two parallel calls (a fifth reversed), or a plain exchange."""
    if rng.random() < 0.5:
        return {
            "messages": [
                {"role": "user", "content": text(rng, rng.randint(40, 80))},
                {"role": "assistant", "content": text(rng, rng.randint(90, 140))},
            ]
        }
    ids = [f"call_{rng.getrandbits(64):016x}" for _ in range(2)]
    names = [rng.choice(TOOLS)[0] for _ in ids]
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps({"query": text(rng, 3)})}}
        for i, n in zip(ids, names, strict=True)
    ]
    order = [1, 0] if rng.random() < 0.2 else [0, 1]
    return {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": text(rng, rng.randint(10, 25))},
            {"role": "assistant", "content": None, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": ids[i], "name": names[i], "content": text(rng, 25)} for i in order),
            {"role": "assistant", "content": text(rng, rng.randint(20, 45))},
        ]
    }


def mixed_record(rng: random.Random) -> dict[str, Any]:
    """About 450 bytes: two parallel calls and their results in one of the three dialects, half reversed."""
    ids = [f"call_{rng.getrandbits(48):012x}" for _ in range(2)]
    names = [rng.choice(TOOLS)[0] for _ in ids]
    order = [1, 0] if rng.random() < 0.5 else [0, 1]
    form = rng.randrange(3)
    question = {"role": "user", "content": text(rng, rng.randint(8, 20))}
    if form == 0:
        calls = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": '{"q": "x"}'}}
            for i, n in zip(ids, names, strict=True)
        ]
        results = [{"role": "tool", "tool_call_id": ids[i], "content": text(rng, 8)} for i in order]
        return {"messages": [question, {"role": "assistant", "content": None, "tool_calls": calls}, *results]}
    if form == 1:
        uses = [{"type": "tool_use", "id": i, "name": n, "input": {"q": "x"}} for i, n in zip(ids, names, strict=True)]
        blocks = [{"type": "tool_result", "tool_use_id": ids[i], "content": text(rng, 8)} for i in order]
        return {"messages": [question, {"role": "assistant", "content": uses}, {"role": "user", "content": blocks}]}
    items = [
        {"type": "function_call", "call_id": i, "name": n, "arguments": "{}"} for i, n in zip(ids, names, strict=True)
    ]
    outputs = [{"type": "function_call_output", "call_id": ids[i], "output": text(rng, 8)} for i in order]
    return {"input": [question, *items, *outputs]}


SHAPES: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "long": long_record,
    "short": short_record,
    "mixed": mixed_record,
}


def generate(path: Path, shape: str, megabytes: int, seed: int = 7) -> int:
    """Write the dataset; returns the number of records."""
    make = SHAPES[shape]
    rng = random.Random(seed)
    limit = megabytes * 1_000_000
    written = count = 0
    with path.open("wb", buffering=1 << 20) as out:
        while written < limit:
            line = orjson.dumps(make(rng)) + b"\n"
            out.write(line)
            written += len(line)
            count += 1
    return count


def run(root: Path, args: list[str]) -> tuple[float, float, int]:
    """Run the real command once: wall seconds, CPU seconds (workers included), peak memory in KiB."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "proxy", "normalize", *args]
    child = subprocess.Popen(command, cwd=root, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):
        raise SystemExit(f"toolpair normalize failed with status {child.returncode}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def orjson_loop(source: str, target: str) -> None:
    """The floor: read every line, ``orjson.loads`` it and ``orjson.dumps`` it back, one process, no ordering."""
    loads, dumps = orjson.loads, orjson.dumps
    with open(source, "rb", buffering=1 << 20) as lines, open(target, "wb", buffering=1 << 20) as out:
        write = out.write
        for line in lines:
            write(dumps(loads(line)) + b"\n")


def run_floor(source: Path, target: Path) -> tuple[float, float, int]:
    """The orjson loop, started and timed the same way as the real command."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, __file__, "--orjson-loop", str(source), str(target)])
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("the orjson loop failed")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def load() -> str:
    return "load average " + " ".join(f"{value:.1f}" for value in os.getloadavg())


def bench_shape(shape: str, megabytes: int, workdir: Path, repeat: int, roots: dict[str, Path]) -> dict[str, float]:
    """Generate one shape, run every configuration from every checkout; MB/s of the best run of each."""
    data = workdir / f"{shape}.jsonl"
    started = time.perf_counter()
    records = generate(data, shape, megabytes)
    size = data.stat().st_size
    print(
        f"\n{shape}: {size / 1e6:.0f} MB, {records} records, avg {size / records / 1e3:.2f} KB/record "
        f"(generated in {time.perf_counter() - started:.0f} s; {load()})"
    )
    out1, out2, report = workdir / "out1.jsonl", workdir / "out2.jsonl", workdir / "report.json"
    configs: dict[str, tuple[list[str], Path | None]] = {
        "1 worker": (["-o", str(out1), "--report", str(report)], out1),
        "2 workers": (["-o", str(out2), "--workers", "2"], out2),
        "--check, 1 worker": (["--check"], None),
    }
    results: dict[str, float] = {}
    cpu_rates: dict[str, float] = {}
    floor_out = workdir / "floor.jsonl"
    for label, (extra, fresh) in configs.items():
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(repeat):
            # Interleaved, so all see the same load: the orjson loop first, this checkout last.
            floor_out.unlink(missing_ok=True)
            best["floor"] = min(best.get("floor", (float("inf"), 0.0, 0)), run_floor(data, floor_out))
            for name, root in reversed(roots.items()):
                if fresh is not None:  # replacing a big file costs the filesystem, not toolpair
                    fresh.unlink(missing_ok=True)
                best[name] = min(best.get(name, (float("inf"), 0.0, 0)), run(root, [str(data), *extra]))
        floor_wall, floor_cpu, _ = best.pop("floor")
        print(
            f"{'orjson loop':>11} {label:>18}: {size / 1e6 / floor_wall:6.1f} MB/s  ({floor_wall:.2f} s wall, "
            f"{floor_cpu:.2f} s CPU = {size / 1e6 / floor_cpu:.0f} MB per CPU-second)"
        )
        for name, (seconds, cpu, peak_kib) in best.items():
            results[f"{name} {label}"] = size / 1e6 / seconds
            print(
                f"{name:>11} {label:>18}: {size / 1e6 / seconds:6.1f} MB/s  ({seconds:.2f} s wall, {cpu:.2f} s CPU = "
                f"{size / 1e6 / cpu:.0f} MB per CPU-second, peak memory {peak_kib / 1024:.0f} MiB); "
                f"x orjson loop: {floor_wall / seconds:.2f} wall, {floor_cpu / cpu:.2f} CPU"
            )
        cpu_rates[label] = size / 1e6 / best["this"][1]
        if "against" in best:
            print(f"{'':>11} {label:>18}: this / against = {best['against'][0] / best['this'][0]:.2f}x")
    same = filecmp.cmp(out1, out2, shallow=False)
    print(f"1 and 2 workers wrote the same bytes: {same}; lines in {count_lines(data)}, out {count_lines(out1)}")
    summary = json.loads(report.read_text())
    share = summary["records_changed"] / summary["records_read"]
    print(
        f"records changed: {summary['records_changed']} of {summary['records_read']} ({share:.1%}), "
        f"runs reordered {summary['runs_reordered']}, in order {summary['runs_in_order']}, "
        f"kept {summary['runs_kept']}; {load()}"
    )
    verdict = "met" if results["this 1 worker"] >= TARGET_MBPS else "NOT met"
    per_cpu = "met" if cpu_rates["1 worker"] >= TARGET_MBPS else "NOT met"
    print(
        f"{shape}: target >= {TARGET_MBPS:.0f} MB/s with one worker: {verdict} in wall time, {per_cpu} per "
        f"CPU-second (cpus: {os.cpu_count()}; {load()})"
    )
    return results


def write_parquet(workdir: Path) -> None:
    """``short.jsonl`` as Parquet: its records with a nested ``messages`` column, and as JSON text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with (workdir / "short.jsonl").open("rb") as lines:
        records = [orjson.loads(line) for line in lines]
    pq.write_table(pa.Table.from_pylist(records), workdir / "short-nested.parquet", row_group_size=10_000)
    text = [orjson.dumps(record["messages"]).decode() for record in records]
    text_table = pa.table({"id": list(range(len(text))), "messages": text})
    pq.write_table(text_table, workdir / "short-text.parquet", row_group_size=10_000)


def bench_parquet(workdir: Path, repeat: int, roots: dict[str, Path]) -> None:
    """The short dataset as Parquet, a nested ``messages`` column and a JSON-text one; seconds per run.

    Parquet is compressed and columnar, so MB/s of the file says little: the
    figure is the run time, next to the JSONL run on the same records.
    """
    source = workdir / "short.jsonl"
    files = {"nested": workdir / "short-nested.parquet", "JSON text": workdir / "short-text.parquet"}
    # Written by a child process: one that held every record would pass its size on, as peak
    # memory, to each command it starts (a forked child's RSS before exec counts in ru_maxrss).
    subprocess.run([sys.executable, __file__, "--write-parquet", str(workdir)], check=True)
    print(f"\nparquet: the short dataset's records as Parquet, row groups of 10,000 ({load()})")
    for label, path in files.items():
        out = workdir / f"out-{path.name}"
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(repeat):
            for name, root in reversed(roots.items()):
                out.unlink(missing_ok=True)
                best[name] = min(best.get(name, (float("inf"), 0.0, 0)), run(root, [str(path), "-o", str(out)]))
        for name, (seconds, cpu, peak_kib) in best.items():
            print(
                f"{name:>8} {label:>18}: {seconds:.2f} s wall, {cpu:.2f} s CPU for {path.stat().st_size / 1e6:.0f} MB "
                f"of Parquet ({source.stat().st_size / 1e6 / seconds:.1f} MB/s of the same records as JSONL), "
                f"peak memory {peak_kib / 1024:.0f} MiB"
            )
        if "against" in best:
            print(f"{'':>8} {label:>18}: this / against = {best['against'][0] / best['this'][0]:.2f}x")


def main() -> int:
    if sys.argv[1:2] == ["--orjson-loop"]:
        orjson_loop(sys.argv[2], sys.argv[3])
        return 0
    if sys.argv[1:2] == ["--write-parquet"]:
        write_parquet(Path(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["all", *SHAPES], default="all", help="which dataset (default all)")
    parser.add_argument("--mb", type=int, default=256, help="long dataset size in MB (default 256)")
    parser.add_argument("--short-mb", type=int, default=105, help="short dataset size in MB (default 105)")
    parser.add_argument("--mixed-mb", type=int, default=90, help="mixed dataset size in MB (default 90)")
    parser.add_argument("--against", type=Path, help="another checkout to run the same commands from")
    parser.add_argument("--dir", type=Path, help="where to write the dataset (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best is reported")
    parser.add_argument(
        "--parquet", action="store_true", help="also the short dataset as Parquet, nested and as JSON text (pyarrow)"
    )
    args = parser.parse_args()

    roots = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    sizes = {"long": args.mb, "short": args.short_mb, "mixed": args.mixed_mb}
    workdir = Path(tempfile.mkdtemp(prefix="toolpair-bench-", dir=args.dir))
    try:
        for shape in SHAPES if args.shape == "all" else [args.shape]:
            bench_shape(shape, sizes[shape], workdir, args.repeat, roots)
        if args.parquet:
            if not (workdir / "short.jsonl").exists():
                generate(workdir / "short.jsonl", "short", args.short_mb)
            bench_parquet(workdir, args.repeat, roots)
        return 0
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
