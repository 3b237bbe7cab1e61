"""`toolpair engine install`: the wheel cache per backend, build progress and failures, install and verify.

Building llama-cpp-python takes minutes, so the build step runs a scripted
stand-in for pip here (``make test`` runs the real install with the cached CPU
wheel). Installing and verifying run real pip into a fresh virtualenv, with a
small wheel standing in for llama-cpp-python.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine_launcher.builder import install
from engine_launcher.builder.backends import (
    NO_AMX_FLAGS,
    PORTABLE_FLAG,
    RPC_FLAG,
    Backend,
    BuildPlan,
    Detection,
    EngineDevices,
    build_plan,
)
from engine_launcher.builder.cpu_features import instruction_sets, is_native_build
from engine_launcher.builder.install import (
    BuildProgress,
    InstallError,
    build_directory,
    build_wheel,
    cached_wheel,
    install_engine,
    lay_out_cuda_toolkit,
    wheel_command,
    wheel_dir,
)
from engine_launcher.builder.machine import cpu_flags
from engine_launcher.builder.record import EngineRecord, read_record
from engine_launcher.builder.version import LLAMA_CPP_VERSION
from tests.support.probes import CUBLAS, FakeProbes

ROOT = Path(__file__).resolve().parents[2]

FAKE_PIP = """#!/bin/sh
# Stands in for "python -m pip download ... -d DIR" (writes a small sdist with the RPC server's source)
# and "python -m pip wheel ... -w DIR" (prints build output, then writes a wheel or fails).
for last; do :; done
if [ "$3" = download ]; then
  echo "Collecting llama-cpp-python==0.3.36"
  src=$(mktemp -d)/llama_cpp_python-0.3.36
  mkdir -p "$src/vendor/llama.cpp/tools/rpc" "$src/vendor/llama.cpp/ggml/include/nested"
  echo "int main() { return 0; }" > "$src/vendor/llama.cpp/tools/rpc/rpc-server.cpp"
  echo "/* ggml */" > "$src/vendor/llama.cpp/ggml/include/ggml-rpc.h"
  echo "/* not a public header */" > "$src/vendor/llama.cpp/ggml/include/nested/other.h"
  mkdir -p "$last" && tar -C "$(dirname "$src")" -czf "$last/llama_cpp_python-0.3.36.tar.gz" llama_cpp_python-0.3.36
  exit 0
fi
echo "Processing ./llama_cpp_python-0.3.36.tar.gz"
echo "  Building wheel for llama-cpp-python (pyproject.toml): started"
echo "  *** Configuring CMake..."
echo "  -- The C compiler identification is GNU 12.2.0"
echo "  [  5%] Building C object vendor/llama.cpp/ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o"
echo "  [ 50%] Building CXX object vendor/llama.cpp/src/CMakeFiles/llama.dir/llama.cpp.o"
if [ "$FAKE_BUILD" = fail ]; then
  echo "  nvcc fatal   : Unsupported gpu architecture 'compute_35'"
  echo "  ERROR: Failed building wheel for llama-cpp-python"
  exit 1
fi
echo "  [100%] Linking CXX shared library vendor/llama.cpp/bin/libllama.so"
echo "  Created wheel for llama-cpp-python: filename=llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
mkdir -p "$last" && echo "fake wheel" > "$last/llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    script = tmp_path / "fake-python"
    script.write_text(FAKE_PIP)
    script.chmod(0o755)
    return str(script)


def test_the_build_bypasses_pips_wheel_cache() -> None:
    command = wheel_command("/py", "llama-cpp-python==0.3.36", Path("/w/cuda"))
    assert command[:4] == ["/py", "-m", "pip", "wheel"]
    assert "--no-cache-dir" in command and "--no-deps" in command
    assert command[command.index("--no-binary") + 1] == "llama-cpp-python"
    assert command[-2:] == ["-w", "/w/cuda"]


def test_wheels_live_in_a_directory_per_backend(tmp_path: Path) -> None:
    assert wheel_dir(Backend.CUDA, tmp_path) == tmp_path / "wheels" / "cuda"
    assert wheel_dir(Backend.CPU, tmp_path) != wheel_dir(Backend.CUDA, tmp_path)


def test_build_progress_lines() -> None:
    progress = BuildProgress()
    lines = FAKE_PIP.replace('echo "', "").splitlines()
    shown = [s for s in (progress.feed(line.strip().rstrip('"')) for line in lines) if s]
    assert shown == [
        "fetching sources",
        "configuring (CMake)",
        "compiling 5%",
        "compiling 50%",
        "compiling 100%",
        "packaging the wheel",
    ]


