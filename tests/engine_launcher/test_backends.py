"""Backend detection and build plans, from the outputs that the probed tools print (tests/data/probes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_launcher.builder.backends import (
    CUDA_NO_VMM_FLAG,
    NO_AMX_FLAGS,
    PORTABLE_FLAG,
    RPC_FLAG,
    Backend,
    Detection,
    build_plan,
    cuda_architectures,
    cuda_devices,
    detect_backend,
    engine_devices,
    parse_backend,
    runs_on_compute_capability,
    vulkan_devices,
)
from engine_launcher.builder.machine import (
    Machine,
    NvidiaGpu,
    SystemProbes,
    kfd_gfx_targets,
    parse_nvidia_smi,
    parse_rocminfo,
    parse_sycl_ls,
    parse_vulkaninfo,
    visible_cuda_gpus,
)
from proxy.config import load_settings
from tests.support.probes import CUBLAS, FakeProbes, captured


def test_nvidia_smi_query_and_list_forms() -> None:
    assert parse_nvidia_smi(captured("nvidia-smi-query-h200.txt")) == [
        NvidiaGpu("0", "NVIDIA H200", "GPU-3f9c2a61-7d4e-4b8a-9c1e-5a2b7e8d0f13", "9.0")
    ]
    listed = parse_nvidia_smi(captured("nvidia-smi-L.txt"))
    assert [(g.index, g.name, g.uuid[:12]) for g in listed] == [
        ("0", "Tesla T4", "GPU-0c1d2e3f"),
        ("1", "Tesla T4", "GPU-9f8e7d6c"),
    ]
    assert parse_nvidia_smi(captured("nvidia-smi-no-driver.txt")) == []


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3060"]),
        ("1", ["NVIDIA GeForce RTX 3060"]),
        ("1,0", ["NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 4090"]),
        ("GPU-77aa88bb", ["NVIDIA GeForce RTX 3060"]),
        ("0,7,1", ["NVIDIA GeForce RTX 4090"]),  # the list ends at the first unknown device
        ("", []),
        ("-1", []),
        ("NoDevFiles", []),
    ],
)
def test_cuda_visible_devices_is_honoured(value: str | None, names: list[str]) -> None:
    gpus = parse_nvidia_smi(captured("nvidia-smi-query-two.txt"))
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert [g.name for g in visible_cuda_gpus(gpus, env)] == names


def test_rocm_targets_from_kfd_sysfs_and_rocminfo() -> None:
    assert kfd_gfx_targets([captured("kfd-node0-cpu.txt"), captured("kfd-node1-gfx1100.txt")]) == ["gfx1100"]
    assert kfd_gfx_targets(["gfx_target_version 90402", "gfx_target_version 100302"]) == ["gfx942", "gfx1032"]
    assert parse_rocminfo(captured("rocminfo-gfx90a.txt")) == ["gfx90a"]


def test_sycl_ls_finds_intel_gpus_in_both_formats() -> None:
    assert parse_sycl_ls(captured("sycl-ls-arc.txt")) == ["Intel(R) Arc(TM) A770 Graphics"]
    assert parse_sycl_ls(captured("sycl-ls-old-format.txt")) == ["Intel(R) UHD Graphics 770"]
    assert parse_sycl_ls(captured("sycl-ls-cpu-only.txt")) == []


def test_vulkaninfo_summary_devices() -> None:
    assert parse_vulkaninfo(captured("vulkaninfo-summary-radv.txt")) == [
        ("PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", "AMD Radeon RX 6800 XT (RADV NAVI21)"),
        ("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe (LLVM 17.0.6, 256 bits)"),
    ]


SMI = "nvidia-smi --query-gpu"


@pytest.mark.parametrize(
    ("probes", "env", "backend", "targets"),
    [
        (FakeProbes({SMI: captured("nvidia-smi-query-h200.txt")}), {}, Backend.CUDA, ("90",)),
        (FakeProbes({"nvidia-smi -L": captured("nvidia-smi-L.txt")}), {}, Backend.CUDA, ()),
        # CUDA hidden: the next probe decides.
        (
            FakeProbes(
                {SMI: captured("nvidia-smi-query-h200.txt"), "vulkaninfo": captured("vulkaninfo-summary-radv.txt")}
            ),
            {"CUDA_VISIBLE_DEVICES": ""},
            Backend.VULKAN,
            (),
        ),
        (
            FakeProbes(kfd=[captured("kfd-node0-cpu.txt"), captured("kfd-node1-gfx1100.txt")]),
            {},
            Backend.HIP,
            ("gfx1100",),
        ),
        (FakeProbes({"rocminfo": captured("rocminfo-gfx90a.txt")}), {}, Backend.HIP, ("gfx90a",)),
        (
            FakeProbes({"rocminfo": captured("rocminfo-gfx90a.txt")}),
            {"AMDGPU_TARGETS": "gfx90a;gfx942"},
            Backend.HIP,
            ("gfx90a", "gfx942"),
        ),
        (FakeProbes({"sycl-ls": captured("sycl-ls-arc.txt")}, tools=["icpx"]), {}, Backend.SYCL, ()),
        # An Intel GPU without oneAPI cannot build SYCL.
        (FakeProbes({"sycl-ls": captured("sycl-ls-arc.txt")}), {}, Backend.CPU, ()),
        (FakeProbes(platform=("Darwin", "arm64")), {}, Backend.METAL, ()),
        (FakeProbes({"sysctl": "1\n"}, platform=("Darwin", "arm64")), {}, Backend.CPU, ()),  # under Rosetta
        (FakeProbes(platform=("Darwin", "x86_64")), {}, Backend.CPU, ()),
        (FakeProbes({"vulkaninfo": captured("vulkaninfo-summary-radv.txt")}), {}, Backend.VULKAN, ()),
        (FakeProbes({"vulkaninfo": captured("vulkaninfo-summary-llvmpipe.txt")}), {}, Backend.CPU, ()),
        (FakeProbes(), {}, Backend.CPU, ()),
    ],
)
def test_detection_order(probes: FakeProbes, env: dict[str, str], backend: Backend, targets: tuple[str, ...]) -> None:
    found = detect_backend(env, Machine(probes))
    assert (found.backend, found.targets) == (backend, targets), found.reason


def test_an_explicit_choice_wins_without_probing_for_others() -> None:
    probes = FakeProbes({SMI: captured("nvidia-smi-query-h200.txt")})
    assert detect_backend({}, Machine(probes), explicit="vulkan") == Detection(Backend.VULKAN, "chosen explicitly")
    assert probes.ran == []
    assert detect_backend({}, Machine(probes), explicit="auto").backend is Backend.CUDA


def test_unknown_backend_names_are_refused() -> None:
    assert parse_backend("auto") is None and parse_backend(" Metal ") is Backend.METAL
    with pytest.raises(ValueError, match="unknown backend 'rocm'"):
        parse_backend("rocm")


def test_build_plans_per_backend() -> None:
    tools = ["c++", "nvcc", "glslc", "icpx"]
    hip_probes = FakeProbes({"hipconfig -l": "/opt/rocm/llvm/bin\n", "hipconfig -R": "/opt/rocm\n"}, tools=tools)
    cases = {
        Backend.CPU: ((), {}),
        Backend.CUDA: (("-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90"), {}),
        Backend.METAL: (("-DGGML_METAL=on",), {}),
        Backend.VULKAN: (("-DGGML_VULKAN=on",), {}),
        Backend.SYCL: (("-DGGML_SYCL=on", "-DCMAKE_C_COMPILER=icx", "-DCMAKE_CXX_COMPILER=icpx"), {}),
    }
    for backend, (args, extra_env) in cases.items():
        plan = build_plan(Detection(backend, "test", ("90",)), {}, FakeProbes(tools=tools, files=[CUBLAS]))
        # every backend can use RPC workers, and an x86 build leaves out the AMX weight path
        assert plan.cmake_args == (RPC_FLAG, *NO_AMX_FLAGS, *args) and plan.problems == ()
        assert plan.env == {"CMAKE_ARGS": " ".join((RPC_FLAG, *NO_AMX_FLAGS, *args)), **extra_env}
    hip = build_plan(Detection(Backend.HIP, "test", ("gfx1100", "gfx90a")), {}, hip_probes)
    assert hip.cmake_args == (RPC_FLAG, *NO_AMX_FLAGS, "-DGGML_HIP=on", "-DAMDGPU_TARGETS=gfx1100;gfx90a")
    assert hip.env["HIPCXX"] == "/opt/rocm/llvm/bin/clang" and hip.env["HIP_PATH"] == "/opt/rocm"
    assert "GGML_HIPBLAS" not in hip.env["CMAKE_ARGS"]  # the old flag is ignored by llama.cpp now


def test_the_users_cmake_args_come_last() -> None:
    plan = build_plan(
        Detection(Backend.CUDA, "test"),
        {"CMAKE_ARGS": "-DCMAKE_CUDA_ARCHITECTURES=90"},
        FakeProbes(tools=["nvcc"], files=[CUBLAS]),
    )
    assert plan.env["CMAKE_ARGS"] == " ".join(
        ("-DGGML_RPC=ON", *NO_AMX_FLAGS, "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90")
    )


def test_cpu_code_amx_and_portable_choices() -> None:
    """Native x86 builds leave out AMX unless asked; a portable build is llama.cpp's baseline; Arm is untouched."""
    cpu = Detection(Backend.CPU, "t")
    x86, arm = FakeProbes(tools=["c++"]), FakeProbes(tools=["c++"], platform=("Linux", "aarch64"))
    assert build_plan(cpu, {}, x86).cmake_args == (RPC_FLAG, *NO_AMX_FLAGS)
    assert build_plan(cpu, {}, x86, amx=True).cmake_args == (RPC_FLAG,)
    # TOOLPAIR_ENGINE_AMX is read once, into the settings (engine_amx), which install and serve pass on.
    amx_setting = load_settings({}, {"TOOLPAIR_ENGINE_AMX": "1"}).engine_amx
    assert build_plan(cpu, {"TOOLPAIR_ENGINE_AMX": "1"}, x86, amx=amx_setting).cmake_args == (RPC_FLAG,)
    assert build_plan(cpu, {}, arm).cmake_args == (RPC_FLAG,)  # -mno-amx-int8 is not an Arm compiler flag
    for probes in (x86, arm):
        assert build_plan(cpu, {}, probes, portable=True).cmake_args == (RPC_FLAG, PORTABLE_FLAG)
        assert build_plan(cpu, {"TOOLPAIR_ENGINE_PORTABLE": "yes"}, probes).cmake_args == (RPC_FLAG, PORTABLE_FLAG)
    assert build_plan(cpu, {"TOOLPAIR_ENGINE_PORTABLE": "1"}, x86, portable=False).cmake_args[1:] == NO_AMX_FLAGS


