"""Time to first token of a long conversation: cold, then resumed after an unrelated request.

Runs `toolpair serve` (bundled model unless --model) with its defaults, the RAM prompt cache
included, then:

1. the long conversation (several thousand tokens), cold: its first token time;
2. an unrelated short request, so the engine's own state holds another conversation;
3. the long conversation resumed (its reply and one more user turn): its first token time.

With --compare, the same again on a server started with --prompt-cache-size 0. Target: resumed
at most 25% of cold with the cache.

    python bench/prompt_cache.py [--model PATH] [--facts 400] [--compare]

Results are printed and written to bench/results/prompt_cache.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.supervise.launch import free_port  # noqa: E402


def stream(url: str, messages: list[dict[str, str]]) -> tuple[float, str, int]:
    """First-token seconds, the reply text, and the prompt's token count."""
    body = {"model": "any", "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    first, text, prompt_tokens = None, "", 0
    with urllib.request.urlopen(request, timeout=900) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = first or time.monotonic() - started
                text += chunk["choices"][0]["delta"]["content"]
    return (first if first is not None else time.monotonic() - started), text, prompt_tokens


def conversation(facts: int) -> list[dict[str, str]]:
    lines = " ".join(f"Fact {i}: the {i}th lighthouse keeper logged {i * 7 % 13} ships at dawn." for i in range(facts))
    return [
        {"role": "system", "content": "You are a careful archivist. " + lines},
        {"role": "user", "content": "Which keeper logged the most ships?"},
    ]


def one_server(args: argparse.Namespace, extra: list[str], log: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *extra]
    if args.model:
        command += ["--model", args.model]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        long = conversation(args.facts)
        cold, reply, prompt_tokens = stream(url, long)
        other, _, _ = stream(url, [{"role": "user", "content": "Name a colour."}])
        resumed_messages = [*long, {"role": "assistant", "content": reply}, {"role": "user", "content": "And why?"}]
        resumed, _, resumed_tokens = stream(url, resumed_messages)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    return {
        "prompt_tokens": prompt_tokens,
        "resumed_prompt_tokens": resumed_tokens,
        "cold_ttft_s": cold,
        "unrelated_ttft_s": other,
        "resumed_ttft_s": resumed,
        "resumed_over_cold": resumed / cold,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: the bundled model)")
    parser.add_argument("--facts", type=int, default=400, help="length of the long conversation (400: ~8k tokens)")
    parser.add_argument("--compare", action="store_true", help="also run with the prompt cache off")
    args = parser.parse_args()
    results: dict[str, Any] = {"cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        results["cache_on"] = one_server(args, [], Path(tmp) / "on.log")
        print("prompt cache on: ", json.dumps(results["cache_on"]), flush=True)
        if args.compare:
            results["cache_off"] = one_server(args, ["--prompt-cache-size", "0"], Path(tmp) / "off.log")
            print("prompt cache off:", json.dumps(results["cache_off"]), flush=True)
    ratio = results["cache_on"]["resumed_over_cold"]
    print(f"resumed / cold with the cache: {ratio:.1%} (target <= 25%)")
    out = ROOT / "bench" / "results" / "prompt_cache.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
