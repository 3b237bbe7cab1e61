"""`toolpair serve` as a real process: the CPU build of llama-cpp-python with the bundled model behind toolpair.

One server is shared by the module (an engine start costs seconds); the
tests that use it run in file order and the last of them shuts it down. Waits are for
conditions (a status code, a process exit), never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from engine_launcher.builder import plan as engine_plan
from engine_launcher.builder.backends import EngineDevices
from engine_launcher.builder.machine import Machine, SystemProbes
from engine_launcher.builder.models import DEFAULT_MODEL, DEFAULT_TEMPLATE, GEMMA, bundled_model, default_model
from engine_launcher.builder.record import EngineRecord
from engine_launcher.supervise.launch import engine_env, free_port
from engine_launcher.supervise.memory import gib
from proxy import serve, serve_plan
from proxy.banner import device_line, serve_banner
from proxy.cli import main
from proxy.config import ConfigError, Settings
from tests.real_engine import RealEngine
from tests.support.conversations import tool_result, weather_calls
from tests.support.probes import FakeProbes
from tests.support.serve import (
    alive,
    children,
    client,
    cmdline,
    launch_serve,
    long_bias,
    ready_status,
    run_serve,
    start_serve,
    until_queue,
)


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    stdout: Path
    stderr: Path
    started_in: float

    def engines(self) -> list[int]:
        return [p for p in children(self.process.pid) if "llama_cpp.server" in cmdline(p)]

    def engine_pid(self) -> int:
        engines = self.engines()
        assert len(engines) == 1, engines
        return engines[0]

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    started = time.monotonic()
    # n_ctx 4096, logprobs and no prompt cache match the session's real_engine, so their logprobs
    # are comparable (a prompt restored from the cache is evaluated in other batches).
    process, url, out, err = start_serve(
        tmp,
        "--ctx-size",
        "4096",
        "--logprobs",
        "--prompt-cache-size",
        "0",
        TOOLPAIR_MAX_QUEUE="1",
        TOOLPAIR_SHUTDOWN_GRACE="60",
    )
    served = Served(process, url, out, err, time.monotonic() - started)
    yield served
    if process.poll() is None:  # the last test normally stops it
        engines = served.engines()
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        assert not any(alive(pid) for pid in engines)


STORY = [{"role": "user", "content": "Tell me a story."}]


async def test_serve_comes_up_answers_health_and_readiness_and_says_how_to_connect(served: Served) -> None:
    async with aiohttp.ClientSession() as session, session.get(served.url + "/health") as response:
        assert response.status == 200 and await response.json() == {"status": "ok"}
    status, body = await ready_status(served.url)
    assert status == 200 and body["status"] == "ready" and body["engine"]["state"] == "ready"
    banner = served.stdout.read_text()
    assert f'OpenAI(base_url="{served.url}/v1"' in banner
    assert f'Anthropic(base_url="{served.url}"' in banner and f"ANTHROPIC_BASE_URL={served.url}" in banner
    assert "n_ctx 4096" in banner and "chatml-tools.json" in banner
    # Ready means the engine generated: its warm-up came before /ready, and serve says so once it did.
    for _ in range(200):  # printed just after /ready turns 200
        if "the engine generated its first tokens (warm-up" in served.stdout.read_text():
            break
        await asyncio.sleep(0.05)
    assert "the engine generated its first tokens (warm-up" in served.stdout.read_text()
    assert "warm-up generation" in served.log()
    print(f"\nserve start-up to ready: {served.started_in:.2f}s")


async def test_only_toolpair_can_reach_the_engine(served: Served) -> None:
    argv = cmdline(served.engine_pid())
    port = argv[argv.index("--port") + 1]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--api_key" not in argv and "--interrupt_requests" in argv
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/v1/models") as response:
            assert response.status == 401
        async with session.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer whatever-the-client-has"}
        ) as response:
            assert response.status == 401
        async with session.get(served.url + "/v1/models") as response:
            assert response.status == 200  # toolpair adds the engine's key


async def test_chat_through_serve_non_stream_and_stream(served: Served) -> None:
    async with client(served.url) as api:
        reply = await api.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
        )
        stream = await api.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0, stream=True
        )
        chunks = [c async for c in stream]
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason


CALLS = weather_calls(compact=False, content="")
PARIS = tool_result("call_paris", "Paris: 18C and sunny")
OSLO = tool_result("call_oslo", "Oslo: -3C and snowing")
ASK = {"role": "user", "content": "What is the weather in Paris and in Oslo?"}


async def first_token_logprobs(url: str, messages: list[dict[str, Any]], key: str | None = None) -> list[Any]:
    body = {
        "model": "any",
        "messages": messages,
        "temperature": 0,
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 5,
        "max_tokens": 1,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # llama-cpp-python reuses the evaluated prefix of the previous prompt, and
    # evaluating a prompt in different batches moves logprobs slightly. A primer
    # that shares nothing with the chat prompt but <bos> makes each engine
    # evaluate the measured prompt whole, in one batch.
    primer = {"model": "any", "prompt": "Zebra", "temperature": 0, "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=primer, headers=headers) as response:
            assert response.status == 200, await response.text()
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status == 200, await response.text()
            reply = await response.json()
    return [(t["token"], t["logprob"]) for t in reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]


async def test_the_engine_sees_reversed_results_in_call_order(served: Served, real_engine: RealEngine) -> None:
    """What the model saw, proven by its first-token distribution: the same tool twice, results reversed.

    (No ``tools`` list in the request: llama-cpp-python computes logprobs over
    the whole prompt, so every prompt token costs time, and the calls and
    results render the same without it.)
    """
    ordered_direct = await first_token_logprobs(real_engine.url, [ASK, CALLS, PARIS, OSLO], real_engine.api_key)
    reversed_direct = await first_token_logprobs(real_engine.url, [ASK, CALLS, OSLO, PARIS], real_engine.api_key)
    reversed_through_toolpair = await first_token_logprobs(served.url, [ASK, CALLS, OSLO, PARIS])
    assert len(ordered_direct) == 5
    assert reversed_through_toolpair == ordered_direct
    assert reversed_direct != ordered_direct


async def long_stream(api: AsyncOpenAI, url: str, max_tokens: int) -> Any:
    """A streamed story the model cannot end before ``max_tokens`` (:func:`long_bias`), once its first chunk is in:
    the engine is busy with it from then on."""
    stream = await api.chat.completions.create(
        model="any", messages=STORY, temperature=0, max_tokens=max_tokens, logit_bias=await long_bias(url), stream=True
    )
    await stream.__anext__()
    return stream


async def stream_text(api: AsyncOpenAI, **kw: Any) -> tuple[str, str | None, int]:
    stream = await api.chat.completions.create(model="any", messages=STORY, temperature=0, stream=True, **kw)
    text, finish, pieces = "", None, 0
    async for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta.content
            if delta:
                text += delta
                pieces += 1
            finish = chunk.choices[0].finish_reason or finish
    return text, finish, pieces


async def test_two_concurrent_streams_both_finish_uncut(served: Served) -> None:
    bias = await long_bias(served.url)
    async with client(served.url) as api:
        reference = await api.chat.completions.create(
            model="any", messages=STORY, temperature=0, max_tokens=16, logit_bias=bias
        )
        first, second = await asyncio.gather(
            stream_text(api, max_tokens=16, logit_bias=bias), stream_text(api, max_tokens=16, logit_bias=bias)
        )
    assert reference.choices[0].finish_reason == "length"
    for text, finish, pieces in (first, second):
        assert finish == "length" and pieces > 0
        assert text == reference.choices[0].message.content


async def test_queue_full_gets_429_and_a_client_that_leaves_frees_its_place(served: Served) -> None:
    async with client(served.url) as api, aiohttp.ClientSession() as session:
        running = await long_stream(api, served.url, 400)  # the engine is generating for this one
        waiting = asyncio.create_task(
            api.chat.completions.create(model="any", messages=STORY, temperature=0, max_tokens=4)
        )
        await until_queue(served.url, 1)  # max_queue is 1: the queue is now full
        async with session.post(
            served.url + "/v1/chat/completions", json={"model": "any", "messages": STORY, "max_tokens": 4}
        ) as refused:
            assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
            assert (await refused.json())["error"]["code"] == "queue_full"
        waiting.cancel()  # this client gives up while it waits
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until_queue(served.url, 0)
        # Its place is free again: the next request queues instead of being refused.
        admitted = asyncio.create_task(
            api.chat.completions.create(model="any", messages=STORY, temperature=0, max_tokens=2)
        )
        await until_queue(served.url, 1)
        await running.close()  # ends the long stream early; the queued request goes next
        assert (await admitted).choices[0].finish_reason in ("length", "stop")


async def test_a_killed_engine_gives_a_clean_error_and_comes_back(served: Served) -> None:
    engine = served.engine_pid()
    async with client(served.url) as api:
        stream = await long_stream(api, served.url, 400)
        killed = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        # The client is told the engine crashed, and how, not only that the connection broke.
        with pytest.raises(openai.APIError, match=r"engine crashed with SIGKILL \(killed\) .*broke off the response"):
            async for _ in stream:
                pass
        async with asyncio.timeout(120):
            while True:
                status, body = await ready_status(served.url)
                if status == 200 and body["engine"]["restarts"] == 1:
                    break
                await asyncio.sleep(0.05)
        restarted_in = time.monotonic() - killed
        assert served.engine_pid() != engine
        reply = await api.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0
        )
        assert reply.choices[0].message.content is not None
    assert "engine crashed with SIGKILL (killed) while serving requests" in served.log()
    assert "restarting in 0.5s" in served.log()
    print(f"\nengine restart, SIGKILL to ready: {restarted_in:.2f}s")


async def test_shutdown_lets_the_running_stream_finish_and_leaves_no_engine(served: Served) -> None:
    engine = served.engine_pid()
    async with client(served.url) as api:
        stream = await long_stream(api, served.url, 24)
        served.process.send_signal(signal.SIGTERM)
        finish = None
        async for chunk in stream:
            if chunk.choices:
                finish = chunk.choices[0].finish_reason or finish
    assert finish == "length"  # the stream in flight was not cut off
    assert await asyncio.to_thread(served.process.wait, 60) == 0
    assert not alive(engine)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session, session.get(served.url + "/health"):
            pass
    assert "shutting down" in served.log() and "engine stopped" in served.log()


# --- start-up failures, each with its own short-lived server ----------------------------------------


def test_serve_check_has_the_engine_generate_and_says_why_when_it_cannot(tmp_path: Path) -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return run_serve("--check", "--ctx-size", "1024", *args, timeout=300)

    done = check()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert re.fullmatch(
        r"toolpair serve --check: ok: the cpu engine loaded \S+ and generated "
        r"\(ready in \d+\.\d+s, of which warm-up \d+\.\d+s\)\n",
        done.stdout,
    ), done.stdout
    truncated = tmp_path / "truncated.gguf"
    with bundled_model().open("rb") as source:
        truncated.write_bytes(source.read(8 << 20))
    done = check("--model", str(truncated))
    assert done.returncode == 1
    assert done.stdout.startswith("toolpair serve --check: FAILED: the engine failed to start: exited with status")
    assert "Traceback" not in done.stdout + done.stderr


def test_bad_settings_are_refused_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--model", str(tmp_path / "missing.gguf")]) == 2
    assert "model file" in capsys.readouterr().err
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a model")
    assert main(["serve", "--model", str(not_gguf)]) == 2
    assert "is not a GGUF model file" in capsys.readouterr().err


async def test_an_engine_that_cannot_load_the_model_stops_serve_with_its_log(tmp_path: Path) -> None:
    # A whole header with no tensors after it: toolpair reads it fine, the engine cannot load it.
    truncated = tmp_path / "truncated.gguf"
    with bundled_model().open("rb") as source:
        truncated.write_bytes(source.read(8 << 20))
    port = free_port()
    process, _out, err = launch_serve(tmp_path, "--model", str(truncated), "--port", str(port))
    code = await asyncio.to_thread(process.wait, 120)
    log = err.read_text()
    assert code == 1, log[-3000:]
    assert "the engine failed to start: exited with status" in log
    assert "failed to load model" in log  # the engine's own words, from its output
    assert "error loading model: tensor" in log  # why, from early in its loader output (debug level)
    assert len(log.splitlines()) <= 30, log  # the loader's dump itself stays out at the default level
    assert not children(process.pid)


# --- decisions made before anything starts ------------------------------------------------------


def record(backend: str) -> EngineRecord:
    return EngineRecord(backend, "0.3.36", "w.whl", "0" * 64, backend != "cpu", [])


def test_plan_for_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cpu"))
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described(memory_available=16 << 30))
    said = io.StringIO()
    plan = serve_plan.plan_serve(Settings(), out=said, check_machine=False)
    launch = plan.launch
    assert launch.model == default_model() and launch.chat_template == DEFAULT_MODEL.template
    assert "chat template: smollm2-tools.json (the default model's ChatML with tools)" in said.getvalue()
    assert launch.n_ctx == 8192  # the model's training context
    assert launch.n_gpu_layers == 0 and launch.host == "127.0.0.1" and len(launch.api_key) >= 32
    assert not launch.logits_all and launch.prompt_cache_bytes == 1 << 30
    assert plan.backend == "cpu" and plan.warnings == []
    assert plan.memory is not None and plan.memory.scores == 0 and plan.memory.total < 2 << 30
    assert plan.logprobs_cost == 8192 * 49152 * 4  # stated in the banner
    assert serve_plan.plan_serve(Settings(engine_ctx_size=4096), check_machine=False).launch.n_ctx == 4096
    assert serve_plan.plan_serve(Settings(), check_machine=False).launch.api_key != launch.api_key


def test_plan_for_gemma_without_a_template_gives_gemmas_turn_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cpu"))
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described(memory_available=16 << 30))
    said = io.StringIO()
    plan = serve_plan.plan_serve(Settings(model=str(bundled_model())), out=said, check_machine=False)
    assert plan.launch.chat_template == GEMMA.template and plan.launch.n_ctx == 32768
    assert plan.template_text is not None and "<start_of_turn>" in plan.template_text
    assert (
        "chat template: gemma-tools.json (the model has no chat template; "
        "its architecture gemma3 is Gemma's turn format)"
    ) in said.getvalue()
    assert plan.logprobs_cost == 32 << 30  # 32768 x 262144 x 4 bytes, stated in the banner
    # A template setting still wins.
    settings = Settings(model=str(bundled_model()), chat_template=str(DEFAULT_TEMPLATE))
    chatml = serve_plan.plan_serve(settings, out=io.StringIO(), check_machine=False)
    assert chatml.launch.chat_template == DEFAULT_TEMPLATE


def test_a_context_the_machine_cannot_hold_is_shrunk_and_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cpu"))
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described(memory_available=8 << 30))
    # Logprobs at the full 32768 would need 32 GiB of logits alone.
    gemma = str(bundled_model())
    plan = serve_plan.plan_serve(Settings(model=gemma, engine_logprobs=True), check_machine=False)
    launch, memory = plan.launch, plan.memory
    assert launch.logits_all and 4096 <= launch.n_ctx < 32768 and launch.n_ctx % 256 == 0
    assert memory is not None and memory.total <= 8 << 30 and memory.scores == launch.n_ctx * 262144 * 4
    (note,) = plan.warnings
    assert note.startswith(f"n_ctx {launch.n_ctx}, not 32768 (the model's training context): the engine would need")
    assert note.endswith("and this machine has 8.0 GiB available")
    # The same for an explicit --ctx-size; a machine that holds nothing gets a warning, not a guess.
    larger = Settings(model=gemma, engine_ctx_size=65536)
    assert serve_plan.plan_serve(larger, check_machine=False).launch.n_ctx <= 65536
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described(memory_available=100 << 20))
    assert "it may not start" in serve_plan.plan_serve(Settings(model=gemma), check_machine=False).warnings[0]


def test_the_memory_estimate_reads_the_models_shape() -> None:
    from engine_launcher.builder.gguf import read_metadata
    from engine_launcher.supervise.memory import ModelShape, estimate_memory

    shape = ModelShape.from_metadata(read_metadata(bundled_model()))
    assert shape == ModelShape(18, 4, 1, 256, 256, 262144, sliding_window=512, swa_pattern=6)
    small, full = (estimate_memory(shape, 1, n, logits_all=False) for n in (4096, 32768))
    # Three global layers grow with n_ctx; fifteen sliding-window layers hold their window only.
    assert full.kv_cache - small.kv_cache == 3 * 1024 * (32768 - 4096)
    quantized = estimate_memory(shape, 1, 32768, logits_all=False, bytes_k=34 / 32, bytes_v=34 / 32)
    assert quantized.kv_cache < full.kv_cache * 0.6
    assert estimate_memory(shape, 1, 32768, logits_all=False, flash_attn=True).compute < full.compute


def test_gpu_builds_offload_every_layer_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cuda"))
    assert serve_plan.plan_serve(Settings(), check_machine=False).launch.n_gpu_layers == -1
    assert serve_plan.plan_serve(Settings(engine_gpu_layers=12), check_machine=False).launch.n_gpu_layers == 12


def test_a_build_that_does_not_match_the_machine_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cuda"))
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described())  # no GPU found
    monkeypatch.setattr(
        engine_plan, "engine_devices", lambda backend, env, machine, architectures=None: EngineDevices(("CUDA0: A",))
    )
    plan = serve_plan.plan_serve(Settings())
    assert plan.warnings == [
        "the engine is built for cuda, but this machine gets cpu (no GPU found); "
        "run `toolpair engine install --backend cpu`"
    ]
    monkeypatch.setattr(serve_plan, "read_record", lambda: None)
    assert "its backend is unknown" in serve_plan.plan_serve(Settings()).warnings[0]


def test_a_bad_template_or_backend_setting_is_refused(tmp_path: Path) -> None:
    template = tmp_path / "t.json"
    template.write_text("{}")
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json-style object"):
        serve_plan.plan_serve(Settings(chat_template=str(template)), check_machine=False)
    with pytest.raises(ConfigError, match="unknown backend 'rocm'"):
        serve_plan.plan_serve(Settings(engine_backend="rocm"), check_machine=False)
    with pytest.raises(ConfigError, match="max_concurrency must be at least 1"):
        serve_plan.plan_serve(Settings(max_concurrency=0), check_machine=False)
    with pytest.raises(ConfigError, match="max_queue must be at least 0"):
        serve_plan.plan_serve(Settings(max_queue=-1), check_machine=False)


def test_a_template_file_of_named_templates_gives_the_tool_use_ones_call_format(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The engine renders the file's tool_use template, so that one names the format, not the default.
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cpu"))
    template = tmp_path / "tokenizer_config.json"
    named = [
        {"name": "default", "template": "{{ messages[0].content }}"},
        {"name": "tool_use", "template": "{{ '<tool_call>' }}{{ messages[0].content }}"},
    ]
    template.write_text(json.dumps({"chat_template": named}))
    plan = serve_plan.plan_serve(Settings(chat_template=str(template)), out=io.StringIO(), check_machine=False)
    assert plan.template_text == named[1]["template"]
    assert serve.managed_settings(Settings(), plan).tool_call_format == "hermes"


def test_engine_detect_says_what_this_machine_gets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine", "detect"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("backend: ") and "reason: " in out and "CMAKE_ARGS: " in out


def test_managed_settings_follow_the_engine_and_its_template(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cpu"))
    plan = serve_plan.plan_serve(Settings(), out=io.StringIO(), check_machine=False)
    assert plan.template_text is not None and "<tool_call>" in plan.template_text
    managed = serve.managed_settings(Settings(), plan)
    assert managed.engine_kind == "llama-cpp-python"
    assert managed.tool_call_format == "hermes"
    assert managed.think_in_prompt is False
    assert managed.count_tokens_template == str(plan.launch.chat_template)
    # Explicit settings win over what the template suggests.
    explicit = serve.managed_settings(Settings(tool_call_format="none", count_tokens_template="/t.json"), plan)
    assert (explicit.tool_call_format, explicit.count_tokens_template) == ("none", "/t.json")


def test_a_cuda_build_without_a_driver_stops_serve_in_one_line_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """This machine has no NVIDIA driver: what serve says on a CUDA build (scripts/cuda_build_check.sh, for real)."""
    if SystemProbes().run(["nvidia-smi", "-L"]):
        pytest.skip("this machine has an NVIDIA driver")
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("cuda"))
    assert main(["serve", "--port", str(free_port())]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("toolpair:")]
    assert said == [
        "toolpair: this is a CUDA build of the engine, but no CUDA driver was found (no working nvidia-smi): "
        "install the NVIDIA driver on a machine with an NVIDIA GPU, or run `toolpair engine install --backend cpu`"
    ]


def test_a_vulkan_build_gets_its_device_choice_and_the_banner_names_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_plan, "read_record", lambda: record("vulkan"))
    software = EngineDevices(("llvmpipe (LLVM 15.0.6, 256 bits)",), {"GGML_VK_VISIBLE_DEVICES": "0"}, "software")
    monkeypatch.setattr(engine_plan, "engine_devices", lambda backend, env, machine, architectures=None: software)
    gemma = str(bundled_model())
    plan = serve_plan.plan_serve(Settings(model=gemma), out=io.StringIO())
    assert plan.launch.n_gpu_layers == -1 and plan.launch.env == {"GGML_VK_VISIBLE_DEVICES": "0"}
    assert engine_env(plan.launch, {})["GGML_VK_VISIBLE_DEVICES"] == "0"
    line = next(x for x in serve_banner(Settings(), plan).splitlines() if x.strip().startswith("device:"))
    assert line.startswith(
        "  device:         llvmpipe (LLVM 15.0.6, 256 bits) (software): all 18 layers and the output"
    )
    assert (
        plan.memory is not None and f"~{gib(plan.memory.weights + plan.memory.kv_cache + plan.memory.compute)}" in line
    )
    partial = serve_plan.plan_serve(Settings(model=gemma, engine_gpu_layers=10), out=io.StringIO())
    assert "10 of 19 layers (-ngl 10)" in (device_line(partial) or "")
    # A CUDA build's run-time libraries from PyPI reach the engine too.
    pypi = dataclasses.replace(record("cuda"), run_env={"LD_LIBRARY_PATH": "/kit/lib"})
    monkeypatch.setattr(serve_plan, "read_record", lambda: pypi)
    monkeypatch.setattr(
        engine_plan,
        "engine_devices",
        lambda backend, env, machine, architectures=None: EngineDevices(("CUDA0: NVIDIA H200",)),
    )
    cuda = serve_plan.plan_serve(Settings(), out=io.StringIO())
    assert engine_env(cuda.launch, {"LD_LIBRARY_PATH": "/usr/lib"})["LD_LIBRARY_PATH"] == "/kit/lib:/usr/lib"


def test_an_engine_built_for_a_cpu_with_more_instruction_sets_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    built_on_avx512 = dataclasses.replace(record("cpu"), built_for_cpu=["avx2", "avx512bw", "avx512f", "fma"])
    monkeypatch.setattr(serve_plan, "read_record", lambda: built_on_avx512)
    monkeypatch.setattr(
        serve_plan, "this_machine", lambda: Machine.described(cpu_flags=frozenset({"avx2", "fma", "sse4_2"}))
    )
    with pytest.raises(ConfigError) as refused:
        serve_plan.plan_serve(Settings())
    assert str(refused.value).startswith("the engine was built for another CPU: this one lacks avx512bw, avx512f,")
    assert "toolpair engine install" in str(refused.value)
    # The same CPU or a larger one runs it; so does any CPU when the check is off (a plan made for elsewhere).
    monkeypatch.setattr(
        serve_plan,
        "this_machine",
        lambda: Machine.described(cpu_flags=frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"})),
    )
    assert serve_plan.plan_serve(Settings()).backend == "cpu"
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described(cpu_flags=frozenset({"avx2"})))
    assert serve_plan.plan_serve(Settings(), check_machine=False).backend == "cpu"


def test_serve_on_a_cpu_without_the_builds_instruction_sets_exits_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built_on_avx512 = dataclasses.replace(record("cpu"), built_for_cpu=["avx2", "avx512f"])
    monkeypatch.setattr(serve_plan, "read_record", lambda: built_on_avx512)
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine.described(cpu_flags=frozenset({"avx2", "fma"})))
    assert main(["serve", "--port", str(free_port())]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert said[-1].startswith("toolpair: the engine was built for another CPU: this one lacks avx512f,")
    assert "Traceback" not in "\n".join(said)


def test_a_serve_start_asks_nvidia_smi_once_and_plans_memory_from_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Detection, the devices check and the memory plan read one query (each run takes seconds on a cold GPU)."""
    monkeypatch.setattr(
        serve_plan, "read_record", lambda: dataclasses.replace(record("cuda"), cmake_args=["-DGGML_CUDA=on"])
    )
    h200 = FakeProbes({"nvidia-smi --query-gpu": "0, NVIDIA H200, GPU-1, 9.0, 1024\n"})
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine(h200))
    plan = serve_plan.plan_serve(Settings(), out=io.StringIO())
    assert [argv[0] for argv in h200.ran].count("nvidia-smi") == 1
    assert plan.memory_budget == 1024 * 1024 * 1024  # the GPU's free MiB, not the machine's RAM


def test_a_cuda_build_for_another_gpu_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp would load it, then stop at its first kernel: "no kernel image is available"."""
    ampere = dataclasses.replace(
        record("cuda"),
        cmake_args=["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=86-real"],
        cuda_architectures=["86-real"],
    )
    monkeypatch.setattr(serve_plan, "read_record", lambda: ampere)
    h200 = "0, NVIDIA H200, GPU-1, 9.0\n"
    monkeypatch.setattr(serve_plan, "this_machine", lambda: Machine(FakeProbes({"nvidia-smi --query-gpu": h200})))
    with pytest.raises(ConfigError) as refused:
        serve_plan.plan_serve(Settings(), out=io.StringIO())
    assert str(refused.value) == (
        "the engine was built for CUDA architectures 86-real, which GPU 0 (NVIDIA H200, compute "
        "capability 9.0) cannot run: run `toolpair engine install` to build it for this machine's GPUs"
    )
    hopper = dataclasses.replace(
        ampere, cmake_args=["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90"], cuda_architectures=["90"]
    )
    monkeypatch.setattr(serve_plan, "read_record", lambda: hopper)
    assert serve_plan.plan_serve(Settings(), out=io.StringIO()).launch.n_gpu_layers == -1
