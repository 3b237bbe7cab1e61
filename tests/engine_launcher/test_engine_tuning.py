"""`toolpair serve` at its defaults, as real processes: a quiet start, the full context in bounded
memory, logprobs refused clearly, the prompt cache reused, and the engine knobs on the command line.

Two servers: one at the default log level (what a user sees), one at debug level (the engine's
own words, which show the prompt cache at work). Waits are for conditions, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from engine_launcher.builder.machine import physical_cores, usable_cores
from proxy.cli import main
from tests.support.serve import ROOT, alive, children, cmdline, run_serve, start_serve


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    url: str
    stdout: Path
    stderr: Path
    startup_lines: list[str]

    def engine_pid(self) -> int:
        engines = [p for p in children(self.process.pid) if "llama_cpp.server" in cmdline(p)]
        assert len(engines) == 1, engines
        return engines[0]

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


def _start(tmp: Path, *args: str) -> Running:
    process, url, out, err = start_serve(tmp, *args)
    lines = out.read_text().splitlines() + err.read_text().splitlines()
    return Running(process, url, out, err, lines)


def _stop(running: Running) -> None:
    if running.process.poll() is None:
        engine = running.engine_pid()
        running.process.send_signal(signal.SIGTERM)
        running.process.wait(60)
        assert not alive(engine)


@pytest.fixture(scope="module")
def default_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = _start(tmp_path_factory.mktemp("defaults"))
    yield running
    _stop(running)


@pytest.fixture(scope="module")
def debug_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    # Engine knobs by llama-server's names, each of which must reach the engine and work there.
    knobs = "-c 8192 -t 1 -tb 2 -b 256 -ub 256 -fa on --cache-type-k q8_0 --cache-type-v q8_0 --engine-arg seed=7"
    running = _start(tmp_path_factory.mktemp("debug"), "--log-level", "debug", *knobs.split())
    yield running
    _stop(running)


def rss_bytes(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as response:
        return response.status, await response.json()


# --- part 5: quiet by default; part 1: the full context in bounded memory -------------------------


async def test_a_default_start_is_quiet_and_says_what_it_chose(default_serve: Running) -> None:
    lines = default_serve.startup_lines
    text = "\n".join(lines)
    print(f"\nstart-up output at the default log level: {len(lines)} lines\n{text}")
    assert len(lines) <= 30, text
    assert "llama_model_loader" not in text and "Uvicorn running" not in text  # the loader dump is debug
    assert "n_ctx 32768" in text  # the bundled model's training context
    assert "memory:         ~" in text and "KV cache" in text and "available" in text
    assert "logprobs:       off (requests for them get 400); --logprobs serves them (32.0 GiB" in text
    assert "prompt cache:   1.0 GiB" in text
    assert f"listening on:   {default_serve.url}" in text


async def test_the_engine_runs_the_full_context_in_bounded_memory_with_tuned_threads(default_serve: Running) -> None:
    argv = cmdline(default_serve.engine_pid())
    options = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert options["--n_ctx"] == "32768" and options["--logits_all"] == "False"
    assert options["--n_threads"] == str(physical_cores())
    assert options["--n_threads_batch"] == str(usable_cores())
    assert (options["--cache"], options["--cache_type"], options["--cache_size"]) == ("True", "ram", str(1 << 30))
    async with AsyncOpenAI(base_url=default_serve.url + "/v1", api_key="any", max_retries=0, timeout=120) as api:
        reply = await api.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
        )
    assert reply.choices[0].message.content is not None
    rss = rss_bytes(default_serve.engine_pid())
    print(f"\nengine RSS at n_ctx 32768 after a request: {rss / 2**20:.0f} MiB")
    assert rss < 2 << 30  # with the server's own default (logits_all on) this context needs 32 GiB


# --- part 1: logprobs refused in each route's own shape --------------------------------------------

_CHAT = {"model": "any", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**_CHAT, "logprobs": True}, "logprobs"),
        ("/v1/chat/completions", {**_CHAT, "logprobs": True, "top_logprobs": 3, "stream": True}, "logprobs"),
        ("/v1/chat/completions", {**_CHAT, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/completions", {"model": "any", "prompt": "Hi", "max_tokens": 2, "logprobs": 2}, "logprobs"),
        ("/v1/responses", {"model": "any", "input": "Hi", "top_logprobs": 2}, "top_logprobs"),
        ("/v1/responses", {"model": "any", "input": "Hi", "include": ["message.output_text.logprobs"]}, "include"),
    ],
)
async def test_logprobs_are_a_clear_400_naming_the_setting(
    default_serve: Running, path: str, body: dict[str, Any], param: str
) -> None:
    status, answer = await post(default_serve.url, path, body)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "--logprobs" in error["message"] and "engine_logprobs" in error["message"]


async def test_requests_without_logprobs_still_pass(default_serve: Running) -> None:
    for path, body in (
        ("/v1/chat/completions", {**_CHAT, "logprobs": False}),
        ("/v1/completions", {"model": "any", "prompt": "Hi", "max_tokens": 2, "logprobs": None}),
        ("/v1/responses", {"model": "any", "input": "Hi", "max_output_tokens": 16, "include": [], "store": False}),
    ):
        status, answer = await post(default_serve.url, path, body)
        assert status == 200, (path, answer)


# --- part 2: the prompt cache across conversations -------------------------------------------------

# A long conversation (about 1,700 tokens) and an unrelated short one.
_FACTS = " ".join(f"Fact {i}: the {i}th lighthouse keeper logged {i * 7 % 13} ships at dawn." for i in range(80))
LONG = [
    {"role": "system", "content": "You are a careful archivist. " + _FACTS},
    {"role": "user", "content": "Which keeper logged the most ships?"},
]
OTHER = [{"role": "user", "content": "Name a colour."}]


async def first_token_time(api: AsyncOpenAI, messages: list[dict[str, Any]]) -> tuple[float, str]:
    started = time.monotonic()
    stream = await api.chat.completions.create(
        model="any",
        messages=messages,
        max_tokens=6,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    first, text = None, ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic() - started
            text += chunk.choices[0].delta.content
    return (first if first is not None else time.monotonic() - started), text


async def test_a_long_conversation_resumed_after_another_reuses_its_prefix(debug_serve: Running) -> None:
    async with AsyncOpenAI(base_url=debug_serve.url + "/v1", api_key="any", max_retries=0, timeout=300) as api:
        cold, reply = await first_token_time(api, LONG)
        await first_token_time(api, OTHER)  # the engine's own state now holds another conversation
        hits_before = debug_serve.log().count("Llama._create_completion: cache hit")
        resumed_messages = [*LONG, {"role": "assistant", "content": reply}, {"role": "user", "content": "And why?"}]
        resumed, _ = await first_token_time(api, resumed_messages)
    print(f"\nlong conversation first token: cold {cold:.2f}s, resumed after another {resumed:.2f}s")
    # The engine says it restored the conversation's state from its prompt cache ...
    async with asyncio.timeout(30):
        while True:
            if debug_serve.log().count("Llama._create_completion: cache hit") > hits_before:
                break
            await asyncio.sleep(0.05)
    # ... and the resumed turn skipped reading the long prefix again (a generous margin: the target is 25%).
    assert resumed < cold * 0.5, (cold, resumed)


async def test_knobs_reach_the_engine_by_the_servers_names(debug_serve: Running) -> None:
    argv = cmdline(debug_serve.engine_pid())
    options = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    wanted = {"--n_ctx": "8192", "--n_threads": "1", "--n_threads_batch": "2", "--n_batch": "256", "--n_ubatch": "256"}
    wanted |= {"--flash_attn": "True", "--type_k": "8", "--type_v": "8", "--seed": "7"}
    assert {key: options.get(key) for key in wanted} == wanted
    status, answer = await post(debug_serve.url, "/v1/chat/completions", {**_CHAT, "messages": OTHER})
    assert status == 200 and answer["choices"][0]["message"]["content"] is not None
    assert "q8_0" in debug_serve.log()  # the engine's own account of its KV cache, at debug level


# --- part 3: the knobs, checked before anything starts ------------------------------------------


def test_an_unknown_engine_arg_stops_serve_with_a_clear_error() -> None:
    for arg, message in (
        ("no_such_setting=1", "'no_such_setting' is not a setting the installed llama-cpp-python accepts"),
        ("rope_freq_bas=1", "did you mean 'rope_freq_base'?"),
        ("n_ctx=4096", "use -c/--ctx-size instead"),
        ("port=1", "toolpair sets it itself"),
        ("novalue", "is not KEY=VALUE"),
    ):
        done = run_serve("--engine-arg", arg, timeout=120)
        assert done.returncode == 2 and message in done.stderr, (arg, done.stderr)
        assert "Traceback" not in done.stderr


def test_bad_knob_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in (
        (["-ub", "0"], "must be at least 1"),
        (["--cache-type-k", "q7"], "invalid choice: 'q7'"),
        (["-fa", "maybe"], "must be on, off or auto"),
        (["--prompt-cache-size", "lots"], "not a size"),
        (["--tensor-split", "3,x"], "not a list of numbers"),
    ):
        with pytest.raises(SystemExit) as exited:  # argparse: usage and exit status 2
            main(["serve", *args])
        assert exited.value.code == 2 and message in capsys.readouterr().err, args
    assert main(["serve", "-ngl", "-2"]) == 2  # the settings check, before anything starts
    assert "engine_gpu_layers must be at least -1" in capsys.readouterr().err


def test_serve_help_groups_the_engine_knobs() -> None:
    done = run_serve("--help", timeout=120, check=True)
    out = done.stdout
    headings = ("model, context and memory:", "threads, batches and KV cache:", "GPU:", "listening, logging and")
    for heading in headings:
        assert heading in out
    for flag in ("-c N, --ctx-size N", "-ngl N", "-t N, --threads N", "-tb N", "-b N", "-ub N", "-fa", "--mlock"):
        assert flag in out, flag
    for flag in ("--cache-type-k", "--cache-type-v", "--chat-template-file", "--no-mmap", "--main-gpu"):
        assert flag in out, flag
    for flag in ("--split-mode", "--tensor-split", "--prompt-cache-size", "--engine-arg KEY=VALUE", "--logprobs"):
        assert flag in out, flag


_CACHE_PROBE = """
import json, sys
import llama_cpp
from engine_launcher.inside.engine_main import bound_prompt_cache
if sys.argv[2] == "fixed":
    bound_prompt_cache()
