"""A machine for engine_launcher's tests, described by what its tools print (tests/data/probes).

Shared by the backend, install, RPC and serve tests, which all decide from these outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["CUBLAS", "DATA", "FakeProbes", "captured"]

DATA = Path(__file__).resolve().parents[1] / "data" / "probes"

CUBLAS = "/usr/lib/x86_64-linux-gnu/libcublas.so"  # Debian's nvidia-cuda-toolkit: nvcc in /usr/bin


def captured(name: str) -> str:
    """What a tool printed on a real machine, kept in tests/data/probes."""
    return (DATA / name).read_text()


class FakeProbes:
    """A machine described by the outputs its tools print; absent tools print nothing."""

    def __init__(
        self,
        outputs: dict[str, str] | None = None,
        kfd: Sequence[str] = (),
        platform: tuple[str, str] = ("Linux", "x86_64"),
        tools: Sequence[str] = ("c++",),
        files: Sequence[str] = (),
    ) -> None:
        self.outputs = outputs or {}
        self.kfd = list(kfd)
        self.system = platform
        self.tools = set(tools)
        self.files = set(files)
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str]) -> str | None:
        self.ran.append(list(argv))
        for prefix, output in self.outputs.items():
            if " ".join(argv).startswith(prefix):
                return output
        return None

    def kfd_properties(self) -> list[str]:
        return self.kfd

    def platform(self) -> tuple[str, str]:
        return self.system

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.tools else None

    def exists(self, path: str) -> bool:
        return path in self.files
