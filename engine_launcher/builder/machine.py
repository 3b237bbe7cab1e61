"""What this machine has for the engine: memory and cores. Reads the system; decides nothing.

GPUs and their memory come from ``backends``' one nvidia-smi query.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_memory", "physical_cores", "usable_cores"]


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