def test_missing_prerequisites_are_named_before_the_build() -> None:
    bare = FakeProbes(tools=[])
    assert (
        build_plan(
            Detection(Backend.CUDA, "t"),
            {},
            FakeProbes(tools=[], files=["/usr/local/cuda/bin/nvcc", "/usr/local/cuda/lib64/libcublas.so"]),
        ).env["CUDACXX"]
        == "/usr/local/cuda/bin/nvcc"
    )
    hip = build_plan(Detection(Backend.HIP, "t"), {}, bare).problems
    assert any("AMDGPU_TARGETS" in p for p in hip) and any("hipconfig" in p for p in hip)
    assert "glslc" in build_plan(Detection(Backend.VULKAN, "t"), {}, bare).problems[0]
    assert "oneAPI" in build_plan(Detection(Backend.SYCL, "t"), {}, bare).problems[0]
    assert "C++ compiler" in build_plan(Detection(Backend.CPU, "t"), {}, bare).problems[0]


def test_sycl_takes_the_compilers_from_oneapi_setvars() -> None:
    probes = FakeProbes({"bash -c": "PATH=/opt/intel/oneapi/compiler/bin:/usr/bin\0ONEAPI_ROOT=/opt/intel/oneapi\0"})
    plan = build_plan(Detection(Backend.SYCL, "t"), {}, probes)
    assert plan.env["ONEAPI_ROOT"] == "/opt/intel/oneapi" and plan.env["PATH"].startswith("/opt/intel/oneapi")
    assert plan.problems == ()


