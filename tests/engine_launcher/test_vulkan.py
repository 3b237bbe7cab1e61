"""The Vulkan build of the engine behind `toolpair serve`, on the machine's Vulkan device, through the three APIs.

Runs when a Vulkan build is installed in its own virtualenv (``.venv-vulkan``, or
``TOOLPAIR_VULKAN_PYTHON``; scripts/vulkan_check.sh makes it); ``.venv`` keeps the
CPU engine. On a machine without a GPU the device is Mesa's llvmpipe, a CPU-type
Vulkan device that llama.cpp passes over unless told (``GGML_VK_VISIBLE_DEVICES``):
serve must tell it, put every layer there and say so in its banner. The engine's
own log is the proof that the layers went to the Vulkan device.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from engine_launcher.builder.backends import Backend, detect_backend
from engine_launcher.builder.machine import Machine, SystemProbes, parse_vulkaninfo
from engine_launcher.builder.record import read_record, record_path
from engine_launcher.supervise.launch import free_port
from engine_launcher.supervise.process import die_with_parent
from tests.engine.test_engine_real import TWO_CALLS_GRAMMAR
from tests.real_engine import offloaded_layers
from tests.support.serve import Serving, start_serve

ROOT = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}
VULKAN_PYTHON = Path(os.environ.get("TOOLPAIR_VULKAN_PYTHON") or ROOT / ".venv-vulkan" / "bin" / "python")


def vulkan_record_prefix() -> Path | None:
    """The virtualenv holding a Vulkan build installed by toolpair, or None."""
    if not VULKAN_PYTHON.exists():
        return None
    prefix = VULKAN_PYTHON.parent.parent
    record = read_record(record_path(prefix))
    return prefix if record is not None and record.backend == Backend.VULKAN.value else None


needs_vulkan_build = pytest.mark.skipif(
    vulkan_record_prefix() is None, reason=f"no Vulkan build of the engine at {VULKAN_PYTHON} (make vulkan-check)"
)


def test_auto_detection_keeps_the_cpu_build_on_a_machine_with_only_a_software_vulkan_device() -> None:
    probes = SystemProbes(timeout=10.0)
    devices = parse_vulkaninfo(probes.run(["vulkaninfo", "--summary"]) or "")
    if not devices or any(kind != "PHYSICAL_DEVICE_TYPE_CPU" for kind, _ in devices):
        pytest.skip(f"this machine's Vulkan devices are not all CPU-type: {devices}")
    if probes.run(["nvidia-smi", "-L"]) or probes.kfd_properties():
        pytest.skip("this machine has a CUDA or ROCm GPU")
    found = detect_backend({}, Machine(probes))
    assert found.backend is Backend.CPU and "only CPU Vulkan devices" in found.reason


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    if vulkan_record_prefix() is None:
        pytest.skip(f"no Vulkan build of the engine at {VULKAN_PYTHON} (make vulkan-check)")
    served = start_serve(
        tmp_path_factory.mktemp("vulkan"),
        # debug: the engine's own loader lines (which device got the layers) reach toolpair's log
        *("--ctx-size", "2048", "--log-level", "debug"),
        python=VULKAN_PYTHON,
        without=["GGML_VK_VISIBLE_DEVICES"],  # serve must choose
        within=900,
    )
    # The first request compiles the device's pipelines (minutes on llvmpipe): a warm-up, not a test.
    warm = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    request = urllib.request.Request(served.url + "/v1/chat/completions", json.dumps(warm).encode(), JSON)
    with urllib.request.urlopen(request, timeout=1800) as response:
        assert response.status == 200
    yield served
    served.process.send_signal(signal.SIGTERM)
    served.process.wait(60)


@needs_vulkan_build
def test_every_layer_is_on_the_vulkan_device_and_the_banner_says_so(served: Serving) -> None:
    banner = served.stdout.read_text()
    log = served.stderr.read_text(errors="replace")
    assert "vulkan build" in banner and "gpu layers -1" in banner
    device = next(line for line in banner.splitlines() if line.strip().startswith("device:"))
    found = parse_vulkaninfo(SystemProbes().run(["vulkaninfo", "--summary"]) or "")
    assert any(name in device for _, name in found), device
    assert "all 18 layers and the output (-ngl -1)" in device and "there by the estimate" in device
    layers = offloaded_layers(log)
    assert layers is not None and layers[0] == layers[1] == 19, log[-3000:]
    assert "Vulkan0" in log  # llama.cpp's name for the device the model buffers went to
    if all(kind == "PHYSICAL_DEVICE_TYPE_CPU" for kind, _ in found):
        assert "GGML_VK_VISIBLE_DEVICES=0" in device


WEATHER_CHAT: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@needs_vulkan_build
async def test_chat_with_tool_calls_stream_and_not(served: Serving) -> None:
    async with AsyncOpenAI(base_url=served.url + "/v1", api_key="any", max_retries=0, timeout=600) as client:
        # The grammar makes the model write two Hermes calls, as a tool-calling model would.
        ask: Any = {
            "model": "m",
            "messages": [{"role": "user", "content": "Weather in Paris and Oslo?"}],
            "tools": [WEATHER_CHAT],
            "max_tokens": 80,
            "temperature": 0,
            "extra_body": {"grammar": TWO_CALLS_GRAMMAR},
        }
        reply = await client.chat.completions.create(**ask)
        calls = reply.choices[0].message.tool_calls or []
        assert reply.choices[0].finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "Oslo"}),
        ]
        stream = await client.chat.completions.create(**ask, stream=True)
        streamed: list[Any] = [c async for c in stream]
        deltas = [tc for c in streamed if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert [tc.function.name for tc in deltas if tc.function and tc.function.name] == ["get_weather"] * 2
        assert streamed[-1].choices[0].finish_reason == "tool_calls"

        # The results of two parallel calls, back in the order they finished.
        def call(call_id: str, city: str) -> dict[str, Any]:
            arguments = json.dumps({"city": city})
            return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}

        history: Any = [
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call("call_a", "Paris"), call("call_b", "Oslo")]},
            {"role": "tool", "tool_call_id": "call_b", "content": "Oslo: snow"},
            {"role": "tool", "tool_call_id": "call_a", "content": "Paris: sun"},
        ]
        answer = await client.chat.completions.create(model="m", messages=history, max_tokens=8, temperature=0)
        assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage is not None


WEATHER_ANTHROPIC: Any = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@needs_vulkan_build
async def test_anthropic_messages_stream_and_not(served: Serving) -> None:
    async with AsyncAnthropic(base_url=served.url, api_key="any", max_retries=0, timeout=600) as client:
        ask: Any = {
            "model": "claude-test",
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER_ANTHROPIC],
            "tool_choice": {"type": "tool", "name": "get_weather"},
        }
        whole = await client.messages.create(**ask)
        assert whole.stop_reason == "tool_use"
        assert [b.name for b in whole.content if b.type == "tool_use"] == ["get_weather"]
        async with client.messages.stream(**ask) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "tool_use"
        assert [b.name for b in final.content if b.type == "tool_use"] == ["get_weather"]
        plain = await client.messages.create(
            model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "Say hi."}]
        )
        assert plain.stop_reason in ("end_turn", "max_tokens") and plain.usage.input_tokens > 0


@needs_vulkan_build
async def test_responses_stream_and_not(served: Serving) -> None:
    async with AsyncOpenAI(base_url=served.url + "/v1", api_key="any", max_retries=0, timeout=600) as client:
        tool: Any = {
            "type": "function",
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
        ask: Any = {
            "model": "m",
            "input": "Weather in Paris?",
            "tools": [tool],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 40,
            "store": False,
        }
        whole = await client.responses.create(**ask)
        assert [item.name for item in whole.output if item.type == "function_call"] == ["get_weather"]
        stream = await client.responses.create(**ask, stream=True)
        events = [event async for event in stream]
        assert events[-1].type == "response.completed"
        done = events[-1].response  # type: ignore[union-attr]
        assert [item.name for item in done.output if item.type == "function_call"] == ["get_weather"]
        text = await client.responses.create(model="m", input="Say hi.", max_output_tokens=8, store=False)
        assert text.status in ("completed", "incomplete") and text.usage is not None


@needs_vulkan_build
def test_an_rpc_worker_on_the_vulkan_build_offers_the_vulkan_device(tmp_path: Path) -> None:
    """The worker gets serve's device choice: without it llama.cpp would pass over a software device."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [str(VULKAN_PYTHON), "-m", "proxy", "rpc-worker", "--port", str(free_port())],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT, preexec_fn=die_with_parent(),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        text = ""
        while time.monotonic() < deadline and worker.poll() is None and "Vulkan0:" not in text:
            time.sleep(0.5)
            text = log.read_text(errors="replace")
    finally:
        worker.kill()
        worker.wait()
    assert "toolpair rpc-worker: device: llvmpipe" in text, text
    assert "Vulkan0: llvmpipe" in text, f"rpc-server did not offer the Vulkan device:\n{text}"
