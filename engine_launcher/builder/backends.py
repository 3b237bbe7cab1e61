"""Which llama.cpp backend suits this machine, and how to build for it.

An explicit choice (config, environment or ``--backend``) wins. Otherwise the
machine's devices are looked at in order, and the first kind found decides:
CUDA, HIP/ROCm, SYCL, Metal, Vulkan, then CPU.

Deciding is pure: it reads the facts of a :class:`~engine_launcher.builder.machine.Machine`,
which alone asks the machine. The build plan also asks :class:`Probes` about the
build's tools (compilers, SDKs, headers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from engine_launcher.builder.cpu_features import is_native_build
from engine_launcher.builder.machine import ONEAPI_SETVARS, Machine, NvidiaGpu, Probes, visible_cuda_gpus
from engine_launcher.builder.models import cache_root
from engine_launcher.builder.version import LLAMA_CPP_VERSION

__all__ = [
    "BACKEND_CHOICES",
    "CUDA_PIP_PACKAGES",
    "VK_VISIBLE_DEVICES",
    "Backend",
    "BuildPlan",
    "CUDA_NO_VMM_FLAG",
    "CudaToolkit",
    "Detection",
    "EngineDevices",
    "NO_AMX_FLAGS",
    "PORTABLE_FLAG",
    "RPC_FLAG",
    "build_plan",
    "child_env",
    "cuda_architectures",
    "cuda_devices",
    "runs_on_compute_capability",
    "detect_backend",
    "engine_devices",
    "gpu_free_memory",
    "install_hint",
    "parse_backend",
    "truthy",
    "vulkan_devices",
    "vulkan_header_version",
]


class Backend(StrEnum):
    """A llama.cpp compute backend that llama-cpp-python can be built for."""

    CPU = "cpu"
    CUDA = "cuda"
    HIP = "hip"
    SYCL = "sycl"
    METAL = "metal"
    VULKAN = "vulkan"

    @property
    def gpu(self) -> bool:
        return self is not Backend.CPU


BACKEND_CHOICES = ("auto", *(b.value for b in Backend))


def parse_backend(name: str) -> Backend | None:
    """``None`` for ``auto``; a :class:`Backend` otherwise.

    >>> parse_backend("CUDA")
    <Backend.CUDA: 'cuda'>
    """
    lowered = name.strip().lower()
    if lowered in ("", "auto"):
        return None
    try:
        return Backend(lowered)
    except ValueError:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKEND_CHOICES)}") from None


@dataclass(frozen=True)
class Detection:
    """The backend chosen, why, and the device targets a build should use."""

    backend: Backend
    reason: str
    targets: tuple[str, ...] = ()


VK_VISIBLE_DEVICES = "GGML_VK_VISIBLE_DEVICES"
"""llama.cpp's Vulkan device list, like ``CUDA_VISIBLE_DEVICES``: indexes in ``vulkaninfo``'s order."""
_VK_CPU = "PHYSICAL_DEVICE_TYPE_CPU"
_VK_GPUS = ("PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU")


@dataclass(frozen=True)
class EngineDevices:
    """The devices a GPU build of the engine will use here, and what its process needs to use them."""

    names: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    """Set in the engine's environment (device selection)."""
    note: str = ""
    """Said next to the device, e.g. that it is a software one and how it was chosen."""
    problem: str | None = None
    """Why the build cannot use a device here, and what to do; one line."""
    fatal: bool = False
    """The problem stops the engine from working (serve and rpc-worker stop on it) rather than from
    using a device: a CUDA build fails to load or to run its kernels, where a Vulkan one falls back."""