def test_system_probes_on_this_machine_answer_quickly() -> None:
    probes = SystemProbes(timeout=2.0)
    assert probes.run(["definitely-not-a-tool-here"]) is None
    assert probes.run(["python3", "-c", "import sys; sys.exit(1)"]) is None
    assert probes.run(["python3", "-c", "print('hi')"]) == "hi\n"
    assert detect_backend({}, Machine(probes)).backend in set(Backend)


def test_without_nvcc_a_cuda_build_uses_nvidias_toolkit_from_pypi_in_a_directory_of_its_own() -> None:
    plan = build_plan(Detection(Backend.CUDA, "t", ("90",)), {"TOOLPAIR_CACHE": "/c"}, FakeProbes(tools=["c++"]))
    assert plan.problems == () and plan.toolkit is not None
    root = Path("/c/cuda-toolkit/cu13.0/nvidia/cu13")
    assert plan.toolkit.root == root and any(p.startswith("nvidia-cuda-nvcc==13.") for p in plan.toolkit.packages)
    assert plan.env["CUDACXX"] == str(root / "bin" / "nvcc") and plan.env["CUDAToolkit_ROOT"] == str(root)
    assert plan.cmake_args == (
        RPC_FLAG,
        *NO_AMX_FLAGS,
        "-DGGML_CUDA=on",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
        CUDA_NO_VMM_FLAG,
    )
    assert plan.run_env == {"LD_LIBRARY_PATH": str(root / "lib")}  # the engine loads cudart and cuBLAS from there
    # A system toolkit with cuBLAS, or the user's own nvcc in one, wins: nothing is fetched and VMM stays on.
    for env, probes in (
        ({}, FakeProbes(tools=["nvcc"], files=[CUBLAS])),
        ({"CUDACXX": "/opt/cuda/bin/nvcc"}, FakeProbes(files=["/opt/cuda/lib64/libcublas.so"])),
        ({"TOOLPAIR_CUDA_TOOLKIT": "system"}, FakeProbes(tools=["nvcc"])),
    ):
        system = build_plan(Detection(Backend.CUDA, "t"), env, probes)
        assert system.toolkit is None and system.run_env == {} and CUDA_NO_VMM_FLAG not in system.cmake_args
    # An nvcc with no cuBLAS beside it (this machine's image: a wrapper in /usr/local/bin and a CUDA 13
    # without cuBLAS in /usr/local/cuda), or TOOLPAIR_CUDA_TOOLKIT=pypi: the PyPI toolkit.
    for env, probes in (
        ({}, FakeProbes(tools=["nvcc"])),
        ({"TOOLPAIR_CUDA_TOOLKIT": "pypi"}, FakeProbes(tools=["nvcc"], files=[CUBLAS])),
    ):
        pypi = build_plan(Detection(Backend.CUDA, "t"), {"TOOLPAIR_CACHE": "/c", **env}, probes)
        assert pypi.toolkit is not None and pypi.env["CUDACXX"] == str(root / "bin" / "nvcc")