def test_a_build_shows_progress_and_lands_a_wheel(tmp_path: Path, fake_python: str) -> None:
    out = io.StringIO()
    plan = BuildPlan(Backend.CUDA, ("-DGGML_CUDA=on",), {"CMAKE_ARGS": "-DGGML_CUDA=on"})
    wheel = build_wheel(plan, tmp_path / "cuda", python=fake_python, env={"PATH": os.environ["PATH"]}, out=out)
    assert wheel == tmp_path / "cuda" / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl" and wheel.exists()
    text = out.getvalue()
    assert "building llama-cpp-python==0.3.36 for cuda (CMAKE_ARGS='-DGGML_CUDA=on')" in text
    assert "  compiling 50% (" in text and "built llama_cpp_python" in text
    assert json.loads((tmp_path / "cuda" / "build.json").read_text())["cmake_args"] == ["-DGGML_CUDA=on"]
    assert "Linking CXX shared library" in (tmp_path / "cuda" / "build.log").read_text()
    assert not list((tmp_path / "cuda").glob(".build-*"))  # the scratch directory is gone
    # The RPC server's source and ggml's public headers stay next to the wheel, for `rpc-server`.
    kept = tmp_path / "cuda" / install.RPC_SOURCE
    assert (kept / "rpc-server.cpp").read_text() == "int main() { return 0; }\n"
    assert sorted(p.name for p in (kept / "include").iterdir()) == ["ggml-rpc.h"]


def test_a_failed_build_shows_the_log_tail_and_what_to_install(tmp_path: Path, fake_python: str) -> None:
    plan = BuildPlan(Backend.CUDA, ("-DGGML_CUDA=on",), {"CMAKE_ARGS": "-DGGML_CUDA=on"})
    env = {"PATH": os.environ["PATH"], "FAKE_BUILD": "fail"}
    with pytest.raises(InstallError) as failed:
        build_wheel(plan, tmp_path / "cuda", python=fake_python, env=env, out=io.StringIO())
    message = str(failed.value)
    assert "building llama-cpp-python==0.3.36 for cuda failed (pip exit status 1)" in message
    assert "|   nvcc fatal   : Unsupported gpu architecture 'compute_35'" in message
    assert "a cuda build needs the CUDA toolkit with nvcc" in message
    assert cached_wheel(tmp_path / "cuda") is None  # nothing half-built is left to be reused