def vulkan_devices(devices: Sequence[tuple[str, str]], env: Mapping[str, str]) -> EngineDevices:
    """The Vulkan devices llama.cpp will use, given ``vulkaninfo --summary``'s list (see :func:`parse_vulkaninfo`).

    llama.cpp (ggml-vulkan.cpp, ``ggml_vk_instance_init``) takes the discrete and
    integrated GPUs, else the first other device that is not a CPU; it never takes a
    CPU-type device (Mesa's llvmpipe) unless ``GGML_VK_VISIBLE_DEVICES`` names it,
    and then runs every "offloaded" layer on the CPU backend instead. Detection
    never picks Vulkan for such a machine (the CPU build is faster), so a Vulkan
    build there was asked for: the engine is pointed at the first CPU-type device.
    A ``GGML_VK_VISIBLE_DEVICES`` of the user's own is left alone.

    >>> vulkan_devices([("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe")], {}).env
    {'GGML_VK_VISIBLE_DEVICES': '0'}
    >>> vulkan_devices([("PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", "RX 6800"), ("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe")], {})
    EngineDevices(names=('RX 6800',), env={}, note='', problem=None, fatal=False)
    """
    chosen = env.get(VK_VISIBLE_DEVICES)
    if chosen is not None:
        picked = [int(i) for i in chosen.replace(",", " ").split() if i.isdigit()]
        names = tuple(devices[i][1] for i in picked if i < len(devices))
        return EngineDevices(names, note=f"{VK_VISIBLE_DEVICES}={chosen} (yours)")
    gpus = tuple(name for kind, name in devices if kind in _VK_GPUS)
    if gpus:
        return EngineDevices(gpus)
    other = [name for kind, name in devices if kind != _VK_CPU]
    if other:
        return EngineDevices((other[0],))
    cpu = [index for index, (kind, _) in enumerate(devices) if kind == _VK_CPU]
    if cpu:
        return EngineDevices(
            (devices[cpu[0]][1],),
            {VK_VISIBLE_DEVICES: str(cpu[0])},
            f"a CPU-type (software) Vulkan device, chosen with {VK_VISIBLE_DEVICES}={cpu[0]}",
        )
    return EngineDevices(
        (),
        problem="no Vulkan device found (vulkaninfo --summary lists none): install your GPU's Vulkan driver "
        "(Debian/Ubuntu: mesa-vulkan-drivers, and vulkan-tools for vulkaninfo), "
        "or run `toolpair engine install --backend cpu`",
    )


CUDA_ARCHITECTURES_FLAG = "-DCMAKE_CUDA_ARCHITECTURES="


def cuda_architectures(cmake_args: Sequence[str]) -> tuple[str, ...] | None:
    """The CUDA architectures a build was compiled for, from its CMake flags; None when they do not say.

    None means llama.cpp's own list (every architecture of its era) or CMake's ``native``/``all``:
    nothing toolpair can hold against a GPU. The last flag wins, as in CMake.

    >>> cuda_architectures(["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=80;90-real"])
    ('80', '90-real')
    >>> cuda_architectures(["-DCMAKE_CUDA_ARCHITECTURES=native"]) is None
    True
    """
    value = next(
        (a[len(CUDA_ARCHITECTURES_FLAG) :] for a in reversed(cmake_args) if a.startswith(CUDA_ARCHITECTURES_FLAG)), ""
    )
    archs = tuple(a for a in value.strip("\"'").replace(",", ";").split(";") if a)
    if not archs or any(not re.fullmatch(r"\d+[af]?(-real|-virtual)?", a) for a in archs):
        return None
    return archs


def runs_on_compute_capability(arch: str, capability: str) -> bool:
    """Whether code compiled for CMake architecture ``arch`` runs on a GPU of ``capability`` (nvidia-smi's "8.6").

    Machine code (``-real``) runs on its own major version at the same or a higher minor one; PTX
    (``-virtual``) is compiled by the driver for any later GPU, at the first start; a bare number is
    both. An ``a`` architecture runs only on its own capability, an ``f`` one on its family. llama.cpp
    compiles a bare Blackwell number (``120``) as ``120a``, for its FP4 instructions.

    >>> [runs_on_compute_capability("90", c) for c in ("8.0", "9.0", "10.0")]
    [False, True, True]
    >>> [runs_on_compute_capability("86-real", c) for c in ("8.6", "8.9", "9.0")]
    [True, True, False]
    """
    found = re.fullmatch(r"(\d+)([af]?)(?:-(real|virtual))?", arch)
    major, _, minor = capability.partition(".")
    if found is None or not (major.isdigit() and minor.isdigit()):
        return True  # nothing to hold against it
    number, suffix, kind = int(found.group(1)), found.group(2), found.group(3)
    if 120 <= number <= 129 and not suffix:
        suffix = "a"  # ggml-cuda/CMakeLists.txt replaces 12X with 12Xa
    gpu = int(major) * 10 + int(minor)
    if suffix == "a":
        return gpu == number
    same_family = gpu // 10 == number // 10 and gpu >= number
    if suffix == "f" or kind == "real":
        return same_family
    return gpu >= number  # PTX, with or without machine code beside it