LLVMPIPE_ONLY = [("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe (LLVM 15.0.6, 256 bits)")]


def test_a_vulkan_build_on_a_software_device_only_is_pointed_at_it() -> None:
    """llama.cpp passes over CPU-type Vulkan devices unless GGML_VK_VISIBLE_DEVICES names one."""
    here = parse_vulkaninfo(captured("vulkaninfo-summary-llvmpipe-mesa22.txt"))  # this project's build machine
    assert here == LLVMPIPE_ONLY
    assert detect_backend(
        {}, Machine(FakeProbes({"vulkaninfo": captured("vulkaninfo-summary-llvmpipe-mesa22.txt")}))
    ).backend is (Backend.CPU)  # auto-detection keeps the faster CPU build
    chosen = vulkan_devices(here, {})
    assert chosen.env == {"GGML_VK_VISIBLE_DEVICES": "0"} and chosen.names == (LLVMPIPE_ONLY[0][1],)
    assert "CPU-type" in chosen.note and chosen.problem is None
    # A real GPU is llama.cpp's own choice: nothing is set.
    radv = vulkan_devices(parse_vulkaninfo(captured("vulkaninfo-summary-radv.txt")), {})
    assert radv.env == {} and radv.names == ("AMD Radeon RX 6800 XT (RADV NAVI21)",)
    # The user's own choice is left alone, and named.
    mine = vulkan_devices(parse_vulkaninfo(captured("vulkaninfo-summary-radv.txt")), {"GGML_VK_VISIBLE_DEVICES": "1"})
    assert mine.env == {} and mine.names == ("llvmpipe (LLVM 17.0.6, 256 bits)",) and "yours" in mine.note
    none = vulkan_devices([], {})
    assert none.names == () and none.problem is not None and "mesa-vulkan-drivers" in none.problem
    probes = FakeProbes({"vulkaninfo": captured("vulkaninfo-summary-llvmpipe-mesa22.txt")})
    assert engine_devices(Backend.VULKAN, {}, Machine(probes)) == chosen
    assert engine_devices(Backend.CPU, {}, Machine(probes)) is None