def fake_llama_wheel(directory: Path, tag: str = "py3-none-any") -> Path:
    """A minimal wheel named like llama-cpp-python whose gpu offload answer comes from FAKE_LLAMA_GPU."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"llama_cpp_python-{LLAMA_CPP_VERSION}.dist-info"
    files = {
        "llama_cpp/__init__.py": (
            f"import os\n__version__ = {LLAMA_CPP_VERSION!r}\n"
            "def llama_supports_gpu_offload():\n    return os.environ.get('FAKE_LLAMA_GPU') == '1'\n"
        ),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {LLAMA_CPP_VERSION}\nProvides-Extra: server\n"
        ),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: toolpair-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    records = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        records.append(f"{name},sha256={digest},{len(text.encode())}")
    records.append(f"{dist}/RECORD,,")
    path = directory / f"llama_cpp_python-{LLAMA_CPP_VERSION}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv to install into; never the one running the tests."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path


def test_install_from_the_cache_verify_and_record(tmp_path: Path, venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the stand-in wheel needs nothing from an index
    python = str(venv / "bin" / "python")
    cache = tmp_path / "cache"
    here = instruction_sets(cpu_flags(), NO_AMX_FLAGS)  # a native build is for this CPU
    wheel = fake_llama_wheel(build_directory(Backend.CPU, [RPC_FLAG, *NO_AMX_FLAGS], cache, here))
    out = io.StringIO()
    record = install_engine("cpu", python=python, cache=cache, probes=FakeProbes(), out=out)
    assert (record.backend, record.version, record.gpu_offload) == ("cpu", LLAMA_CPP_VERSION, False)
    assert record.built_for_cpu == sorted(here)
    assert record.wheel == str(wheel) and record.cmake_args == [RPC_FLAG, *NO_AMX_FLAGS]
    assert record.rpc_server is None and "no rpc-server source next to the wheel" in out.getvalue()
    assert f"using the cached wheel {wheel}" in out.getvalue()
    assert read_record(venv / "share" / "toolpair" / "engine.json") == record

    again = io.StringIO()
    assert install_engine("cpu", python=python, cache=cache, probes=FakeProbes(), out=again) == record
    assert "already installed" in again.getvalue()

    # A GPU request never takes the CPU wheel: its own directory is empty, so it must build.
    built: list[Backend] = []

    def build(plan: BuildPlan, directory: Path, **kw: object) -> Path:
        built.append(plan.backend)
        return fake_llama_wheel(directory)

    monkeypatch.setattr(install, "build_wheel", build)
    h200 = FakeProbes({"nvidia-smi --query-gpu": "0, NVIDIA H200, GPU-1, 9.0\n"}, tools=["nvcc"], files=[CUBLAS])
    with pytest.raises(InstallError, match="cuda build of llama-cpp-python reports no GPU offload"):
        install_engine("cuda", python=python, cache=cache, probes=h200, out=io.StringIO())
    assert built == [Backend.CUDA] and (cache / "wheels" / "cuda").is_dir()
    assert read_record(venv / "share" / "toolpair" / "engine.json") == record  # the failed install left no record

    # Where no such GPU exists (a docker build), the build is kept and marked unverified.
    out = io.StringIO()
    no_gpu = FakeProbes(tools=["nvcc"], files=[CUBLAS])
    unverified = install_engine("cuda", python=python, cache=cache, probes=no_gpu, out=out)
    assert (unverified.backend, unverified.gpu_offload) == ("cuda", None)
    assert "no cuda device here, so GPU offload is not verified" in out.getvalue()
    # Compiled for llama.cpp's list of architectures (no GPU to ask), so a wheel of its own.
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" not in unverified.cmake_args and built == [Backend.CUDA] * 2

    monkeypatch.setenv("FAKE_LLAMA_GPU", "1")
    cuda = install_engine("cuda", python=python, cache=cache, probes=h200, out=io.StringIO())
    assert (cuda.backend, cuda.gpu_offload) == ("cuda", True)
    # compiled for the H200 here (compute capability 9.0), not every architecture llama.cpp lists
    assert cuda.cmake_args == [RPC_FLAG, *NO_AMX_FLAGS, "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    assert built == [Backend.CUDA] * 2  # the H200's wheel, built first, is cached and reused


def test_each_set_of_cmake_flags_has_its_own_wheel_directory(tmp_path: Path) -> None:
    probes = FakeProbes(tools=["nvcc"])
    default = build_plan(Detection(Backend.CUDA, "t"), {}, probes)
    custom = build_plan(Detection(Backend.CUDA, "t"), {"CMAKE_ARGS": "-DCMAKE_CUDA_ARCHITECTURES=90"}, probes)
    where = build_directory(Backend.CUDA, default.cmake_args, tmp_path)
    assert where.parent == wheel_dir(Backend.CUDA, tmp_path)
    assert where == build_directory(Backend.CUDA, list(default.cmake_args), tmp_path)
    assert where != build_directory(Backend.CUDA, custom.cmake_args, tmp_path)
    # Flags differing only in how they split into words are different builds.
    assert build_directory(Backend.CPU, ["-DA=1 -DB=2"], tmp_path) != build_directory(
        Backend.CPU, ["-DA=1", "-DB=2"], tmp_path
    )


def test_a_native_build_is_cached_per_cpu_and_a_portable_one_is_not(tmp_path: Path) -> None:
    args = [RPC_FLAG, *NO_AMX_FLAGS]
    avx2 = instruction_sets({"sse4_2", "avx2", "fma", "hypervisor"}, args)
    avx512 = instruction_sets({"sse4_2", "avx2", "fma", "avx512f", "avx512bw", "amx_int8"}, args)
    assert avx512 == {"sse4_2", "avx2", "fma", "avx512f", "avx512bw"}, "AMX is built out, so it does not count"
    assert build_directory(Backend.CPU, args, tmp_path, avx2) != build_directory(Backend.CPU, args, tmp_path, avx512)
    # The same instruction sets on another host (other non-ISA flags) share the wheel.
    assert build_directory(Backend.CPU, args, tmp_path, avx2) == build_directory(
        Backend.CPU, args, tmp_path, instruction_sets({"sse4_2", "avx2", "fma", "constant_tsc"}, args)
    )
    assert not is_native_build([RPC_FLAG, PORTABLE_FLAG]) and is_native_build(args)


def test_a_portable_install_is_tied_to_no_cpu(tmp_path: Path, venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    cache = tmp_path / "cache"
    fake_llama_wheel(build_directory(Backend.CPU, [RPC_FLAG, PORTABLE_FLAG], cache))
    out = io.StringIO()
    portable = install_engine(
        "cpu", python=str(venv / "bin" / "python"), cache=cache, probes=FakeProbes(), portable=True, out=out
    )
    assert portable.cmake_args == [RPC_FLAG, PORTABLE_FLAG] and portable.built_for_cpu is None
    assert "using the cached wheel" in out.getvalue()


def test_the_pinned_version_matches_the_engine_extra() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"llama-cpp-python[server]=={LLAMA_CPP_VERSION}"' in text


def test_the_pypi_cuda_toolkit_gets_the_layout_nvcc_and_cmake_look_for(tmp_path: Path) -> None:
    root = tmp_path / "nvidia" / "cu13"
    (root / "lib").mkdir(parents=True)
    (root / "include").mkdir()
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libcudart_static.a"):
        (root / "lib" / name).write_bytes(b"")
    lay_out_cuda_toolkit(root, "x86_64")
    lay_out_cuda_toolkit(root, "x86_64")  # again: nothing changes, nothing fails
    assert (root / "lib64").resolve() == (root / "lib").resolve()
    assert (root / "targets" / "x86_64-linux" / "include").resolve() == (root / "include").resolve()
    assert (root / "targets" / "x86_64-linux" / "lib" / "libcudart.so.13").exists()
    for name in ("libcudart", "libcublas", "libcublasLt"):
        assert os.readlink(root / "lib" / f"{name}.so") == f"{name}.so.13"
    assert not (root / "lib" / "libcudart_static.so").exists()


def test_a_cuda_build_with_the_pypi_toolkit_installs_it_first_and_records_its_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"  # its own: the module's may hold a CUDA record of the same stand-in wheel
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("TOOLPAIR_CACHE", str(tmp_path / "cache"))
    steps: list[str] = []

    def toolkit(kit: object, python: str, out: object) -> None:
        steps.append("toolkit")

    def build(plan: BuildPlan, directory: Path, **kw: object) -> Path:
        steps.append("build")
        assert plan.env["CUDACXX"].endswith("nvidia/cu13/bin/nvcc")
        return fake_llama_wheel(directory)

    monkeypatch.setattr(install, "install_cuda_toolkit", toolkit)
    monkeypatch.setattr(install, "build_wheel", build)
    out = io.StringIO()
    record = install_engine(
        "cuda", python=str(venv / "bin" / "python"), cache=tmp_path / "cache", probes=FakeProbes(), out=out
    )
    assert steps == ["toolkit", "build"]
    assert record.run_env == {
        "LD_LIBRARY_PATH": str(tmp_path / "cache" / "cuda-toolkit" / "cu13.0" / "nvidia" / "cu13" / "lib")
    }
    assert "-DGGML_CUDA_NO_VMM=ON" in record.cmake_args and record.gpu_offload is None  # no driver in FakeProbes
    assert read_record(venv / "share" / "toolpair" / "engine.json") == record


def test_the_engine_libraries_are_found_without_loading_them(tmp_path: Path) -> None:
    """A CUDA build against PyPI's toolkit cannot be imported without the toolkit's library path."""
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    package = site / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("raise OSError('libcublas.so.13: cannot open shared object file')\n")
    assert install._engine_lib_dir(str(python)) == package / "lib"


def test_a_builds_process_env_is_its_libraries_and_the_device_choice_made_here() -> None:
    cuda = EngineRecord("cuda", "0.3.36", "w.whl", "0" * 64, None, [], run_env={"LD_LIBRARY_PATH": "/kit/lib"})
    assert cuda.process_env() == {"LD_LIBRARY_PATH": "/kit/lib"}
    software = EngineDevices(("llvmpipe",), {"GGML_VK_VISIBLE_DEVICES": "0"})
    assert cuda.process_env(software) == {"LD_LIBRARY_PATH": "/kit/lib", "GGML_VK_VISIBLE_DEVICES": "0"}
    # A device with a problem chooses nothing.
    broken = EngineDevices((), {"GGML_VK_VISIBLE_DEVICES": "0"}, problem="no device")
    assert cuda.process_env(broken) == {"LD_LIBRARY_PATH": "/kit/lib"}