def cuda_devices(
    gpus: Sequence[NvidiaGpu] | None, env: Mapping[str, str], architectures: Sequence[str] | None = None
) -> EngineDevices:
    """The NVIDIA GPUs a CUDA build will use; ``gpus`` is what nvidia-smi lists, None when it is absent or fails.

    Without nvidia-smi there is no NVIDIA driver (it ships with it); with no
    visible GPU, llama.cpp's CUDA backend cannot start. Either way the engine
    would fail or silently run on the CPU, so this is a problem to stop on. So is
    a GPU that none of the build's ``architectures`` runs on (a build made for
    another machine's GPU): llama.cpp would stop at its first kernel with "no
    kernel image is available".

    >>> print(cuda_devices(None, {}).problem)  # doctest: +ELLIPSIS
    this is a CUDA build of the engine, but no CUDA driver was found (no working nvidia-smi): ...
    """
    todo = "install the NVIDIA driver on a machine with an NVIDIA GPU, or run `toolpair engine install --backend cpu`"
    if gpus is None:
        return EngineDevices(
            (),
            problem=f"this is a CUDA build of the engine, but no CUDA driver was found (no working nvidia-smi): {todo}",
            fatal=True,
        )
    visible = visible_cuda_gpus(gpus, env)
    if not visible:
        hidden = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r})" if "CUDA_VISIBLE_DEVICES" in env else ""
        return EngineDevices(
            (), problem=f"this is a CUDA build of the engine, but no CUDA device is visible{hidden}: {todo}", fatal=True
        )
    if architectures:
        for gpu in visible:
            if gpu.compute_cap and not any(runs_on_compute_capability(a, gpu.compute_cap) for a in architectures):
                return EngineDevices(
                    (),
                    problem=f"the engine was built for CUDA architectures {';'.join(architectures)}, which GPU "
                    f"{gpu.index} ({gpu.name}, compute capability {gpu.compute_cap}) cannot run: run "
                    "`toolpair engine install` to build it for this machine's GPUs",
                    fatal=True,
                )
    return EngineDevices(tuple(f"CUDA{i}: {g.name}" for i, g in enumerate(visible)))


# --- detection: the machine's facts in, the backend out ------------------------------------------


def _cuda_gpus(env: Mapping[str, str], machine: Machine) -> list[NvidiaGpu]:
    return visible_cuda_gpus(machine.nvidia_gpus or (), env)


def gpu_free_memory(env: Mapping[str, str], machine: Machine) -> int | None:
    """Free memory of the first NVIDIA GPU a CUDA program may use, from the one nvidia-smi query; else None."""
    gpus = _cuda_gpus(env, machine)
    return gpus[0].memory_free if gpus else None


def _compute_capabilities(gpus: Sequence[NvidiaGpu]) -> tuple[str, ...]:
    """The CMake architectures of ``gpus`` ("9.0" is "90"): a CUDA build is compiled for these (build_plan)."""
    return tuple(dict.fromkeys(g.compute_cap.replace(".", "") for g in gpus if g.compute_cap))