def test_a_cuda_build_without_driver_or_device_is_one_line_saying_what_to_do() -> None:
    assert cuda_devices(None, {}).fatal and not vulkan_devices([], {}).fatal  # a Vulkan build falls back
    no_driver = cuda_devices(None, {}).problem
    assert no_driver is not None and "no CUDA driver was found" in no_driver and "\n" not in no_driver
    assert "install the NVIDIA driver" in no_driver and "--backend cpu" in no_driver
    gpus = parse_nvidia_smi(captured("nvidia-smi-query-h200.txt"))
    hidden = cuda_devices(gpus, {"CUDA_VISIBLE_DEVICES": ""}).problem
    assert hidden is not None and "no CUDA device is visible (CUDA_VISIBLE_DEVICES='')" in hidden
    assert cuda_devices(gpus, {}) == cuda_devices(gpus, {}).__class__(("CUDA0: NVIDIA H200",))
    # nvidia-smi absent (no driver) or failing: the same line, from the machine's probes.
    assert engine_devices(Backend.CUDA, {}, Machine(FakeProbes())) == cuda_devices(None, {})
    smi = FakeProbes({SMI: captured("nvidia-smi-query-h200.txt")})
    assert engine_devices(Backend.CUDA, {}, Machine(smi)) == cuda_devices(gpus, {})


def test_vulkan_headers_too_old_for_llama_cpp_are_named_before_the_build() -> None:
    debian12 = FakeProbes({"grep -m1 #define VK_HEADER_VERSION": "#define VK_HEADER_VERSION 239\n"}, tools=["glslc"])
    old = build_plan(Detection(Backend.VULKAN, "t"), {}, debian12).problems
    assert len(old) == 1 and "1.x.239" in old[0] and "scripts/vulkan_headers.sh" in old[0]
    newer = {"CMAKE_ARGS": "-DVulkan_INCLUDE_DIR=/h/usr/include"}
    plan = build_plan(Detection(Backend.VULKAN, "t"), newer, debian12)
    assert plan.problems == () and plan.cmake_args[-1] == "-DVulkan_INCLUDE_DIR=/h/usr/include"
    recent = FakeProbes({"grep -m1 #define VK_HEADER_VERSION": "#define VK_HEADER_VERSION 309\n"}, tools=["glslc"])
    assert build_plan(Detection(Backend.VULKAN, "t"), {}, recent).problems == ()


def test_a_cuda_build_is_compiled_for_the_gpus_here() -> None:
    """One architecture instead of llama.cpp's whole list: a fraction of the compile."""
    tools, files = ["nvcc"], [CUBLAS]
    two = FakeProbes({SMI: captured("nvidia-smi-query-two.txt")}, tools=tools, files=files)
    detected = detect_backend({}, Machine(two))
    assert detected.targets == ("89", "86")
    plan = build_plan(detected, {}, two)
    assert plan.cmake_args[-1] == "-DCMAKE_CUDA_ARCHITECTURES=89;86"
    assert cuda_architectures(plan.cmake_args) == ("89", "86")
    # Asked for explicitly, CUDA is still compiled for the GPUs nvidia-smi lists (the visible ones).
    h200 = FakeProbes({SMI: captured("nvidia-smi-query-h200.txt")}, tools=tools, files=files)
    assert detect_backend({}, Machine(h200), explicit="cuda").targets == ("90",)
    assert detect_backend({"CUDA_VISIBLE_DEVICES": "1"}, Machine(two), explicit="cuda").targets == ("86",)
    # No GPU here (a build box), a portable build, or the user's own list: llama.cpp's or the user's.
    bare = FakeProbes(tools=tools, files=files)
    blind = build_plan(detect_backend({}, Machine(bare), "cuda"), {}, bare)
    assert cuda_architectures(blind.cmake_args) is None
    assert blind.problems == (
        "no NVIDIA GPU here to compile for: name the GPUs the build is for with "
        "CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 (their compute capability, 9.0 for an H100/H200), "
        "or use --portable for llama.cpp's list of architectures",
    )
    assert cuda_architectures(build_plan(detected, {}, two, portable=True).cmake_args) is None
    mine = build_plan(detected, {"CMAKE_ARGS": "-DCMAKE_CUDA_ARCHITECTURES=120a-real"}, two)
    assert [a for a in mine.cmake_args if "ARCHITECTURES" in a] == ["-DCMAKE_CUDA_ARCHITECTURES=120a-real"]
    assert cuda_architectures(mine.cmake_args) == ("120a-real",)
    # Other backends never get it.
    assert not any("CUDA_ARCH" in a for a in build_plan(Detection(Backend.CPU, "t", ("90",)), {}, two).cmake_args)


