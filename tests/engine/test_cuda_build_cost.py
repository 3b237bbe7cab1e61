"""scripts/compile_cost.sh and bench/cuda_build_cost.py: what a stopped CUDA build says about the whole one.

No CUDA compiler here does the work: the launcher wraps any command, so a real process (``cp``, and a
``python`` that burns CPU) stands in for nvcc, run from a build directory with a ``build.ninja``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "scripts" / "compile_cost.sh"

NINJA = """\
build ggml/src/CMakeFiles/ggml-cuda.dir/ggml-cuda/ggml-cuda.cu.o: CUDA_COMPILER ../ggml-cuda.cu
build ggml/src/CMakeFiles/ggml-cuda.dir/ggml-cuda/template-instances/mmq-instance-q4_0.cu.o: CUDA_COMPILER ../a.cu
build ggml/src/CMakeFiles/ggml-cuda.dir/ggml-cuda/template-instances/mmq-instance-q8_0.cu.o: CUDA_COMPILER ../b.cu
build ggml/src/CMakeFiles/ggml-cuda.dir/ggml-cuda/template-instances/fattn-vec-instance-f16-f16.cu.o: CUDA ../c.cu
build ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o: C_COMPILER ../ggml.c
"""


@pytest.fixture(scope="module")
def cost() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_build_cost", ROOT / "bench" / "cuda_build_cost.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_with_launcher(build: Path, log: Path, source: str, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMPILE_COST_LOG": str(log)}
    return subprocess.run(
        [str(LAUNCHER), *command, "-c", f"/src/ggml/src/ggml-cuda/{source}"],
        cwd=build, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_launcher_logs_cpu_seconds_and_the_builds_cuda_objects(tmp_path: Path, cost: ModuleType) -> None:
    (tmp_path / "build.ninja").write_text(NINJA)
    log = tmp_path / "cost.log"
    burn = [sys.executable, "-c", "import sys; sum(range(3_000_000)); print('compiler says', file=sys.stderr)", "--"]
    first = compile_with_launcher(tmp_path, log, "ggml-cuda.cu", *burn)
    second = compile_with_launcher(tmp_path, log, "template-instances/mmq-instance-q4_0.cu", *burn)
    failed = compile_with_launcher(tmp_path, log, "template-instances/fattn-x.cu", "false", "--")

    assert first.returncode == 0 and second.returncode == 0
    assert failed.returncode == 1, "the compiler's exit status passes through"
    assert "compiler says" in first.stderr, "the compiler's own messages still reach the build log"
    assert len(log.read_text().splitlines()) == 3 and "compiler says" not in log.read_text()
    assert len((tmp_path / "cost.log.targets").read_text().splitlines()) == 4, "only the CUDA objects"

    kinds = cost.cost_by_kind(log.read_text().splitlines(), (tmp_path / "cost.log.targets").read_text().splitlines())
    mmq = kinds["MMQ (quantized matmul) template instances"]
    assert (mmq.done, mmq.total) == (1, 2)
    assert mmq.cpu_s > 0.0, "the Python stand-in burned measurable CPU"
    assert kinds["kernels (the rest of ggml-cuda)"].total == 1


def test_an_estimate_only_when_every_kind_was_sampled(cost: ModuleType) -> None:
    targets = [
        "x/ggml-cuda.dir/ggml-cuda.cu.o",
        "x/ggml-cuda.dir/template-instances/mmq-instance-q4_0.cu.o",
        "x/ggml-cuda.dir/template-instances/mmq-instance-q8_0.cu.o",
    ]
    partial = cost.cost_by_kind(["10.0 2.0 13.0 ggml-cuda.cu"], targets)
    assert "2 files of kinds not yet compiled" in cost.report(partial)
    assert "estimated" not in cost.report(partial)

    whole = cost.cost_by_kind(
        ["10.0 2.0 13.0 ggml-cuda.cu", "100 8 120 template-instances/mmq-instance-q4_0.cu"], targets
    )
    mmq = whole["MMQ (quantized matmul) template instances"]
    assert mmq.estimate_s == pytest.approx(216.0)
    # 12 + 216 CPU seconds in all: 0.06 CPU h, 0.03 h on two cores.
    assert "estimated: 0.1 CPU h = 0.0 h on 2 idle cores" in cost.report(whole)


def test_compiler_noise_in_the_log_is_skipped(cost: ModuleType) -> None:
    kinds = cost.cost_by_kind(["warning: something odd", "1.5 0.5 2 ggml-cuda.cu", "a b c d"], [])
    assert kinds["kernels (the rest of ggml-cuda)"].cpu_s == pytest.approx(2.0)