def detect_backend(env: Mapping[str, str], machine: Machine, explicit: str | None = None) -> Detection:
    """Pick the backend: ``explicit`` unless it is ``auto``, else the first kind of device the machine has.

    ``AMDGPU_TARGETS`` in ``env`` overrides the gfx targets found for HIP. An explicit choice asks the
    machine nothing beyond what that backend's targets need.
    """
    chosen = parse_backend(explicit) if explicit else None
    env_targets = tuple(t for t in env.get("AMDGPU_TARGETS", "").replace(",", ";").split(";") if t)
    if chosen is Backend.CUDA:
        return Detection(chosen, "chosen explicitly", _compute_capabilities(_cuda_gpus(env, machine)))
    if chosen is not None:
        targets = env_targets if chosen is Backend.HIP else ()
        if chosen is Backend.HIP and not targets:
            targets = machine.amd_targets
        return Detection(chosen, "chosen explicitly", targets)

    gpus = _cuda_gpus(env, machine)
    if gpus:
        caps = _compute_capabilities(gpus)
        names = ", ".join(g.name for g in gpus)
        return Detection(Backend.CUDA, f"nvidia-smi: {len(gpus)} visible GPU(s): {names}", caps)

    found = machine.amd_targets
    if found:
        return Detection(Backend.HIP, f"ROCm: AMD GPU {', '.join(found)}", env_targets or found)

    intel = machine.intel_gpus
    if intel and (bool(env.get("ONEAPI_ROOT")) or machine.oneapi):
        return Detection(Backend.SYCL, f"sycl-ls: {', '.join(intel)}")

    system, arch = machine.platform
    if system == "Darwin" and arch == "arm64" and not machine.rosetta:
        return Detection(Backend.METAL, "Apple silicon (arm64)")

    devices = machine.vulkan_devices
    gpu_devices = [name for kind, name in devices if kind != "PHYSICAL_DEVICE_TYPE_CPU"]
    if gpu_devices:
        return Detection(Backend.VULKAN, f"vulkaninfo: {', '.join(gpu_devices)}")
    reason = "no GPU found" if not devices else f"only CPU Vulkan devices ({', '.join(n for _, n in devices)})"
    if system == "Darwin" and arch != "arm64":
        reason = "Intel Mac or Python under Rosetta: no Metal"
    return Detection(Backend.CPU, reason)


def engine_devices(
    backend: Backend, env: Mapping[str, str], machine: Machine, architectures: Sequence[str] | None = None
) -> EngineDevices | None:
    """The devices a ``backend`` build (for CUDA ``architectures``, None: any) will use on this machine.

    None where toolpair does not look (CPU, HIP, ...).
    """
    if backend is Backend.VULKAN:
        return vulkan_devices(machine.vulkan_devices, env)
    if backend is Backend.CUDA:
        gpus = machine.nvidia_gpus
        return cuda_devices(None if gpus is None else list(gpus), env, architectures)
    return None


# --- build settings --------------------------------------------------------------------------


RPC_FLAG = "-DGGML_RPC=ON"
NO_AMX_FLAGS = ("-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8")
"""x86 builds leave out llama.cpp's AMX weight buffer (its first matrix multiply segfaults, llama.cpp #20824).

``-march=native`` on a Sapphire Rapids-class Xeon turns on ``__AMX_INT8__``,
which compiles in the AMX buffer type that takes the weights at load. An
explicit ``-mno-amx-int8`` wins over what ``-march`` implies, whatever the order,
so the native build keeps AVX-512, VNNI and the other repacked CPU kernels and
loses only the AMX path. ``TOOLPAIR_ENGINE_AMX=1`` (``engine install --amx``)
builds it in again, once llama.cpp fixes it.
"""
PORTABLE_FLAG = "-DGGML_NATIVE=OFF"
"""A build to run on other machines: llama.cpp's x86-64-v3 baseline (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX)."""
_X86 = frozenset({"x86_64", "amd64", "i386", "i686"})


CUDA_PIP_PACKAGES = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cublas==13.0.2.14",
)
"""NVIDIA's CUDA 13.0 toolkit as published on PyPI: nvcc (with cicc, ptxas, nvlink), headers, cudart, CCCL, cuBLAS.

CUDA 13, not 12: the ``-cu12`` nvcc wheels hold ptxas but no nvcc. Its builds
need an NVIDIA driver of the CUDA 13 generation (580 or newer) where they run.
"""
CUDA_NO_VMM_FLAG = "-DGGML_CUDA_NO_VMM=ON"
"""The PyPI toolkit has no ``libcuda.so`` stub to link llama.cpp's VMM memory pool against; its legacy pool works."""


