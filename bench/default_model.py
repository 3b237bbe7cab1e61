"""Which model ``toolpair serve`` runs without ``--model``: Gemma 3 270M or SmolLM2-135M-Instruct, through serve.

Each candidate (a model and the template serve hands its engine) is started as ``toolpair serve
--model M [--chat-template-file T]`` on the real engine, one after the other in one run, and asked:

- first replies: a few plain prompts (``hi``, a question, an instruction), temperature 0; a reply
  counts when its content is not empty;
- a tool call it writes by itself: the weather question with a ``get_weather`` tool offered;
- a forced tool call: the same request with a GBNF ``grammar`` whose only sentence is the call in the
  template's ``<tool_call>`` form; it counts when serve returns it as that tool call with no content;
- the pairing bench (bench/pairing.py): the same model and template also run directly, so all three
  conditions are measured (call order direct, finish order direct, finish order through toolpair);
- start-up: seconds from starting serve to /ready (the model fetched or assembled beforehand), the
  median of ``--rounds`` starts with the candidates taking turns;
- memory: resident set of serve and its engine after those requests, and their peaks (VmHWM).

The candidates: Gemma with ChatML (what serve gave it before), Gemma with its family's turn format
(what serve gives a GGUF of architecture gemma3 now), SmolLM2 with its own template, and SmolLM2
with smollm2-tools.json (serve's default).

    python bench/default_model.py [--cases 8] [--ctx-size N] [--only NAME]

Results are printed as a table and written to bench/results/default_model.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import pairing  # noqa: E402

from engine_launcher.builder.models import DEFAULT_MODEL, DEFAULT_TEMPLATE, GEMMA, bundled_model, default_model  # noqa: E402
from engine_launcher.supervise.launch import READY_PATH, EngineLaunch, engine_command, engine_env, free_port  # noqa: E402


@dataclass(frozen=True)
class Candidate:
    name: str
    model: Callable[[], Path]
    template: Path | None
    """None: the model's own."""


CANDIDATES = (
    Candidate("gemma-3-270m + chatml-tools (before)", bundled_model, DEFAULT_TEMPLATE),
    Candidate("gemma-3-270m + gemma-tools (by architecture)", bundled_model, GEMMA.template),
    Candidate("smollm2-135m + its own template", default_model, None),
    Candidate("smollm2-135m + smollm2-tools (default)", default_model, DEFAULT_MODEL.template),
)

PROMPTS = ("hi", "What is the capital of France?", "Name three colours.")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue += parents.get(current, [])
    return found


