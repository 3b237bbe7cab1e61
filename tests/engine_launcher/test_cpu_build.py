"""The installed engine on this CPU: no AMX weight path, the switch that keeps weights off it, its speed probe.

llama.cpp's AMX weight buffer segfaults on its first matrix multiply (llama.cpp #20824). toolpair's
x86 builds compile it out; an engine built elsewhere with it in is loaded without extra buffer types
where the CPU has AMX. These tests hold both halves against the real engine on whatever CPU runs them.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.builder.backends import NO_AMX_FLAGS
from engine_launcher.builder.models import bundled_model
from engine_launcher.builder.record import read_record
from engine_launcher.inside import engine_main

ROOT = Path(__file__).resolve().parents[2]


def in_engine_process(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, as the engine's own process would be."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AMX is an x86 extension")
def test_the_installed_engine_was_built_without_the_amx_weight_path() -> None:
    """The install record says how it was built; ggml's own list says what it offers on this CPU.

    ggml lists "AMX" only on a CPU with AMX and a build with it compiled in, so the second half
    bites on an AMX machine; the first holds the build flags on any x86 machine.
    """
    record = read_record()
    assert record is not None and set(NO_AMX_FLAGS) <= set(record.cmake_args), record
    code = "import json; from engine_launcher.inside import engine_main as m; print(json.dumps(m.extra_buffer_types()))"
    done = in_engine_process(code)
    assert done.returncode == 0, done.stderr[-2000:]
    names = json.loads(done.stdout)
    assert "AMX" not in names
    assert "CPU_REPACK" in names  # the other repacked CPU kernels stay


def test_amx_weights_are_kept_off_only_where_ggml_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    api: Any = pytest.importorskip("llama_cpp.llama_cpp")
    original = api.llama_model_default_params
    monkeypatch.setattr(api, "llama_model_default_params", original)  # undone after the test
    assert engine_main.keep_weights_off_amx(False, lambda: ["CPU_REPACK"]) is False
    assert api.llama_model_default_params().use_extra_bufts is True
    assert engine_main.keep_weights_off_amx(True, lambda: ["AMX", "CPU_REPACK"]) is False
    assert api.llama_model_default_params().use_extra_bufts is True
    assert engine_main.keep_weights_off_amx(False, lambda: ["AMX", "CPU_REPACK"]) is True
    assert api.llama_model_default_params().use_extra_bufts is False


LOAD = """
import sys
from engine_launcher.inside import engine_main
from engine_launcher.builder.backends import NO_AMX_FLAGS
from engine_launcher.builder.install import read_record
if sys.argv[1] == "off":
    engine_main.load_without_extra_buffers()
import llama_cpp
llama_cpp.Llama(sys.argv[2], n_ctx=256, verbose=True)
"""


def test_loading_without_extra_buffers_keeps_the_weights_out_of_the_repacked_buffer() -> None:
    """What the engine falls back to on an AMX CPU really changes where llama.cpp puts the weights."""
    model = str(bundled_model())
    logs = {}
    for mode in ("on", "off"):
        done = subprocess.run(
            [sys.executable, "-c", LOAD, mode, model], capture_output=True, text=True, timeout=300, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-2000:]
        logs[mode] = done.stderr
    assert "CPU_REPACK model buffer size" in logs["on"] and "repack: repack tensor" in logs["on"]
    assert "CPU_REPACK model buffer size" not in logs["off"] and "repack: repack tensor" not in logs["off"]


def test_the_speed_probe_generates_and_reports_tokens_per_second() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engine_launcher.inside.speed", str(bundled_model()), "--prompt-tokens", "32",
         "--gen-tokens", "4", "--repeats", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["prompt_tokens"] == 32 and result["prompt_tps"] > 0 and result["gen_tps"] > 0
    assert isinstance(result["text"], str) and "AMX" not in result["extra_buffers"]