model = llama_cpp.Llama(sys.argv[1], n_ctx=1024, n_batch=64, logits_all=False, verbose=False)
cache = llama_cpp.LlamaRAMCache(capacity_bytes=1 << 30)
model.set_cache(cache)
prompt = " ".join(f"Note {i}: keep the {i}th lamp lit." for i in range(12))
model.create_completion(prompt, max_tokens=1, temperature=0)
model.create_completion("Name a colour.", max_tokens=1, temperature=0)
again = model.create_completion(prompt + " And", max_tokens=1, temperature=0)
states = list(cache.cache_state.values())
print(json.dumps({"entries": len(states), "scores": max(int(s.scores.nbytes) for s in states),
                  "counted": int(cache.cache_size), "llama_states": sum(int(s.llama_state_size) for s in states),
                  "text": again["choices"][0]["text"]}))
"""


def test_a_saved_state_holds_one_logits_row_and_the_cache_counts_all_it_holds() -> None:
    """engine_main's fix: a saved state carried up to n_batch x n_vocab float32 logits (512 MiB) uncounted."""
    from tests.real_engine import bundled_model

    def probe(mode: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", _CACHE_PROBE, str(bundled_model()), mode],
            capture_output=True, text=True, cwd=ROOT, timeout=600, check=True,
        )  # fmt: skip
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    fixed, stock = probe("fixed"), probe("stock")
    vocab_row = 262144 * 4
    # Stock: the longer prompt's state carries n_batch rows (64 here, 512 by default: 512 MiB) uncounted.
    assert stock["scores"] == 64 * vocab_row and stock["counted"] == stock["llama_states"]
    assert fixed["entries"] == stock["entries"] >= 2
    assert fixed["scores"] == vocab_row  # one row, 1 MiB
    assert fixed["counted"] > fixed["llama_states"] + fixed["entries"] * vocab_row  # every array counted
    assert fixed["text"] == stock["text"]  # the restored compact state answers the same
