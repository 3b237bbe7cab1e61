"""This machine, probed once per process: CPU flags, GPUs, Vulkan devices, memory and cores.

Every fact the engine's decisions read about the machine comes from one :class:`Machine`:
backend detection, the build's CPU instruction sets, whether a build runs here, the memory
plan, a crash's diagnosis. Each fact is asked for when first needed and then kept (nvidia-smi
takes a second or more with a GPU asleep, and one ``serve`` start reads it three times), so a
choice that needs no GPU never runs a GPU tool. :func:`this_machine` is the process's one
snapshot; tests build a :class:`Machine` over fake probes, or from facts with
:meth:`Machine.described`.

Reading the machine is confined here: the parsers take the text a tool printed and return what
it says, and only :class:`SystemProbes` runs anything.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

__all__ = [
    "ONEAPI_SETVARS",
    "Machine",
    "NvidiaGpu",
    "Probes",
    "SystemProbes",
    "available_memory",
    "cpu_flags",
    "kfd_gfx_targets",
    "parse_nvidia_smi",
    "parse_rocminfo",
    "parse_sycl_ls",
    "parse_vulkaninfo",
    "physical_cores",
    "this_machine",
    "usable_cores",
    "visible_cuda_gpus",
]

ONEAPI_SETVARS = "/opt/intel/oneapi/setvars.sh"
SMI_QUERY = ("nvidia-smi", "--query-gpu=index,name,uuid,compute_cap,memory.free", "--format=csv,noheader,nounits")
"""The one nvidia-smi query: detection, the devices check and the memory plan all read its answer."""


# --- parsers: tool output in, facts out -------------------------------------------------------


@dataclass(frozen=True)
class NvidiaGpu:
    index: str
    name: str
    uuid: str = ""
    compute_cap: str = ""
    memory_free: int | None = None
    """Free memory in bytes, when the listing says (the query's fifth column, in MiB)."""


_SMI_LIST = re.compile(r"^GPU (\d+): (.+?)(?: \(UUID: ([^)]+)\))?\s*$")


def parse_nvidia_smi(text: str) -> list[NvidiaGpu]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,uuid,compute_cap,memory.free`` (CSV) or ``nvidia-smi -L``.

    >>> parse_nvidia_smi("0, NVIDIA H200, GPU-1a2b, 9.0, 143000\\n")
    [NvidiaGpu(index='0', name='NVIDIA H200', uuid='GPU-1a2b', compute_cap='9.0', memory_free=149946368000)]
    """
    gpus: list[NvidiaGpu] = []
    for line in text.splitlines():
        line = line.strip()
        listed = _SMI_LIST.match(line)
        if listed:
            gpus.append(NvidiaGpu(listed.group(1), listed.group(2).strip(), listed.group(3) or ""))
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            uuid = parts[2] if len(parts) > 2 else ""
            cap = parts[3] if len(parts) > 3 and re.fullmatch(r"\d+\.\d+", parts[3]) else ""
            free = int(parts[4]) * 1024 * 1024 if len(parts) > 4 and parts[4].isdigit() else None
            gpus.append(NvidiaGpu(parts[0], parts[1], uuid, cap, free))
    return gpus


def visible_cuda_gpus(gpus: Sequence[NvidiaGpu], env: Mapping[str, str]) -> list[NvidiaGpu]:
    """The GPUs a CUDA program may use under ``CUDA_VISIBLE_DEVICES``.

    Like the CUDA runtime: unset means all; an index or a (prefix of a) UUID
    selects one; the list ends at the first entry that names no device; an
    empty value, or ``-1``, hides them all. MIG instances count as visible.

    >>> gpus = [NvidiaGpu("0", "A"), NvidiaGpu("1", "B", "GPU-77aa")]
    >>> [g.name for g in visible_cuda_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-77,0"})]
    ['B', 'A']
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(gpus)
    chosen: list[NvidiaGpu] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.startswith("MIG-") and gpus:
            chosen.append(gpus[0])
            continue
        match = next(
            (g for g in gpus if g.index == entry or (entry.startswith("GPU-") and g.uuid.startswith(entry))), None
        )
        if match is None:
            break
        if match not in chosen:
            chosen.append(match)
    return chosen


def kfd_gfx_targets(properties: Sequence[str]) -> list[str]:
    """gfx targets from the ``properties`` files of ``/sys/class/kfd/kfd/topology/nodes/*``.

    ``gfx_target_version`` packs major, minor and stepping as decimal digit
    pairs; the stepping is written in hex in the target name. CPU nodes say 0.

    >>> kfd_gfx_targets(["gfx_target_version 0", "gfx_target_version 90010", "gfx_target_version 110000"])
    ['gfx90a', 'gfx1100']
    """
    targets: list[str] = []
    for text in properties:
        found = re.search(r"^gfx_target_version\s+(\d+)\s*$", text, re.MULTILINE)
        if not found or int(found.group(1)) == 0:
            continue
        version = int(found.group(1))
        major, minor, stepping = version // 10000, version // 100 % 100, version % 100
        target = f"gfx{major}{minor:x}{stepping:x}"
        if target not in targets:
            targets.append(target)
    return targets


def parse_rocminfo(text: str) -> list[str]:
    """gfx targets of the GPU agents that ``rocminfo`` lists.

    >>> parse_rocminfo("  Name:                    gfx1100\\n  Device Type:             GPU\\n")
    ['gfx1100']
    """
    targets: list[str] = []
    for found in re.finditer(r"^\s*Name:\s+(gfx[0-9a-f]+)\b", text, re.MULTILINE):
        if found.group(1) not in targets:
            targets.append(found.group(1))
    return targets


def parse_sycl_ls(text: str) -> list[str]:
    """Names of Intel GPUs that ``sycl-ls`` reports (Level Zero or OpenCL).

    >>> parse_sycl_ls("[level_zero:gpu][level_zero:0] Intel(R) Level-Zero, Intel(R) Arc(TM) A770 Graphics 1.3 [1.3]")
    ['Intel(R) Arc(TM) A770 Graphics']
    """
    names: list[str] = []
    for line in text.splitlines():
        head = re.match(r"^\s*\[([^\]]*:gpu[^\]]*)\](?:\[[^\]]*\])?\s*(.*)$", line)
        if not head or "Intel" not in head.group(2):
            continue
        # "<platform>, <device name> <version> [<driver>]"
        device = head.group(2).split(",", 1)[-1].strip()
        device = re.sub(r"\s+(?:OpenCL\s+)?[\d.]+(?:\s+NEO)?\s*\[[^\]]*\]\s*$", "", device).strip()
        if device and device not in names:
            names.append(device)
    return names


def parse_vulkaninfo(text: str) -> list[tuple[str, str]]:
    """``(device type, device name)`` pairs from ``vulkaninfo --summary``.

    >>> parse_vulkaninfo("GPU0:\\n\\tdeviceType = PHYSICAL_DEVICE_TYPE_CPU\\n\\tdeviceName = llvmpipe\\n")
    [('PHYSICAL_DEVICE_TYPE_CPU', 'llvmpipe')]
    """
    devices: list[tuple[str, str]] = []
    kind = ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if key == "deviceType":
            kind = value
        elif key == "deviceName" and kind:
            devices.append((kind, value))
            kind = ""
    return devices


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """This CPU's feature flags as Linux lists them (``amx_int8``, ``avx512f``, ...); empty elsewhere."""
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable in bytes (Linux), or None where the machine does not say."""
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def usable_cores() -> int:
    """Logical CPUs this process may run on (its affinity mask, so a container's limit counts)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


def physical_cores(sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """Physical cores among the usable CPUs: hyper-threads of one core count once.

    llama.cpp's generation is bound by memory bandwidth and gains nothing from a
    core's second thread; where the topology cannot be read, every usable CPU counts.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return usable_cores()
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return usable_cores()
        cores.add((package, core))
    return max(len(cores), 1)


# --- probes: the only place that touches the machine ------------------------------------------


class Probes(Protocol):
    """What detection may look at. Each method returns None when the tool is absent or fails."""

    def run(self, argv: Sequence[str]) -> str | None: ...

    def kfd_properties(self) -> list[str]: ...

    def platform(self) -> tuple[str, str]: ...

    def which(self, name: str) -> str | None: ...

    def exists(self, path: str) -> bool: ...


class SystemProbes:
    """Probes of the real machine, each bounded by ``timeout`` seconds."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout

    def run(self, argv: Sequence[str]) -> str | None:
        if shutil.which(argv[0]) is None:
            return None
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    def kfd_properties(self) -> list[str]:
        nodes = Path("/sys/class/kfd/kfd/topology/nodes")
        texts = []
        for props in sorted(nodes.glob("*/properties")):
            try:
                texts.append(props.read_text())
            except OSError:
                continue
        return texts

    def platform(self) -> tuple[str, str]:
        uname = os.uname()
        return uname.sysname, uname.machine

    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def exists(self, path: str) -> bool:
        return Path(path).exists()


class Machine:
    """One machine's facts, each probed on first use and then kept for the life of the object."""

    def __init__(self, probes: Probes) -> None:
        self._probes = probes

    @classmethod
    def described(cls, **facts: object) -> Machine:
        """A machine given by its facts (``cpu_flags=...``, ``nvidia_gpus=...``); a fact not given is unknown.

        >>> Machine.described(platform=("Linux", "aarch64")).platform
        ('Linux', 'aarch64')
        """
        machine = cls(_NothingThere())
        for name, value in facts.items():
            if not isinstance(getattr(cls, name, None), cached_property):
                raise TypeError(f"Machine has no fact {name!r}")
            machine.__dict__[name] = value
        return machine

    @property
    def probes(self) -> Probes:
        """The probes it asks (the build also asks them for its tools: compilers, SDKs)."""
        return self._probes

    @cached_property
    def platform(self) -> tuple[str, str]:
        """``(system, machine)`` as ``uname`` says: ``("Linux", "x86_64")``."""
        return self._probes.platform()

    @cached_property
    def rosetta(self) -> bool:
        """Python runs translated under Rosetta on Apple silicon (macOS only)."""
        if self.platform[0] != "Darwin":
            return False
        return (self._probes.run(["sysctl", "-n", "sysctl.proc_translated"]) or "0").strip() == "1"

    @cached_property
    def nvidia_gpus(self) -> tuple[NvidiaGpu, ...] | None:
        """Every NVIDIA GPU nvidia-smi lists (CUDA_VISIBLE_DEVICES not applied); None without a working nvidia-smi."""
        smi = self._probes.run(SMI_QUERY)
        if smi is None:
            smi = self._probes.run(["nvidia-smi", "-L"])
        return None if smi is None else tuple(parse_nvidia_smi(smi))

    @cached_property
    def amd_targets(self) -> tuple[str, ...]:
        """gfx targets of the AMD GPUs (the kernel's KFD topology, else rocminfo)."""
        found = kfd_gfx_targets(self._probes.kfd_properties()) or parse_rocminfo(self._probes.run(["rocminfo"]) or "")
        return tuple(found)

    @cached_property
    def intel_gpus(self) -> tuple[str, ...]:
        """Intel GPUs that ``sycl-ls`` reports."""
        return tuple(parse_sycl_ls(self._probes.run(["sycl-ls"]) or ""))

    @cached_property
    def oneapi(self) -> bool:
        """Intel's oneAPI compilers are installed (``icpx`` on PATH or its setvars.sh)."""
        return self._probes.which("icpx") is not None or self._probes.exists(ONEAPI_SETVARS)

    @cached_property
    def vulkan_devices(self) -> tuple[tuple[str, str], ...]:
        """``(device type, device name)`` of each Vulkan device ``vulkaninfo --summary`` lists."""
        return tuple(parse_vulkaninfo(self._probes.run(["vulkaninfo", "--summary"]) or ""))

    @cached_property
    def cpu_flags(self) -> frozenset[str]:
        """This CPU's feature flags as Linux lists them (``amx_int8``, ``avx512f``, ...); empty elsewhere."""
        return cpu_flags()

    @cached_property
    def memory_available(self) -> int | None:
        """MemAvailable in bytes when first asked (Linux), or None where the machine does not say."""
        return available_memory()

    @cached_property
    def physical_cores(self) -> int:
        return physical_cores()

    @cached_property
    def usable_cores(self) -> int:
        return usable_cores()


class _NothingThere:
    """Probes of a machine described by its facts: any fact not given is unknown (no tool, no GPU)."""

    def run(self, argv: Sequence[str]) -> str | None:
        return None

    def kfd_properties(self) -> list[str]:
        return []

    def platform(self) -> tuple[str, str]:
        return ("Linux", "x86_64")

    def which(self, name: str) -> str | None:
        return None

    def exists(self, path: str) -> bool:
        return False


@functools.cache
def this_machine() -> Machine:
    """This process's one snapshot of the machine it runs on."""
    return Machine(SystemProbes(timeout=10.0))