@dataclass(frozen=True)
class CudaToolkit:
    """The CUDA toolkit from PyPI, installed with ``pip --target`` into a directory of its own.

    The wheels share one tree, ``nvidia/cu13/{bin,include,lib,nvvm}``; the
    install adds what a system toolkit has and the wheels lack (the
    ``targets/<arch>-linux`` directories nvcc.profile names, ``lib64``,
    unversioned ``.so`` links for CMake), see ``engine_launcher.builder.install``.
    """

    home: Path
    packages: tuple[str, ...] = CUDA_PIP_PACKAGES

    @property
    def root(self) -> Path:
        """What CMake gets as ``CUDAToolkit_ROOT``."""
        return self.home / "nvidia" / "cu13"

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def lib(self) -> Path:
        """cudart and cuBLAS, which the engine loads at run time."""
        return self.root / "lib"


@dataclass(frozen=True)
class BuildPlan:
    """What pip needs to build llama-cpp-python for one backend."""

    backend: Backend
    cmake_args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    """Prerequisites that look missing; shown before building, since the build will likely fail."""
    toolkit: CudaToolkit | None = None
    """A toolkit to install from PyPI before building (CUDA without nvcc)."""
    run_env: dict[str, str] = field(default_factory=dict)
    """What the engine's process needs in its environment to load this build (its toolkit's libraries)."""
    portable: bool = False
    """Built for llama.cpp's baseline CPU (and its list of CUDA architectures), not this machine's."""
    amx: bool = False
    """llama.cpp's AMX weight path may be compiled in: a native x86 build asked to keep it."""
    cuda_architectures: tuple[str, ...] | None = None
    """The CUDA architectures compiled for; None: llama.cpp's own list, or not a CUDA build."""

    @property
    def rpc(self) -> bool:
        """The build has llama.cpp's RPC backend (every toolpair build does)."""
        return RPC_FLAG in self.cmake_args


def _setvars_env(probes: Probes) -> dict[str, str]:
    """The environment oneAPI's setvars.sh produces, for icx and icpx."""
    out = probes.run(["bash", "-c", f". {ONEAPI_SETVARS} >/dev/null 2>&1 && env -0"])
    if not out:
        return {}
    pairs = (item.partition("=") for item in out.split("\0") if "=" in item)
    return {k: v for k, _, v in pairs}


def _has_cublas(nvcc: str, env: Mapping[str, str], probes: Probes) -> bool:
    """Whether cuBLAS lies in a toolkit next to ``nvcc`` (or at ``CUDA_PATH``, ``CUDA_HOME``, /usr/local/cuda).

    An ``nvcc`` on PATH may be a wrapper script, so its directory's parent is one guess among several.
    """
    roots = {str(Path(nvcc).parent.parent), "/usr/local/cuda"}
    roots |= {env[name] for name in ("CUDA_PATH", "CUDA_HOME", "CUDAToolkit_ROOT") if env.get(name)}
    libs = (
        "lib64",
        "lib",
        "lib/x86_64-linux-gnu",
        "lib/aarch64-linux-gnu",
        "targets/x86_64-linux/lib",
        "targets/sbsa-linux/lib",
    )
    return any(probes.exists(f"{root}/{lib}/libcublas.so") for root in sorted(roots) for lib in libs)


VULKAN_CORE_HEADER = "/usr/include/vulkan/vulkan_core.h"
VULKAN_MIN_HEADER = 261
"""Vulkan-Headers 1.3.261 brought VK_EXT_layer_settings, which the vendored llama.cpp's Vulkan backend uses."""
_LLAMA_CPP = f"(llama-cpp-python {LLAMA_CPP_VERSION})"


def vulkan_header_version(text: str) -> int | None:
    """``VK_HEADER_VERSION`` from vulkan_core.h's text (Debian 12: 239).

    >>> vulkan_header_version("#define VK_HEADER_VERSION 239\\n")
    239
    """
    found = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    return int(found.group(1)) if found else None