def memory_kib(pids: list[int]) -> dict[str, int]:
    total = {"VmRSS": 0, "VmHWM": 0}
    for pid in pids:
        try:
            lines = (Path("/proc") / str(pid) / "status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key in total:
                total[key] += int(value.split()[0])
    return total


async def chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    async with session.post(url + "/v1/chat/completions", json={"model": "any", **body}) as response:
        reply: dict[str, Any] = await response.json()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {reply}")
    return reply, time.monotonic() - started


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path, key: str | None = None) -> None:
    """Until ``url`` answers 200; the process's log when it exits or takes over ten minutes."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args[:4]} exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not answer:\n{log.read_text()[-3000:]}")


async def replies(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {"prompts": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for prompt in PROMPTS:
            body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 40, "temperature": 0}
            reply, seconds = await chat(session, url, body)
            choice = reply["choices"][0]
            content = choice["message"].get("content") or ""
            out["prompts"].append(
                {
                    "prompt": prompt,
                    "content": content,
                    "finish_reason": choice["finish_reason"],
                    "completion_tokens": reply["usage"]["completion_tokens"],
                    "seconds": round(seconds, 2),
                }
            )
        body = {"messages": QUESTION, "tools": [WEATHER], "max_tokens": 60, "temperature": 0}
        reply, _ = await chat(session, url, body)
        message = reply["choices"][0]["message"]
        out["own_tool_call"] = {
            "tool_calls": [c["function"] for c in message.get("tool_calls") or []],
            "content": message.get("content") or "",
        }
        grammar = "root ::= " + json.dumps(FORCED)
        body = {"messages": QUESTION, "tools": [WEATHER], "max_tokens": 60, "temperature": 0, "grammar": grammar}
        reply, seconds = await chat(session, url, body)
        choice = reply["choices"][0]
        calls = [c["function"] for c in choice["message"].get("tool_calls") or []]
        out["forced_tool_call"] = {
            "read_back": [(c["name"], json.loads(c["arguments"])) for c in calls]
            == [("get_weather", {"city": "Paris"})]
            and not choice["message"].get("content")
            and choice["finish_reason"] == "tool_calls",
            "tool_calls": calls,
            "finish_reason": choice["finish_reason"],
            "seconds": round(seconds, 2),
        }
    return out


def pairing_rows(candidate: Candidate, model: Path, serve_url: str, cases: int, work: Path) -> list[Any]:
    """bench/pairing.py's three conditions: serve, and the same model and template run directly."""
    launch = EngineLaunch(model, free_port(), secrets.token_urlsafe(16), 4096, chat_template=candidate.template)
    log = work / "direct-engine.log"
    with log.open("wb") as sink:
        engine = subprocess.Popen(
            engine_command(launch), env=engine_env(launch, os.environ), stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        wait_for(launch.url + READY_PATH, engine, log, launch.api_key)
        made = pairing.make_cases([2, 3], cases, random.Random(20260))
        toolpair, direct = pairing.Target(serve_url), pairing.Target(launch.url, launch.api_key)
        result = asyncio.run(pairing.run(made, toolpair, direct, concurrency=2))
        return [row for row in pairing.summary(result) if row["shape"] == "all"]
    finally:
        engine.terminate()
        engine.wait(30)


def start_serve(candidate: Candidate, model: Path, args: argparse.Namespace, log: Path) -> tuple[Any, str, float]:
    """``toolpair serve`` for ``candidate``, its URL, and the seconds it took to answer /ready."""
    port = free_port()
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--model", str(model)]
    if candidate.template is not None:
        command += ["--chat-template-file", str(candidate.template)]
    if args.ctx_size:
        command += ["--ctx-size", str(args.ctx_size)]
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(url + "/ready", process, log)
    except BaseException:
        process.kill()
        raise
    return process, url, time.monotonic() - started


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(60)


def measure(candidate: Candidate, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = candidate.model()  # fetched or assembled before the clock starts
    log = work / "serve.log"
    process, url, startup = start_serve(candidate, model, args, log)
    try:
        result: dict[str, Any] = {"startup_s": [round(startup, 2)], "model": model.name}
        result["rss_ready_mib"] = round(memory_kib(tree(process.pid))["VmRSS"] / 1024)
        result.update(asyncio.run(replies(url)))
        used = memory_kib(tree(process.pid))
        result["rss_mib"], result["peak_rss_mib"] = round(used["VmRSS"] / 1024), round(used["VmHWM"] / 1024)
        result["template_line"] = next(
            (line for line in log.read_text().splitlines() if line.startswith("chat template:")), ""
        )
        if args.cases:
            result["pairing"] = pairing_rows(candidate, model, url, args.cases, work)
        return result
    finally:
        stop(process)


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| candidate | start-up s (median) | RSS at ready / after / peak MiB | `hi` | replies non-empty "
        "| own tool call | forced tool call | pairing: call order direct / finish order direct / toolpair |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        hi = json.dumps(r["prompts"][0]["content"][:60])
        filled = sum(1 for p in r["prompts"] if p["content"].strip())
        own = "yes" if r["own_tool_call"]["tool_calls"] else "no"
        forced = "read back" if r["forced_tool_call"]["read_back"] else f"not read ({r['forced_tool_call']})"
        pair = " / ".join(
            f"{row['right']}/{row['total']}" + (f" ({row['errors']} errors)" if row["errors"] else "")
            for row in r.get("pairing", [])
        )
        lines.append(
            f"| {name} | {statistics.median(r['startup_s']):.1f} "
            f"| {r['rss_ready_mib']} / {r['rss_mib']} / {r['peak_rss_mib']} | {hi} | "
            f"{filled}/{len(r['prompts'])} | {own} | {forced} | {pair or 'not run'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=8, help="pairing cases per shape (2 and 3 calls); 0 skips it")
    parser.add_argument("--ctx-size", type=int, help="n_ctx for serve (default: serve's own choice per model)")
    parser.add_argument("--rounds", type=int, default=3, help="start-ups per candidate, taking turns")
    parser.add_argument("--only", help="run only the candidates whose name holds this text")
    parser.add_argument("--work", default=str(ROOT / "bench" / "results" / "default_model"), help="logs go here")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for candidate in CANDIDATES:
        if args.only and args.only not in candidate.name:
            continue
        results[candidate.name] = measure(candidate, args, work)
        print(candidate.name, json.dumps(results[candidate.name], indent=1), flush=True)
    for _ in range(args.rounds - 1):  # more start-ups, the candidates taking turns (the machine is shared)
        for candidate in CANDIDATES:
            if candidate.name in results:
                process, _, seconds = start_serve(candidate, candidate.model(), args, work / "serve.log")
                stop(process)
                results[candidate.name]["startup_s"].append(round(seconds, 2))
    print(table(results))
    out = ROOT / "bench" / "results" / "default_model.json"
    out.write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
