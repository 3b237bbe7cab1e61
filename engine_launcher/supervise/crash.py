"""Why the engine died, in one or two lines a user can act on.

An engine that dies by a signal leaves llama.cpp's last debug lines behind,
which name no cause. The exit status does (``-11`` is SIGSEGV, ``-4`` SIGILL,
``-9`` SIGKILL), and together with the engine's log and this CPU's features
the known causes can be told apart:

- SIGSEGV with llama.cpp's AMX weight buffer loaded, on a CPU with AMX: the
  AMX matrix multiply crash (llama.cpp #20824).
- SIGILL: an instruction this CPU lacks, from a build made for another CPU
  (``-march=native`` elsewhere, a Docker image built on a newer machine).
- SIGKILL that toolpair did not send: almost always the kernel's
  out-of-memory killer.
- SIGBUS: the memory-mapped model file changed or shrank under the engine.
- SIGABRT: a llama.cpp assertion; its ``GGML_ASSERT`` line says which.

Pure: :func:`diagnose` takes the exit status, the log lines and the CPU flags
and returns text; the supervisor says it in its log and its status.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Diagnosis", "diagnose", "signal_name"]

AMX_ISSUE = "llama.cpp #20824"
_AMX_LOADED = re.compile(r"\bAMX\b.*buffer|buffer.*\bAMX\b", re.IGNORECASE)
_ASSERT = re.compile(r"GGML_ASSERT|GGML_ABORT|terminate called|assert(ion)? failed", re.IGNORECASE)
_OOM = re.compile(r"out of memory|failed to allocate|cannot allocate|bad_alloc", re.IGNORECASE)

_DESCRIPTIONS = {
    "SIGSEGV": "segmentation fault",
    "SIGILL": "illegal instruction",
    "SIGKILL": "killed",
    "SIGBUS": "bus error",
    "SIGABRT": "aborted",
    "SIGFPE": "arithmetic error",
    "SIGTERM": "terminated",
}


def signal_name(code: int) -> str | None:
    """The signal a child died of, by name, from its exit status (negative for a signal in asyncio/subprocess).

    A shell reports a signal as ``128 + n``; that form counts too.

    >>> signal_name(-11), signal_name(132), signal_name(1)
    ('SIGSEGV', 'SIGILL', None)
    """
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Diagnosis:
    """What happened (``what``) and, for a known cause, what to do (``fix``)."""

    what: str
    fix: str = ""
    cause: str = ""
    """A short key for a known cause: ``amx``, ``cpu``, ``oom``, ``bus``, ``assert``; empty when unknown."""

    def __str__(self) -> str:
        return self.what + (f"\n  {self.fix}" if self.fix else "")


def diagnose(code: int, log: Sequence[str], flags: Iterable[str] = (), *, when: str = "") -> Diagnosis:
    """One or two lines on why an engine process that exited with ``code`` died.

    ``when`` says what it was doing (``"during its warm-up generation"``).

    >>> diagnose(-4, [], when="during its warm-up generation").what.split(":")[0]
    'engine crashed with SIGILL (illegal instruction) during its warm-up generation'
    >>> diagnose(1, ["ValueError: Failed to load model"]).what
    'engine exited with status 1'
    """
    when = f" {when}" if when else ""
    name = signal_name(code)
    if name is None:
        return Diagnosis(f"engine exited with status {code}{when}")
    described = f"{name} ({_DESCRIPTIONS[name]})" if name in _DESCRIPTIONS else name
    head = f"engine crashed with {described}{when}"
    cpu = frozenset(flags)
    if name == "SIGSEGV" and ("amx_int8" in cpu or "amx_tile" in cpu) and any(_AMX_LOADED.search(x) for x in log):
        return Diagnosis(
            f"{head}: llama.cpp's AMX weight path crashes on this CPU ({AMX_ISSUE})",
            "unset TOOLPAIR_ENGINE_AMX (toolpair then loads the weights without AMX), or rebuild without it: "
            "`toolpair engine install --rebuild`",
            "amx",
        )
    if name == "SIGILL":
        portable = (
            ""
            if cpu and "avx2" not in cpu and "sse2" in cpu  # an x86 CPU that a portable build cannot run on
            else ", or build one for any x86-64-v3 CPU with `toolpair engine install --portable`"
        )
        return Diagnosis(
            f"{head}: it was built for another CPU and used an instruction this one lacks",
            f"rebuild it on this machine with `toolpair engine install --rebuild`{portable}",
            "cpu",
        )
    if name == "SIGKILL" or (name == "SIGABRT" and any(_OOM.search(x) for x in log)):
        return Diagnosis(
            f"{head}, most likely by the kernel for running out of memory",
            "give it less to hold: a smaller --ctx-size, fewer --parallel engines, --prompt-cache-size 0, "
            "or a smaller model (`dmesg | grep -i oom` shows the kernel's word)",
            "oom",
        )
    if name == "SIGBUS":
        return Diagnosis(
            f"{head}: the memory-mapped model file changed or shrank under it",
            "do not replace a model file in place while it is served; restart once it is whole",
            "bus",
        )
    if name == "SIGABRT":
        asserted = [x.strip() for x in log if _ASSERT.search(x)]
        if asserted:
            return Diagnosis(f"{head}: {asserted[-1][:300]}", "", "assert")
    return Diagnosis(head)
