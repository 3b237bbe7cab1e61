"""The one decision of what runs here (``engine_launcher.builder.plan``), case by case, without a machine.

Each row is a machine described by its facts, an install record and the settings; the plan that comes
out is what serve, rpc-worker and engine install act on.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.builder.machine import Machine, NvidiaGpu
from engine_launcher.builder.plan import EnginePlan, EngineSettings, plan_engine
from engine_launcher.builder.record import EngineRecord, read_record
from tests.support.probes import FakeProbes

H200 = (NvidiaGpu("0", "NVIDIA H200", "GPU-1", "9.0", 1 << 30),)
AVX2 = frozenset({"avx2", "fma"})
AMX = frozenset({"avx2", "avx512f", "amx_int8", "amx_tile"})
LLVMPIPE = (("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe"),)


def built(backend: str, **facts: Any) -> EngineRecord:
    return EngineRecord(backend, "0.3.36", "w.whl", "0" * 64, backend != "cpu", [], **facts)


CPU_HOST = Machine.described(cpu_flags=AVX2)
CASES: list[tuple[str, EngineSettings, Machine, EngineRecord | None, dict[str, str], dict[str, Any]]] = [
    (
        "an engine toolpair did not install: unknown, every layer offered, said once",
        EngineSettings(),
        CPU_HOST,
        None,
        {},
        {"backend": "unknown", "gpu_layers": -1, "refusal": None, "env": {}},
    ),
    ("a CPU build on a CPU machine", EngineSettings(), CPU_HOST, built("cpu"), {}, {"gpu_layers": 0, "warnings": ()}),
    (
        "a CPU build with RPC workers: every layer goes to them",
        EngineSettings(rpc_servers=("h:1",)),
        CPU_HOST,
        built("cpu"),
        {},
        {"gpu_layers": -1, "refusal": None},
    ),
    (
        "RPC asked of a build without it",
        EngineSettings(rpc_servers=("h:1",)),
        CPU_HOST,
        built("cpu", rpc=False),
        {},
        {"refusal": "the engine was built without RPC: run `toolpair engine install --rebuild`"},
    ),
    (
        "a native build for a CPU with more instruction sets",
        EngineSettings(),
        CPU_HOST,
        built("cpu", built_for_cpu=["avx2", "avx512f", "fma"]),
        {},
        {"refusal": "the engine was built for another CPU: this one lacks avx512f, and the engine would stop"},
    ),
    (
        "the same, in a plan made for another machine",
        EngineSettings(check_machine=False),
        CPU_HOST,
        built("cpu", built_for_cpu=["avx2", "avx512f", "fma"]),
        {},
        {"refusal": None, "warnings": ()},
    ),
    (
        "a CUDA build without a driver",
        EngineSettings(),
        CPU_HOST,
        built("cuda"),
        {},
        {"refusal": "this is a CUDA build of the engine, but no CUDA driver was found", "device_here": False},
    ),
    (
        "a CUDA build for another GPU",
        EngineSettings(),
        Machine.described(cpu_flags=AVX2, nvidia_gpus=H200),
        built("cuda", cuda_architectures=["86-real"]),
        {},
        {
            "refusal": "the engine was built for CUDA architectures 86-real, which GPU 0 (NVIDIA H200",
            "device_here": True,
        },
    ),
    (
        "a CUDA build for this GPU, with its toolkit's libraries: the GPU's free memory is the budget",
        EngineSettings(),
        Machine.described(cpu_flags=AVX2, nvidia_gpus=H200),
        built("cuda", cuda_architectures=["90"], run_env={"LD_LIBRARY_PATH": "/kit/lib"}),
        {},
        {"refusal": None, "gpu_memory": 1 << 30, "env": {"LD_LIBRARY_PATH": "/kit/lib"}, "device_here": True},
    ),
    (
        "the same with a GPU hidden: nothing visible to run on",
        EngineSettings(),
        Machine.described(cpu_flags=AVX2, nvidia_gpus=H200),
        built("cuda", cuda_architectures=["90"]),
        {"CUDA_VISIBLE_DEVICES": ""},
        {"refusal": "this is a CUDA build of the engine, but no CUDA device is visible (CUDA_VISIBLE_DEVICES='')"},
    ),
    (
        "part of the layers on the GPU: RAM stays the budget",
        EngineSettings(gpu_layers=12),
        Machine.described(cpu_flags=AVX2, nvidia_gpus=H200),
        built("cuda"),
        {},
        {"gpu_layers": 12, "gpu_memory": None},
    ),
    (
        "a Vulkan build on a software device only: chosen explicitly, and the mismatch said",
        EngineSettings(),
        Machine.described(cpu_flags=AVX2, vulkan_devices=LLVMPIPE),
        built("vulkan"),
        {},
        {
            "refusal": None,
            "env": {"GGML_VK_VISIBLE_DEVICES": "0"},
            "device_here": True,
            "warnings": (
                "the engine is built for vulkan, but this machine gets cpu (only CPU Vulkan devices (llvmpipe)); "
                "run `toolpair engine install --backend cpu`",
            ),
        },
    ),
    (
        "a Vulkan build without any Vulkan device: a warning, not a stop (it falls back)",
        EngineSettings(backend="vulkan"),
        CPU_HOST,
        built("vulkan"),
        {},
        {"refusal": None, "device_here": False, "env": {}, "warnings": ("no Vulkan device found",)},
    ),
    (
        "engine_amx on: weights go to AMX; a build without the AMX path is said",
        EngineSettings(amx=True),
        Machine.described(cpu_flags=AMX),
        built("cpu"),
        {},
        {"amx_weights": True, "warnings": ("engine_amx is on, but this engine was built without llama.cpp's AMX",)},
    ),
    (
        "engine_amx off (the default): the engine keeps weights off AMX",
        EngineSettings(),
        Machine.described(cpu_flags=AMX),
        built("cpu", amx=True),
        {},
        {"amx_weights": False, "warnings": ()},
    ),
]


def _matches(plan: EnginePlan, name: str, want: Any) -> bool:
    got = getattr(plan, name)
    if isinstance(want, str) and isinstance(got, str):
        return got.startswith(want)
    if name == "warnings" and want:
        return len(got) == len(want) and all(g.startswith(w) for g, w in zip(got, want, strict=True))
    return bool(got == want)


@pytest.mark.parametrize(("case", "settings", "machine", "record", "env", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_plan_table(
    case: str,
    settings: EngineSettings,
    machine: Machine,
    record: EngineRecord | None,
    env: dict[str, str],
    expected: dict[str, Any],
) -> None:
    plan = plan_engine(settings, machine, record, env)
    wrong = {name: getattr(plan, name) for name, want in expected.items() if not _matches(plan, name, want)}
    assert not wrong, f"{case}: {wrong}"
    if plan.refusal is not None:
        assert "\n" not in plan.refusal  # one line


def test_an_explicit_backend_asks_the_machine_for_nothing_a_cpu_build_does_not_need() -> None:
    probes = FakeProbes({"nvidia-smi": "0, NVIDIA H200, GPU-1, 9.0, 1024\n"})
    plan_engine(EngineSettings(backend="cpu"), Machine(probes), built("cpu"), {})
    assert probes.ran == []  # no GPU tool ran for a CPU build asked for by name


def test_one_machine_answers_every_question_once() -> None:
    probes = FakeProbes({"nvidia-smi --query-gpu": "0, NVIDIA H200, GPU-1, 9.0, 1024\n"})
    machine = Machine(probes)
    for _ in range(3):
        plan_engine(EngineSettings(), machine, built("cuda", cuda_architectures=["90"]), {})
    assert [argv[0] for argv in probes.ran].count("nvidia-smi") == 1


def test_an_older_record_has_its_facts_read_from_its_flags(tmp_path: Path) -> None:
    """Records written before the facts were stated still load, and say the same as a new one would."""
    path = tmp_path / "engine.json"
    old = dataclasses.asdict(built("cuda"))
    for fact in ("portable", "rpc", "amx", "cuda_architectures"):
        del old[fact]
    old["cmake_args"] = ["-DGGML_RPC=ON", "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=86-real"]
    path.write_text(json.dumps(old))
    record = read_record(path)
    assert record is not None
    assert (record.rpc, record.portable, record.cuda_architectures) == (True, False, ["86-real"])
    h200 = Machine.described(cpu_flags=AVX2, nvidia_gpus=H200)
    refusal = plan_engine(EngineSettings(), h200, record, {}).refusal
    assert refusal is not None and refusal.startswith("the engine was built for CUDA architectures 86-real")
