"""What runs here: one pure decision from the settings, the machine and the install record.

``serve``, ``rpc-worker`` and ``engine install`` each need to know whether the installed build can
run on this machine, on which devices, with what in its environment, and what to warn about. They
all ask :func:`plan_engine`, and none decides again: a build for another CPU, a CUDA build for
another GPU, a CUDA build without a driver, RPC asked of a build without it, are each refused in one
place, in one line. The function only reads: the :class:`~engine_launcher.builder.machine.Machine`
asks the machine (once per process), the caller reads the record and the settings, so its table of
cases is tested with machines described by their facts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine_launcher.builder.backends import (
    Backend,
    EngineDevices,
    detect_backend,
    engine_devices,
    gpu_free_memory,
    parse_backend,
)
from engine_launcher.builder.cpu_features import missing_instruction_sets
from engine_launcher.builder.machine import Machine
from engine_launcher.builder.record import EngineRecord

__all__ = ["EnginePlan", "EngineSettings", "plan_engine"]

_AMX_FLAGS = frozenset({"amx_int8", "amx_tile"})


@dataclass(frozen=True)
class EngineSettings:
    """The settings the decision reads (``proxy.config.Settings`` holds them for toolpair)."""

    backend: str = "auto"
    """``engine_backend``: auto or a backend's name."""
    amx: bool = False
    """``engine_amx`` (``TOOLPAIR_ENGINE_AMX``, ``engine install --amx``): use llama.cpp's AMX weight path,
    which crashes today (llama.cpp #20824): build it into a native x86 engine, and load weights into it."""
    rpc_servers: tuple[str, ...] = ()
    """``engine_rpc``: llama.cpp RPC workers the model is split across."""
    gpu_layers: int | None = None
    """``engine_gpu_layers``; None: every layer on a GPU build, none on a CPU one."""
    check_machine: bool = True
    """Hold the build against this machine (its backend, CPU and devices); off for a plan made elsewhere."""


@dataclass(frozen=True)
class EnginePlan:
    """What the installed engine does on this machine, or why it must not start (``refusal``)."""

    backend: str
    """The build's backend, or ``unknown`` for an engine toolpair did not install."""
    refusal: str | None = None
    """Why the engine must not start here, in one line; None when it may."""
    warnings: tuple[str, ...] = ()
    devices: EngineDevices | None = None
    """The GPU build's devices here (None: a CPU build, or not looked at)."""
    env: dict[str, str] = field(default_factory=dict)
    """What a process that loads the build needs in its environment (its libraries, its device choice)."""
    gpu_layers: int = -1
    gpu_memory: int | None = None
    """Free memory of the GPU every layer goes to, the memory plan's budget; None: RAM is the budget."""
    amx_weights: bool = False
    """Load weights into llama.cpp's AMX buffer (only when asked for); otherwise the engine keeps them off it."""
    device_here: bool = False
    """A device of the build's kind is here, so loading it must show GPU offload (``engine install``)."""


def plan_engine(
    settings: EngineSettings, machine: Machine, record: EngineRecord | None, env: Mapping[str, str]
) -> EnginePlan:
    """Decide what the engine ``record`` describes does on ``machine``; see the module docstring.

    >>> plan = plan_engine(EngineSettings(), Machine.described(cpu_flags=frozenset({"avx2"})), None, {})
    >>> plan.backend, plan.gpu_layers, plan.refusal is None
    ('unknown', -1, True)
    """
    warnings: list[str] = []
    if record is None:
        warnings.append("llama-cpp-python was not installed by `toolpair engine install`; its backend is unknown")
        backend = "unknown"
    else:
        backend = record.backend
    gpu_layers = settings.gpu_layers
    if gpu_layers is None:
        # An unknown build gets -1 too: a CPU build ignores it. RPC workers count as GPUs: all layers go to them.
        gpu_layers = 0 if backend == "cpu" and not settings.rpc_servers else -1

    def plan(refusal: str | None = None, devices: EngineDevices | None = None, device_here: bool = False) -> EnginePlan:
        usable = devices is not None and devices.problem is None
        return EnginePlan(
            backend,
            refusal,
            tuple(warnings),
            devices,
            record.process_env(devices) if record is not None else {},
            gpu_layers,
            gpu_free_memory(env, machine) if backend not in ("cpu", "unknown") and gpu_layers == -1 else None,
            settings.amx,
            device_here or (usable and bool(devices and devices.names)),
        )

    if record is None or not settings.check_machine:
        if record is not None and settings.rpc_servers and not record.rpc:
            return plan("the engine was built without RPC: run `toolpair engine install --rebuild`")
        return plan()
    found = detect_backend(env, machine, explicit=settings.backend)
    device_here = not record.gpu or detect_backend(env, machine).backend.value == record.backend
    if found.backend.value != record.backend:
        wanted = (
            f"engine_backend is {found.backend.value}"
            if parse_backend(settings.backend) is not None
            else f"this machine gets {found.backend.value} ({found.reason})"
        )
        warnings.append(
            f"the engine is built for {record.backend}, but {wanted}; "
            f"run `toolpair engine install --backend {found.backend.value}`"
        )
    missing = missing_instruction_sets(record.built_for_cpu or (), machine.cpu_flags)
    if missing:
        # It would load, then die with SIGILL at its first matrix multiply: stop before, in one line.
        return plan(
            f"the engine was built for another CPU: this one lacks {', '.join(missing)}, and the engine "
            "would stop with SIGILL; run `toolpair engine install` to build it for this CPU "
            "(or `toolpair engine install --portable` for a build that runs on any x86-64-v3 CPU)"
        )
    devices = None
    if record.gpu:
        devices = engine_devices(Backend(record.backend), env, machine, record.cuda_architectures)
        if devices is not None and devices.problem:
            if devices.fatal:  # the engine would fail to load or to run: stop, in one line
                return plan(devices.problem, devices, device_here)
            warnings.append(devices.problem)
    if settings.rpc_servers and not record.rpc:
        return plan("the engine was built without RPC: run `toolpair engine install --rebuild`", devices, device_here)
    if settings.amx and machine.cpu_flags & _AMX_FLAGS and not record.amx:
        warnings.append(
            "engine_amx is on, but this engine was built without llama.cpp's AMX weight path: "
            "run `toolpair engine install --amx` to build it in"
        )
    return plan(None, devices, device_here)