def truthy(value: str | None) -> bool:
    """An environment switch: ``1``, ``true``, ``yes`` or ``on``.

    >>> truthy("On"), truthy("0"), truthy(None)
    (True, False, False)
    """
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def build_plan(
    detection: Detection,
    env: Mapping[str, str],
    probes: Probes,
    *,
    portable: bool | None = None,
    amx: bool = False,
) -> BuildPlan:
    """CMake flags and environment for ``detection.backend``; the user's ``CMAKE_ARGS`` come last.

    ``portable`` (default ``TOOLPAIR_ENGINE_PORTABLE``) builds for llama.cpp's
    baseline CPU instead of this one's, and for llama.cpp's list of CUDA
    architectures instead of this machine's GPUs: for images and other machines. ``amx``
    (the ``engine_amx`` setting, ``TOOLPAIR_ENGINE_AMX``) keeps llama.cpp's AMX weight
    path in a native x86 build; see :data:`NO_AMX_FLAGS`.
    """
    backend = detection.backend
    extra = tuple(env.get("CMAKE_ARGS", "").split())
    portable = truthy(env.get("TOOLPAIR_ENGINE_PORTABLE")) if portable is None else portable
    x86 = probes.platform()[1].lower() in _X86
    # Every build can split a model across `toolpair rpc-worker` machines (llama.cpp RPC).
    common: tuple[str, ...] = (RPC_FLAG,)
    if portable:
        common += (PORTABLE_FLAG,)
    elif not amx and x86:
        common += NO_AMX_FLAGS
    build_env: dict[str, str] = {}
    run_env: dict[str, str] = {}
    toolkit: CudaToolkit | None = None
    problems: list[str] = []
    if backend is Backend.CPU:
        args: tuple[str, ...] = ()
        if not any(probes.which(cxx) for cxx in ("c++", "g++", "clang++")):
            problems.append("no C++ compiler found (c++, g++ or clang++)")
    elif backend is Backend.CUDA:
        args = ("-DGGML_CUDA=on",)
        if not portable and CUDA_ARCHITECTURES_FLAG not in " ".join(extra):
            if detection.targets:
                # The GPUs here, named: the wheel cache and the install record then say which GPUs the
                # build is for, and serve refuses it on a GPU it cannot run on (llama.cpp's "native"
                # would compile the same code under a flag that says nothing).
                args += (CUDA_ARCHITECTURES_FLAG + ";".join(detection.targets),)
            else:
                problems.append(
                    "no NVIDIA GPU here to compile for: name the GPUs the build is for with "
                    "CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 (their compute capability, 9.0 for an H100/H200), "
                    "or use --portable for llama.cpp's list of architectures"
                )
        choice = env.get("TOOLPAIR_CUDA_TOOLKIT", "").strip().lower()
        if choice not in ("", "auto", "system", "pypi"):
            problems.append(f"TOOLPAIR_CUDA_TOOLKIT={choice!r}: use auto, system or pypi")
        nvcc = env.get("CUDACXX") or probes.which("nvcc")
        if nvcc is None and probes.exists("/usr/local/cuda/bin/nvcc"):
            nvcc = build_env["CUDACXX"] = "/usr/local/cuda/bin/nvcc"
        if choice == "system" or (choice != "pypi" and nvcc is not None and _has_cublas(nvcc, env, probes)):
            if nvcc is None:
                problems.append("nvcc not found: install the CUDA toolkit or set CUDACXX")
        else:
            # No usable system toolkit (no nvcc, or one without cuBLAS, as some images have): NVIDIA's
            # from PyPI, in a directory of its own. Only planned here; install executes it.
            toolkit = CudaToolkit(cache_root(env) / "cuda-toolkit" / "cu13.0")
            args += (CUDA_NO_VMM_FLAG,)
            build_env.pop("CUDACXX", None)
            build_env.update(CUDACXX=str(toolkit.nvcc), CUDAToolkit_ROOT=str(toolkit.root))
            run_env["LD_LIBRARY_PATH"] = str(toolkit.lib)
    elif backend is Backend.HIP:
        targets = ";".join(detection.targets)
        args = ("-DGGML_HIP=on", *((f"-DAMDGPU_TARGETS={targets}",) if targets else ()))
        if not targets:
            problems.append("no AMD GPU target known: set AMDGPU_TARGETS, e.g. gfx1100")
        clang_dir = (probes.run(["hipconfig", "-l"]) or "").strip()
        rocm = (probes.run(["hipconfig", "-R"]) or "").strip()
        if "HIPCXX" not in env:
            if clang_dir:
                build_env["HIPCXX"] = f"{clang_dir}/clang"
            else:
                problems.append("hipconfig not found: install ROCm (HIP SDK) or set HIPCXX")
        if rocm and "HIP_PATH" not in env:
            build_env["HIP_PATH"] = rocm
    elif backend is Backend.SYCL:
        args = ("-DGGML_SYCL=on", "-DCMAKE_C_COMPILER=icx", "-DCMAKE_CXX_COMPILER=icpx")
        if probes.which("icpx") is None:
            build_env = _setvars_env(probes)
            if not build_env:
                problems.append(f"icpx not found and {ONEAPI_SETVARS} unusable: install the oneAPI Base Toolkit")
    elif backend is Backend.METAL:
        args = ("-DGGML_METAL=on",)
    else:
        args = ("-DGGML_VULKAN=on",)
        if probes.which("glslc") is None:
            problems.append("glslc not found: install the Vulkan SDK (libvulkan-dev and glslc)")
        if "Vulkan_INCLUDE_DIR" not in env.get("CMAKE_ARGS", "") and not env.get("VULKAN_SDK"):
            line = probes.run(["grep", "-m1", "#define VK_HEADER_VERSION ", VULKAN_CORE_HEADER])
            found = vulkan_header_version(line or "")
            if found is not None and found < VULKAN_MIN_HEADER:
                problems.append(
                    f"the Vulkan headers in /usr/include are 1.x.{found}; llama.cpp {_LLAMA_CPP} needs "
                    f"1.3.{VULKAN_MIN_HEADER} or newer (VK_EXT_layer_settings): install newer ones and pass "
                    "CMAKE_ARGS=-DVulkan_INCLUDE_DIR=DIR (on Debian 12: scripts/vulkan_headers.sh prints DIR)"
                )
    cmake_args = (*common, *args, *extra)
    build_env["CMAKE_ARGS"] = " ".join(cmake_args)
    return BuildPlan(
        backend,
        cmake_args,
        build_env,
        tuple(problems),
        toolkit,
        run_env,
        portable=not is_native_build(cmake_args),
        amx=is_native_build(cmake_args) and x86 and not any(a.endswith("-mno-amx-int8") for a in cmake_args),
        cuda_architectures=cuda_architectures(cmake_args) if backend is Backend.CUDA else None,
    )


