"""Which CPU a native engine build is for, so a build never runs on a CPU that lacks its instructions.

A native build (llama.cpp's default ``GGML_NATIVE=ON``, ``-march=native``) uses
every instruction set of the CPU that compiled it. Run on a CPU without one of
them, say a wheel cache or a virtualenv on a disk shared by an AVX-512 host and an
AVX2 one, the engine dies with SIGILL at its first matrix multiply. So:

- the wheel cache keys a native build by the instruction sets of the CPU it
  was built on, and another CPU builds its own wheel;
- the install record keeps them, and ``serve`` stops before starting the
  engine, in one line, when this CPU lacks any.

Only instruction-set flags count (``avx512f``, ``fma``, ``asimddp``, ...): the
rest of ``/proc/cpuinfo``'s flags (``hypervisor``, ``constant_tsc``) differ
between hosts that run the same code. A portable build (``GGML_NATIVE=OFF``)
targets llama.cpp's baseline and is not tied to a CPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["instruction_sets", "is_native_build", "missing_instruction_sets"]

_INSTRUCTION_SET = re.compile(
    r"^(sse|ssse3|avx|fma|f16c|bmi|amx|popcnt|movbe|lzcnt|abm|adx|aes|pclmulqdq|vpclmulqdq|gfni|vaes|sha_ni"
    r"|asimd|sve|sme|i8mm|bf16|fphp|dotprod|rvv|vsx|altivec)"
)
_NATIVE_OFF = re.compile(r"^-DGGML_NATIVE(:BOOL)?=(OFF|0|FALSE|NO|N)$", re.IGNORECASE)
_NO_AMX = "-mno-amx-int8"


def is_native_build(cmake_args: Sequence[str]) -> bool:
    """Whether these flags build for this CPU (llama.cpp's default) rather than its portable baseline.

    >>> [is_native_build([arg]) for arg in ("-DGGML_RPC=ON", "-DGGML_NATIVE=OFF", "-DGGML_NATIVE:BOOL=0")]
    [True, False, False]
    """
    return not any(_NATIVE_OFF.match(arg) for arg in cmake_args)


def instruction_sets(flags: Iterable[str], cmake_args: Sequence[str] = ()) -> frozenset[str]:
    """The instruction-set flags a native build with ``cmake_args`` may use, out of a CPU's ``flags``.

    AMX is left out when the build leaves it out (``-mno-amx-int8``, toolpair's default on x86).

    >>> sorted(instruction_sets({"fpu", "avx2", "fma", "hypervisor", "amx_int8"}))
    ['amx_int8', 'avx2', 'fma']
    >>> sorted(instruction_sets({"avx2", "amx_int8"}, ["-DCMAKE_C_FLAGS=-mno-amx-int8"]))
    ['avx2']
    """
    no_amx = any(arg.endswith(_NO_AMX) for arg in cmake_args)
    return frozenset(flag for flag in flags if _INSTRUCTION_SET.match(flag) and not (no_amx and flag.startswith("amx")))


def missing_instruction_sets(built_for: Iterable[str], here: frozenset[str]) -> list[str]:
    """What the build's CPU had and this one lacks; nothing when this CPU's flags are unknown.

    >>> missing_instruction_sets(["avx2", "avx512f", "avx512bw"], frozenset({"avx2", "fma"}))
    ['avx512bw', 'avx512f']
    >>> missing_instruction_sets(["avx512f"], frozenset())
    []
    """
    return sorted(set(built_for) - here) if here else []
