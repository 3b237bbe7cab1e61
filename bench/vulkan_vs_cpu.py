"""Tokens/s of the Vulkan build of the engine next to the CPU build's, in one run on one machine.

Each build runs behind `toolpair serve` (the bundled model, n_ctx 2048; the Vulkan build with every
layer on its device), one after the other; for each: start-up to /ready, then a warm-up and
``--requests`` chat requests that must write ``--tokens`` tokens (the end-of-turn tokens are
banned), timed through toolpair. Reported: generated tokens/s (median) and the Vulkan/CPU ratio.
On a machine whose only Vulkan device is Mesa's llvmpipe this measures a software device: it shows
the GPU path working, not GPU speed.

    python bench/vulkan_vs_cpu.py --vulkan-python .venv-vulkan/bin/python [--cpu-python .venv/bin/python]

Results are printed and written to bench/results/vulkan_vs_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.supervise.launch import free_port  # noqa: E402


def post(url: str, body: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.HTTPError, OSError):
        return False


def measure(python: str, requests: int, tokens: int, log: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [python, "-m", "proxy", "serve", "--port", str(port), "--ctx-size", "2048"]
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    try:
        while not ready(url):
            if process.poll() is not None or time.monotonic() - started > 900:
                raise SystemExit(f"{python}: serve did not come up:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        startup = time.monotonic() - started
        ends = post(url + "/extras/tokenize", {"input": "<|im_end|>"})["tokens"]
        bias = {str(t): -100 for t in {*ends, 1, 106}}
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": tokens,
            "temperature": 0,
            "logit_bias": bias,
        }
        warming = time.monotonic()
        post(url + "/v1/chat/completions", {**body, "max_tokens": 4})  # warm-up: a GPU build compiles its pipelines
        warm_up = time.monotonic() - warming
        rates = []
        for _ in range(requests):
            begun = time.monotonic()
            reply = post(url + "/v1/chat/completions", body)
            rates.append(reply["usage"]["completion_tokens"] / (time.monotonic() - begun))
    finally:
        process.terminate()
        process.wait(60)
    banner = [line.strip() for line in log.read_text(errors="replace").splitlines() if "engine:" in line[:20]]
    return {
        "startup_s": round(startup, 1),
        "first_request_s": round(warm_up, 1),
        "tokens_per_s": round(statistics.median(rates), 2),
        "runs": rates,
        "engine": banner[0] if banner else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vulkan-python", required=True)
    parser.add_argument("--cpu-python", default=sys.executable)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench stops the serve it started
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, python in (("cpu", args.cpu_python), ("vulkan", args.vulkan_python)):
            results[name] = measure(python, args.requests, args.tokens, Path(tmp) / f"{name}.log")
            print(f"{name}: {results[name]['tokens_per_s']} tokens/s, start-up {results[name]['startup_s']}s, "
                  f"first request {results[name]['first_request_s']}s "
                  f"({results[name]['engine']})", flush=True)  # fmt: skip
    ratio = results["vulkan"]["tokens_per_s"] / results["cpu"]["tokens_per_s"]
    print(f"vulkan/cpu tokens/s: {ratio:.3f}")
    out = ROOT / "bench" / "results" / "vulkan_vs_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**results, "ratio": ratio, "cpus": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
