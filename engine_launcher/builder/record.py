"""What ``toolpair engine install`` put into an environment: ``<prefix>/share/toolpair/engine.json``.

The record states the build's facts (backend, CPU instruction sets, CUDA architectures, portable
or native, RPC, AMX) as the build plan decided them, so nothing reads them back out of CMake flags
(except for a record written before it stated them: see :func:`read_record`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_launcher.builder.backends import RPC_FLAG, Backend, EngineDevices, cuda_architectures
from engine_launcher.builder.cpu_features import is_native_build

__all__ = ["EngineRecord", "read_record", "record_path", "write_record"]


@dataclass(frozen=True)
class EngineRecord:
    """What ``toolpair engine install`` put into an environment."""

    backend: str
    version: str
    wheel: str
    sha256: str
    gpu_offload: bool | None
    """None when it could not be checked (no device of that kind where it was installed)."""
    cmake_args: list[str]
    rpc_server: str | None = None
    """The ``rpc-server`` built against this engine's ggml, or None (an engine built without RPC)."""
    run_env: dict[str, str] = dataclasses.field(default_factory=dict)
    """What the engine's process needs in its environment to load this build (a PyPI CUDA toolkit's libraries)."""
    built_for_cpu: list[str] | None = None
    """A native build's instruction sets (the CPU that built it); None for a portable build or an older record."""
    portable: bool = False
    """Built for llama.cpp's baseline CPU and CUDA architectures, to run on other machines."""
    rpc: bool = True
    """Built with llama.cpp's RPC backend (``serve --rpc`` needs it)."""
    amx: bool = False
    """llama.cpp's AMX weight path may be compiled in (a native x86 build made with ``engine_amx``)."""
    cuda_architectures: list[str] | None = None
    """The CUDA architectures compiled for; None: llama.cpp's own list (any GPU of its era), or not CUDA."""

    @property
    def gpu(self) -> bool:
        return self.backend != Backend.CPU.value

    def process_env(self, devices: EngineDevices | None = None) -> dict[str, str]:
        """What a process that loads this build needs in its environment, on a machine with ``devices``.

        The build's run-time libraries (a PyPI CUDA toolkit's) and the device choice made here (a
        software Vulkan device is chosen explicitly); devices with a problem add nothing. One answer
        for every process that loads the build: serve's engine, ``rpc-worker``, the tests' engine.
        """
        chosen = devices.env if devices is not None and devices.problem is None else {}
        return {**self.run_env, **chosen}


def record_path(prefix: str | Path = sys.prefix) -> Path:
    return Path(prefix) / "share" / "toolpair" / "engine.json"


def read_record(path: Path | None = None) -> EngineRecord | None:
    """The install record, or None when the engine was not installed by toolpair.

    A record written before it stated its facts has them read from its CMake flags, once, here.
    """
    try:
        data = json.loads((path or record_path()).read_text())
        if isinstance(data, dict) and "rpc" not in data:
            data.update(_facts_from_cmake_args(str(data.get("backend")), data.get("cmake_args") or []))
        return EngineRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def _facts_from_cmake_args(backend: str, cmake_args: Sequence[str]) -> dict[str, object]:
    """What an older record (toolpair before the facts were recorded) says through its flags.

    >>> _facts_from_cmake_args("cuda", ["-DGGML_RPC=ON", "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=86;90"])
    {'portable': False, 'rpc': True, 'amx': True, 'cuda_architectures': ['86', '90']}
    """
    native = is_native_build(cmake_args)
    archs = cuda_architectures(cmake_args) if backend == Backend.CUDA.value else None
    return {
        "portable": not native,
        "rpc": RPC_FLAG in cmake_args,
        "amx": native and not any(arg.endswith("-mno-amx-int8") for arg in cmake_args),
        "cuda_architectures": None if archs is None else list(archs),
    }


def write_record(path: Path, record: EngineRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")