# The Docker image's engine layer holds this module, not launch.py: install and serve both use it.
_SEARCH_PATHS = frozenset({"LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "PATH"})


def child_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``extra`` set; a search path in ``extra`` goes in front of the one in ``base``.

    >>> child_env({"LD_LIBRARY_PATH": "/a", "X": "1"}, {"LD_LIBRARY_PATH": "/cuda/lib", "X": "2"})
    {'LD_LIBRARY_PATH': '/cuda/lib:/a', 'X': '2'}
    """
    env = dict(base)
    for name, value in extra.items():
        env[name] = f"{value}:{base[name]}" if name in _SEARCH_PATHS and base.get(name) else value
    return env


_HINTS = {
    Backend.CPU: "a C/C++ compiler and CMake (Debian/Ubuntu: apt install build-essential cmake)",
    Backend.CUDA: "the CUDA toolkit with nvcc on PATH (or CUDACXX; without one, toolpair fetches CUDA 13.0 from PyPI), "
    "a matching driver, CMake and a C++ compiler",
    Backend.HIP: "ROCm with the HIP SDK, hipBLAS and rocBLAS (hipconfig on PATH), and AMDGPU_TARGETS for your GPU",
    Backend.SYCL: f"the Intel oneAPI Base Toolkit (icx, icpx; {ONEAPI_SETVARS}) and an Intel GPU driver",
    Backend.METAL: "Xcode command line tools (xcode-select --install) and CMake",
    Backend.VULKAN: "the Vulkan SDK: headers, loader, glslc and SPIR-V headers "
    "(Debian/Ubuntu: apt install libvulkan-dev glslc spirv-headers)",
}


def install_hint(backend: Backend) -> str:
    """What a build for ``backend`` needs installed, for error messages."""
    return _HINTS[backend]