@pytest.mark.parametrize(
    ("arch", "runs_on", "not_on"),
    [
        ("90", ["9.0", "10.0", "12.0"], ["8.9", "8.0"]),  # machine code and PTX: later GPUs compile the PTX
        ("86-real", ["8.6", "8.9"], ["8.0", "9.0"]),  # machine code alone: its major version, same minor or later
        ("80-virtual", ["8.0", "9.0"], ["7.5"]),
        ("90a", ["9.0"], ["10.0", "8.9"]),  # Hopper-only instructions
        ("100f-real", ["10.0", "10.3"], ["12.0", "9.0"]),  # a family
        ("120", ["12.0"], ["12.1", "9.0"]),  # llama.cpp builds it as 120a
    ],
)
def test_which_gpus_a_cuda_architecture_runs_on(arch: str, runs_on: list[str], not_on: list[str]) -> None:
    assert all(runs_on_compute_capability(arch, cap) for cap in runs_on)
    assert not any(runs_on_compute_capability(arch, cap) for cap in not_on)


def test_cuda_architectures_that_say_nothing_about_a_gpu_hold_nothing_against_it() -> None:
    for value in ("native", "all", "all-major", ""):
        assert cuda_architectures([f"-DCMAKE_CUDA_ARCHITECTURES={value}"]) is None
    assert cuda_architectures(["-DGGML_CUDA=on"]) is None
    assert cuda_architectures(["-DCMAKE_CUDA_ARCHITECTURES=80", "-DCMAKE_CUDA_ARCHITECTURES=90"]) == ("90",)
    assert runs_on_compute_capability("90", "") and runs_on_compute_capability("odd", "9.0")


def test_a_cuda_build_for_another_gpu_is_one_line_saying_what_to_do() -> None:
    h200 = parse_nvidia_smi(captured("nvidia-smi-query-h200.txt"))
    ampere_only = cuda_devices(h200, {}, ("80-real", "86-real")).problem
    assert ampere_only == (
        "the engine was built for CUDA architectures 80-real;86-real, which GPU 0 (NVIDIA H200, compute "
        "capability 9.0) cannot run: run `toolpair engine install` to build it for this machine's GPUs"
    )
    assert cuda_devices(h200, {}, ("80",)).problem is None  # its PTX runs on the H200
    assert cuda_devices(h200, {}, ("90",)).names == ("CUDA0: NVIDIA H200",)
    # Each visible GPU must be able to run it; a hidden one need not.
    two = parse_nvidia_smi(captured("nvidia-smi-query-two.txt"))
    assert "GPU 1 (NVIDIA GeForce RTX 3060, compute capability 8.6)" in (
        cuda_devices(two, {}, ("89-real",)).problem or ""
    )
    assert cuda_devices(two, {"CUDA_VISIBLE_DEVICES": "0"}, ("89-real",)).problem is None
    # From the build's CMake flags, through the machine's probes.
    smi = FakeProbes({SMI: captured("nvidia-smi-query-h200.txt")})
    flags = ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=86-real"]
    assert engine_devices(Backend.CUDA, {}, Machine(smi), cuda_architectures(flags)) == cuda_devices(
        h200, {}, ("86-real",)
    )
    assert (
        engine_devices(Backend.CUDA, {}, Machine(smi), cuda_architectures(["-DGGML_CUDA=on"])).problem is None
    )  # llama.cpp's own list
