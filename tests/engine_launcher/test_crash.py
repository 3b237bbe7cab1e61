"""Crash diagnosis: an exit status, the engine's last lines and the CPU's flags in, one or two lines out."""

from __future__ import annotations

import re
from pathlib import Path

from engine_launcher.builder.machine import cpu_flags
from engine_launcher.supervise.crash import diagnose, signal_name
from proxy.cli import build_parser

AMX_LOG = ["load_tensors:          AMX model buffer size =   213.91 MiB", "graph_reserve: ..."]
AMX_CPU = {"avx512f", "amx_tile", "amx_int8", "amx_bf16"}


def test_signals_by_name_in_either_spelling() -> None:
    assert [signal_name(c) for c in (-11, -4, -9, 139, 132, 0, 1, 3)] == [
        "SIGSEGV", "SIGILL", "SIGKILL", "SIGSEGV", "SIGILL", None, None, None,
    ]  # fmt: skip


def test_the_amx_crash_needs_all_three_signs() -> None:
    amx = diagnose(-11, AMX_LOG, AMX_CPU, when="during its warm-up generation")
    assert amx.cause == "amx" and "llama.cpp #20824" in amx.what and "TOOLPAIR_ENGINE_AMX" in amx.fix
    assert str(amx).count("\n") == 1  # two lines
    assert diagnose(-11, AMX_LOG, {"avx2"}).cause == ""  # no AMX on this CPU
    assert diagnose(-11, ["graph_reserve: ..."], AMX_CPU).cause == ""  # weights not in the AMX buffer
    assert diagnose(-4, AMX_LOG, AMX_CPU).cause == "cpu"  # SIGILL is SIGILL


def test_an_illegal_instruction_suggests_a_portable_build_only_where_it_could_run() -> None:
    assert "--portable" in diagnose(-4, [], {"sse2", "avx2", "fma"}).fix
    assert "--portable" in diagnose(-4, []).fix  # flags unknown (not Linux)
    old = diagnose(-4, [], {"sse2", "sse4_2", "avx"})  # x86-64-v3 needs AVX2: only a build made here runs
    assert "--rebuild" in old.fix and "--portable" not in old.fix


def test_other_known_causes() -> None:
    assert diagnose(-9, []).cause == "oom" and "out of memory" in diagnose(-9, []).what
    assert diagnose(-6, ["ggml_aligned_malloc: insufficient memory (out of memory)"]).cause == "oom"
    abort = diagnose(-6, ["llama.cpp/ggml/src/ggml.c:1520: GGML_ASSERT(n_dims <= 4) failed"])
    assert abort.cause == "assert" and abort.what.endswith("GGML_ASSERT(n_dims <= 4) failed")
    assert diagnose(-7, []).cause == "bus"
    unknown = diagnose(-11, [], when="while serving requests")
    assert unknown == type(unknown)("engine crashed with SIGSEGV (segmentation fault) while serving requests")
    assert diagnose(2, []).what == "engine exited with status 2"


def test_cpu_flags_from_proc_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx512f amx_tile amx_int8\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx512f", "amx_tile", "amx_int8"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert isinstance(cpu_flags(), frozenset)  # this machine's, whatever it has


def test_every_command_a_diagnosis_advises_exists() -> None:
    """Advice names commands a user can run: each `toolpair ...` in a fix parses as toolpair's own command line."""
    fixes = [
        diagnose(code, log, cpu).fix
        for code, log, cpu in [
            (-11, AMX_LOG, AMX_CPU),
            (-4, [], {"sse2", "avx2"}),
            (-4, [], {"sse2"}),
            (-9, [], set()),
            (-7, [], set()),
            (-6, ["GGML_ASSERT(x) failed"], set()),
        ]
    ]
    commands = [found for fix in fixes for found in re.findall(r"`toolpair ([^`]+)`", fix)]
    assert len(commands) >= 3
    parser = build_parser()
    for command in commands:
        parser.parse_args(command.split())  # an unknown command or option exits with status 2
