"""Prompt and generation tokens/s: toolpair's engine defaults against llama-cpp-python's own, in one run.

Starts llama-cpp-python's server twice on the same model, n_ctx and prompt, one after the other:

- engine defaults: ``python -m llama_cpp.server --model M --n_ctx N`` and nothing else
  (threads = cores // 2, logits_all on);
- toolpair defaults: the command line ``toolpair serve`` builds (threads = physical cores,
  batch threads = every core, logits_all off, the prompt cache on).

Each gets a warm-up request, then one streamed request with a long prompt (about 2,000 tokens)
and 64 generated tokens (end of turn banned): prompt tokens/s is the prompt's tokens over the
time to the first token, generation tokens/s is the other tokens over the rest.

    python bench/engine_defaults.py [--model PATH] [--ctx 4096]

Results are printed and written to bench/results/engine_defaults.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.builder.machine import physical_cores, usable_cores  # noqa: E402
from engine_launcher.builder.models import DEFAULT_TEMPLATE, bundled_model  # noqa: E402
from engine_launcher.supervise.launch import READY_PATH, EngineLaunch, engine_command, engine_env, free_port  # noqa: E402

KEY = "bench-key"
PROMPT = " ".join(f"Line {i}: the tide tables for harbour {i} list {i * 3 % 17} high waters." for i in range(110))


def request(url: str, path: str, body: dict[str, Any]) -> urllib.request.Request:
    return urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )


def tokens(url: str, text: str) -> list[int]:
    with urllib.request.urlopen(request(url, "/extras/tokenize", {"input": text}), timeout=60) as response:
        found: list[int] = json.loads(response.read())["tokens"]
        return found


def measure(url: str) -> dict[str, float]:
    bias = {str(t): -100 for t in {*tokens(url, "<|im_end|>"), 1, 106}}
    warm = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    urllib.request.urlopen(request(url, "/v1/chat/completions", warm), timeout=300).read()
    body = {
        "messages": [{"role": "user", "content": PROMPT + "\nSummarise the tide tables."}],
        "max_tokens": 64,
        "temperature": 0,
        "logit_bias": bias,
        "stream": True,
    }
    started = time.monotonic()
    first = None
    pieces = 0
    with urllib.request.urlopen(request(url, "/v1/chat/completions", body), timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.monotonic()
                pieces += 1
    ended = time.monotonic()
    assert first is not None
    prompt_tokens = len(tokens(url, PROMPT)) + 20  # the template's few tokens, roughly
    return {
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_per_s": prompt_tokens / (first - started),
        "generated_tokens": 64,
        "generation_tokens_per_s": (64 - 1) / (ended - first),
        "time_to_first_token_s": first - started,
    }


def run_engine(command: list[str], env: dict[str, str], url: str, log: Path) -> dict[str, float]:
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"engine did not start:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + READY_PATH, timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        return measure(url)
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: the bundled model)")
    parser.add_argument("--ctx", type=int, default=4096, help="n_ctx for both (the engine's defaults need 4 GiB/4k)")
    args = parser.parse_args()
    model = Path(args.model) if args.model else bundled_model()
    template = None if args.model else DEFAULT_TEMPLATE
    results: dict[str, Any] = {"cpus": os.cpu_count(), "physical_cores": physical_cores(), "n_ctx": args.ctx}
    with tempfile.TemporaryDirectory() as tmp:
        plain = EngineLaunch(model, free_port(), KEY, args.ctx, chat_template=template)
        env = engine_env(plain, os.environ)
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--n_ctx", str(args.ctx)]
        command += ["--host", plain.host, "--port", str(plain.port)]
        if template is not None:
            command += ["--chat_format", "hf-tokenizer-config", "--hf_tokenizer_config_path", str(template)]
        results["engine_defaults"] = run_engine(command, env, plain.url, Path(tmp) / "plain.log")
        print("engine defaults:  ", results["engine_defaults"], flush=True)
        tuned = EngineLaunch(
            model,
            free_port(),
            KEY,
            args.ctx,
            chat_template=template,
            n_threads=physical_cores(),
            n_threads_batch=usable_cores(),
            prompt_cache_bytes=1 << 30,
        )
        results["toolpair_defaults"] = run_engine(
            engine_command(tuned), engine_env(tuned, os.environ), tuned.url, Path(tmp) / "tuned.log"
        )
        print("toolpair defaults:", results["toolpair_defaults"], flush=True)
    for key in ("prompt_tokens_per_s", "generation_tokens_per_s"):
        ratio = results["toolpair_defaults"][key] / results["engine_defaults"][key]
        results[key.replace("_per_s", "_ratio")] = ratio
        print(f"{key}: engine {results['engine_defaults'][key]:.1f}, toolpair {results['toolpair_defaults'][key]:.1f}"
              f" ({ratio:.2f}x)")  # fmt: skip
    out = ROOT / "bench" / "results" / "engine_defaults.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
