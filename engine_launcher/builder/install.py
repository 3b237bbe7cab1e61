"""``toolpair engine install``: build llama-cpp-python for a backend, install it, verify it.

Wheels are built with ``pip wheel --no-cache-dir`` into a directory of their
own per backend and set of CMake flags (``$TOOLPAIR_CACHE/wheels/<backend>/
flags-<digest>/``) and installed from there with ``--only-binary
--find-links``. pip's wheel cache is keyed by the source, not by
``CMAKE_ARGS``, so it could hand back a CPU wheel for a CUDA request; keeping
it out of the loop makes that impossible. A wheel already in the directory is
reused: builds take minutes, and a directory per set of flags means that
switching flags back and forth never rebuilds (nor throws away) either build.

Every build has llama.cpp's RPC backend on. The source the wheel is built from
is downloaded first, and ``rpc-server.cpp`` and ggml's headers are kept next to
the wheel; installing compiles that one file against the installed engine's own
ggml libraries into ``<prefix>/bin/rpc-server``, so a worker always speaks the
RPC protocol of the engine that connects to it (and a GPU build's worker offers
that GPU). ``toolpair rpc-worker`` runs it.

After installing, the engine is imported in the target interpreter: a GPU
backend must report ``llama_supports_gpu_offload()``. What was installed is
recorded in ``<prefix>/share/toolpair/engine.json``, which ``serve`` reads to
decide GPU offload and to warn when the build does not match the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from engine_launcher.builder.backends import (
    Backend,
    BuildPlan,
    CudaToolkit,
    build_plan,
    child_env,
    detect_backend,
    install_hint,
)
from engine_launcher.builder.cpu_features import instruction_sets, is_native_build
from engine_launcher.builder.machine import Machine, Probes, this_machine
from engine_launcher.builder.models import cache_root, sha256_file
from engine_launcher.builder.plan import EngineSettings, plan_engine
from engine_launcher.builder.record import EngineRecord, read_record, record_path, write_record
from engine_launcher.builder.version import LLAMA_CPP_VERSION

__all__ = [
    "BuildProgress",
    "InstallError",
    "build_directory",
    "build_wheel",
    "cached_wheel",
    "install_cuda_toolkit",
    "install_engine",
    "lay_out_cuda_toolkit",
    "rpc_server_command",
    "wheel_command",
    "wheel_dir",
]

REQUIREMENT = f"llama-cpp-python=={LLAMA_CPP_VERSION}"
_LOG_TAIL = 30
RPC_SOURCE = "rpc-server-src"
"""Next to the wheel: the sdist's ``tools/rpc/rpc-server.cpp`` and ``ggml/include``, for ``rpc-server``."""
RPC_SERVER = "rpc-server"


class InstallError(RuntimeError):
    """Raised when building, installing or verifying the engine fails; the message says what to do."""


def wheel_dir(backend: Backend, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "wheels" / backend.value


def build_directory(
    backend: Backend, cmake_args: Sequence[str], cache: Path | None = None, cpu: Iterable[str] = ()
) -> Path:
    """Where the wheel for ``backend`` built with exactly ``cmake_args`` lives.

    A native build is also keyed by ``cpu``, the instruction sets it may use
    (:mod:`engine_launcher.builder.cpu_features`): a cache shared with another CPU never
    hands it a wheel that stops with SIGILL.

    >>> build_directory(Backend.CPU, ["-DGGML_RPC=ON"], Path("/c")).parent
    PosixPath('/c/wheels/cpu')
    """
    key = "\0".join(cmake_args)
    if cpu:
        key += "\0cpu:" + ",".join(sorted(cpu))
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return wheel_dir(backend, cache) / f"flags-{digest}"


def cached_wheel(directory: Path, version: str = LLAMA_CPP_VERSION) -> Path | None:
    """The newest llama-cpp-python wheel of ``version`` in ``directory``."""
    wheels = sorted(directory.glob(f"llama_cpp_python-{version}-*.whl"), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def wheel_command(python: str, requirement: str, dest: Path) -> list[str]:
    """pip's command to build one wheel from source, bypassing pip's wheel cache.

    >>> wheel_command("py", "llama-cpp-python==0.3.36", Path("/w"))[3:7]
    ['wheel', '--no-deps', '--no-cache-dir', '--no-binary']
    """
    return [
        python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
        "--disable-pip-version-check", "-v", requirement, "-w", str(dest),
    ]  # fmt: skip


class BuildProgress:
    """Turns pip/CMake build output into short status lines, only when they change.

    >>> progress = BuildProgress()
    >>> progress.feed("[ 12%] Building C object ggml.c.o"), progress.feed("[ 12%] Linking")
    ('compiling 12%', None)
    >>> progress.feed("[97/193] /usr/bin/g++ -c llama.cpp")
    'compiling 50%'

    """

    def __init__(self) -> None:
        self.status = "starting"

    def feed(self, line: str) -> str | None:
        status = self.status
        percent = re.match(r"^\s*\[\s*(\d{1,3})%\]", line)
        steps = re.match(r"^\s*\[(\d+)/(\d+)\]", line)  # ninja's "[done/total]"
        if percent:
            status = f"compiling {int(percent.group(1))}%"
        elif steps and int(steps.group(2)) > 0:
            status = f"compiling {int(steps.group(1)) * 100 // int(steps.group(2))}%"
        elif line.startswith(("Collecting", "Downloading", "Obtaining", "Processing")):
            status = "fetching sources"
        elif "Getting requirements to build wheel" in line or "Installing build dependencies" in line:
            status = "preparing the build environment"
        elif line.lstrip("* ").startswith(("-- The C compiler", "-- Configuring", "Configuring CMake")):
            status = "configuring (CMake)"
        elif "Building wheel for" in line or "Created wheel for" in line:
            status = "packaging the wheel" if "Created" in line else status
        if status == self.status:
            return None
        self.status = status
        return status


def _say(out: TextIO, message: str) -> None:
    print(message, file=out, flush=True)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One build per wheel directory at a time, across processes."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def download_command(python: str, requirement: str, dest: Path) -> list[str]:
    """pip's command to fetch the source distribution the wheel is then built from."""
    return [
        python, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
        "--disable-pip-version-check", "-v", requirement, "-d", str(dest),
    ]  # fmt: skip


def keep_rpc_source(sdist: Path, dest: Path) -> bool:
    """Copy ``rpc-server.cpp`` and ggml's public headers out of the sdist; False when it has none."""
    wanted = "/vendor/llama.cpp/tools/rpc/rpc-server.cpp"
    headers = "/vendor/llama.cpp/ggml/include/"
    scratch = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "include").mkdir(parents=True)
    found = False
    with tarfile.open(sdist) as archive:
        for member in archive:
            if not member.isfile():
                continue
            name = "/" + member.name.split("/", 1)[-1]
            if name.endswith(wanted):
                target, found = scratch / "rpc-server.cpp", True
            elif name.startswith(headers) and name.endswith(".h") and "/" not in name[len(headers) :]:
                target = scratch / "include" / name.rsplit("/", 1)[1]
            else:
                continue
            source = archive.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
    shutil.rmtree(dest, ignore_errors=True)
    if not found:
        shutil.rmtree(scratch)
        return False
    scratch.rename(dest)
    return True


def build_wheel(
    plan: BuildPlan,
    directory: Path,
    *,
    requirement: str = REQUIREMENT,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    out: TextIO = sys.stderr,
) -> Path:
    """Fetch the source and build one wheel from it into ``directory``; on failure raise with the log's tail.

    The wheel is built in a scratch directory and moved in only when the
    build succeeded, so a failed or interrupted build never leaves a wheel.
    The RPC server's source is kept next to it (see the module docstring).
    """
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "build.log"
    build_env = {**(os.environ if env is None else env), **plan.env}
    started = time.monotonic()
    progress = BuildProgress()
    tail: deque[str] = deque(maxlen=_LOG_TAIL)
    interactive = out.isatty()
    last_shown = [0.0]

    def step(command: list[str], log: TextIO) -> int:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=build_env, text=True, errors="replace",
        )  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
            status = progress.feed(line)
            now = time.monotonic()
            if status is not None or now - last_shown[0] > 30:
                last_shown[0] = now
                elapsed = int(now - started)
                text = f"  {progress.status} ({elapsed // 60}m{elapsed % 60:02d}s)"
                print(
                    ("\r" + text.ljust(60)) if interactive else text,
                    end="" if interactive else "\n",
                    file=out,
                    flush=True,
                )
        return process.wait()

    _say(out, f"building {requirement} for {plan.backend.value} (CMAKE_ARGS={plan.env.get('CMAKE_ARGS', '')!r})")
    _say(out, f"  this takes several minutes; full log: {log_path}")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as scratch, log_path.open("w") as log:
        sources, wheels = Path(scratch) / "source", Path(scratch) / "wheel"
        code = step(download_command(python, requirement, sources), log)
        sdists = sorted(sources.glob("*.tar.gz")) if code == 0 else []
        if sdists:
            code = step(wheel_command(python, str(sdists[0]), wheels), log)
        if interactive:
            print(file=out)
        built = sorted(wheels.glob("*.whl"))
        if code != 0 or not built:
            shown = "\n".join(f"  | {line}" for line in tail)
            raise InstallError(
                f"building {requirement} for {plan.backend.value} failed (pip exit status {code}).\n"
                f"last lines of {log_path}:\n{shown}\n"
                f"a {plan.backend.value} build needs {install_hint(plan.backend)}."
            )
        if not keep_rpc_source(sdists[0], directory / RPC_SOURCE):
            _say(out, f"  warning: {sdists[0].name} has no tools/rpc/rpc-server.cpp; rpc-server will not be built")
        for old in directory.glob(built[0].name):
            old.unlink()
        final = directory / built[0].name
        shutil.move(str(built[0]), final)
    (directory / "build.json").write_text(
        json.dumps({"requirement": requirement, "backend": plan.backend.value, "cmake_args": list(plan.cmake_args)})
        + "\n"
    )
    _say(out, f"  built {final.name} in {(time.monotonic() - started) / 60:.1f} min")
    return final


def _run(command: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        list(command), capture_output=True, text=True, errors="replace", env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()[-_LOG_TAIL:]
        raise InstallError(f"{what} failed (exit status {done.returncode}):\n" + "\n".join(f"  | {x}" for x in lines))
    return done.stdout


_VERIFY = """
import ctypes, json, llama_cpp
offload = bool(llama_cpp.llama_supports_gpu_offload())
rpc = bool(getattr(llama_cpp, "llama_supports_rpc", lambda: False)())
if offload and rpc:
    # With RPC built in, llama.cpp reports offload even without a GPU backend: look for a GPU device
    # instead (no RPC device is registered yet, so any GPU here is local).
    from llama_cpp._ggml import libggml as g
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_dev_get.restype, g.ggml_backend_dev_get.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    g.ggml_backend_dev_type.restype, g.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
    types = [g.ggml_backend_dev_type(g.ggml_backend_dev_get(i)) for i in range(g.ggml_backend_dev_count())]
    offload = any(t in (1, 2) for t in types)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU
print(json.dumps({"version": llama_cpp.__version__, "gpu_offload": offload, "rpc": rpc}))
"""


def _verify(python: str, env: Mapping[str, str] | None = None) -> dict[str, object]:
    script = _VERIFY
    out = _run([python, "-c", script], "importing llama_cpp", env)
    data = json.loads(out.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


def _prefix(python: str) -> Path:
    if python == sys.executable:
        return Path(sys.prefix)  # a venv's python links to the base interpreter: compare names, not files
    return Path(_run([python, "-c", "import sys; print(sys.prefix)"], "finding the target environment").strip())


def _engine_lib_dir(python: str) -> Path:
    """Where the wheel put libllama and ggml, found without importing llama_cpp.

    Importing it loads libllama, and a CUDA build against PyPI's toolkit finds cuBLAS only with the
    toolkit's library path set: the lookup must not depend on that.
    """
    script = "import importlib.util as u, pathlib as p; print(p.Path(u.find_spec('llama_cpp').origin).parent / 'lib')"
    return Path(_run([python, "-c", script], "finding the engine's libraries").strip().splitlines()[-1])


_CUDA_TARGET_DIRS = {"x86_64": "x86_64-linux", "amd64": "x86_64-linux", "aarch64": "sbsa-linux", "arm64": "sbsa-linux"}


def lay_out_cuda_toolkit(root: Path, machine: str) -> None:
    """Give the PyPI toolkit's tree the shape nvcc and CMake look for in a system toolkit.

    nvcc.profile adds ``$(TOP)/targets/<arch>-linux/{include,lib}``; CMake's
    FindCUDAToolkit searches ``lib64`` and links ``libcudart.so``/``libcublas.so``,
    where the wheels ship ``lib`` and ``libcudart.so.13`` only. Links, no copies.
    """
    links: dict[Path, str] = {root / "lib64": "lib"}
    target = _CUDA_TARGET_DIRS.get(machine.lower())
    if target:
        (root / "targets" / target).mkdir(parents=True, exist_ok=True)
        links[root / "targets" / target / "include"] = "../../include"
        links[root / "targets" / target / "lib"] = "../../lib"
    for versioned in sorted((root / "lib").glob("lib*.so.*")):
        links[root / "lib" / (versioned.name.split(".so.", 1)[0] + ".so")] = versioned.name
    for link, points_to in links.items():
        if not link.exists() and not link.is_symlink():
            link.symlink_to(points_to)


def install_cuda_toolkit(toolkit: CudaToolkit, python: str, out: TextIO = sys.stderr) -> None:
    """Install NVIDIA's toolkit wheels into ``toolkit.home`` once (a stamp names them), laid out for the build."""
    stamp = toolkit.home / ".installed"
    wanted = "\n".join(toolkit.packages) + "\n"
    with _locked(toolkit.home):
        if stamp.is_file() and stamp.read_text() == wanted and toolkit.nvcc.is_file():
            return
        _say(out, f"fetching NVIDIA's CUDA toolkit from PyPI into {toolkit.home} (no system one with nvcc and cuBLAS)")
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps", "--upgrade"]
        _run([*pip, "--target", str(toolkit.home), *toolkit.packages], "installing the CUDA toolkit from PyPI")
        lay_out_cuda_toolkit(toolkit.root, os.uname().machine)
        stamp.write_text(wanted)
        _say(out, f"  CUDA toolkit ready: {toolkit.nvcc}")


def install_rpc_server(
    python: str, source: Path, prefix: Path, env: Mapping[str, str], out: TextIO = sys.stderr
) -> str | None:
    """Compile ``rpc-server`` against the installed engine's ggml into ``<prefix>/bin``; its path, or None.

    One C++ file linked to the libraries in the wheel: seconds, not a second
    build of ggml. None (with a note) when the wheel was built without RPC or
    its source was not kept (a wheel cached by an older toolpair).
    """
    if not (source / "rpc-server.cpp").is_file():
        _say(out, "note: no rpc-server source next to the wheel; `toolpair engine install --rebuild` builds it")
        return None
    libs = _engine_lib_dir(python)
    if not any(libs.glob("libggml-rpc.*")):
        _say(out, f"note: this engine was built without RPC (no libggml-rpc in {libs}); no rpc-server")
        return None
    target = prefix / "bin" / RPC_SERVER
    target.parent.mkdir(parents=True, exist_ok=True)
    origin = "@loader_path" if sys.platform == "darwin" else "$ORIGIN"
    compiler = env.get("CXX") or shutil.which("c++") or "g++"
    partial = target.with_name(f".{RPC_SERVER}.{os.getpid()}")
    command = [
        compiler, "-std=c++17", "-O2", "-pthread", "-I", str(source / "include"), str(source / "rpc-server.cpp"),
        "-o", str(partial), "-L", str(libs), "-lggml", "-lggml-base",
        f"-Wl,-rpath,{origin}/{os.path.relpath(libs, target.parent)}",
    ]  # fmt: skip
    try:
        _run(command, "building rpc-server", env)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    _say(out, f"built {target} (llama.cpp RPC worker; run it with `toolpair rpc-worker`)")
    return str(target)


def rpc_server_command(server: str, host: str, port: int, threads: int | None = None, cache: bool = False) -> list[str]:
    """The argv of one RPC worker.

    >>> rpc_server_command("/v/bin/rpc-server", "10.0.0.5", 50052, threads=4)
    ['/v/bin/rpc-server', '--host', '10.0.0.5', '--port', '50052', '--threads', '4']
    """
    command = [server, "--host", host, "--port", str(port)]
    if threads is not None:
        command += ["--threads", str(threads)]
    if cache:
        command.append("--cache")
    return command


def install_engine(
    backend: str = "auto",
    *,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    probes: Probes | None = None,
    cache: Path | None = None,
    rebuild: bool = False,
    portable: bool | None = None,
    amx: bool = False,
    out: TextIO = sys.stderr,
) -> EngineRecord:
    """Build (or reuse) and install llama-cpp-python for ``backend`` into ``python``'s environment.

    ``portable`` and ``amx`` choose the CPU code (see :func:`build_plan`); ``probes`` stand for the
    machine (default: this one, probed once per process). Whether the build runs here, with what in
    its environment, is :func:`~engine_launcher.builder.plan.plan_engine`'s answer, as for serve.
    """
    env = os.environ if env is None else env
    machine = this_machine() if probes is None else Machine(probes)
    detection = detect_backend(env, machine, explicit=backend)
    _say(out, f"engine backend: {detection.backend.value} ({detection.reason})")
    plan = build_plan(detection, env, machine.probes, portable=portable, amx=amx)
    for problem in plan.problems:
        _say(out, f"warning: {problem}")
    native = is_native_build(plan.cmake_args)
    built_for_cpu = sorted(instruction_sets(machine.cpu_flags, plan.cmake_args)) if native else None
    directory = build_directory(detection.backend, plan.cmake_args, cache, built_for_cpu or ())
    if plan.toolkit is not None:  # needed to build, and its libraries to run the build
        install_cuda_toolkit(plan.toolkit, python, out)
    with _locked(directory):
        wheel = None if rebuild else cached_wheel(directory)
        if wheel is not None:
            _say(out, f"using the cached wheel {wheel}")
        else:
            wheel = build_wheel(plan, directory, python=python, env=env, out=out)
    digest = sha256_file(wheel)
    marker = record_path(_prefix(python))
    previous = read_record(marker)
    backend = detection.backend
    built = EngineRecord(
        backend.value,
        LLAMA_CPP_VERSION,
        str(wheel),
        digest,
        None,
        list(plan.cmake_args),
        None,
        plan.run_env,
        built_for_cpu,
        portable=plan.portable,
        rpc=plan.rpc,
        amx=plan.amx,
        cuda_architectures=None if plan.cuda_architectures is None else list(plan.cuda_architectures),
    )
    # Loading the build needs its toolkit's libraries; using the device may need a device choice.
    # A build for another machine (no device here: a `docker build`) is installed all the same.
    here = plan_engine(EngineSettings(backend=backend.value, amx=amx), machine, built, env)
    load_env = child_env(env, here.env)
    if previous and previous.sha256 == digest and previous.backend == detection.backend.value:
        try:
            _verify(python, load_env)
        except InstallError:
            previous = None
        else:
            if previous.gpu_offload is not None or not detection.backend.gpu:
                _say(out, f"llama-cpp-python {LLAMA_CPP_VERSION} for {previous.backend} is already installed")
                rpc = previous.rpc_server
                if rpc is None or not Path(rpc).exists():
                    rpc = install_rpc_server(python, directory / RPC_SOURCE, marker.parent.parent.parent, load_env, out)
                current = dataclasses.replace(
                    built, version=previous.version, gpu_offload=previous.gpu_offload, rpc_server=rpc
                )
                if current != previous:
                    write_record(marker, current)
                return current
            # Installed where it could not be verified: install again below and verify here.
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _say(out, f"installing {wheel.name} ({detection.backend.value}) into {marker.parent.parent.parent}")
    _run([*pip, "--no-deps", "--force-reinstall", str(wheel)], "installing the engine wheel")
    _run(
        [
            *pip,
            "--only-binary",
            "llama-cpp-python",
            "--find-links",
            str(directory),
            f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}",
        ],
        "installing the engine's server dependencies",
    )
    # Without a device of this kind (a `docker build`, a build host), GPU offload cannot be shown
    # here: the build is kept, unverified, and serve's engine log tells on the real machine. A
    # device detection passes over (a software Vulkan device) counts when this backend was asked for.
    try:
        found = _verify(python, load_env)
    except InstallError as exc:
        if here.device_here:
            raise
        _say(out, f"warning: could not load the {backend.value} engine here (no {backend.value} device?): {exc}")
        found = {"version": LLAMA_CPP_VERSION, "gpu_offload": None}
    offload = found.get("gpu_offload")
    if backend.gpu and not offload:
        if here.device_here:
            raise InstallError(
                f"the {backend.value} build of llama-cpp-python reports no GPU offload support. "
                f"Check {directory / 'build.log'}; a {backend.value} build needs "
                f"{install_hint(backend)}. Rebuild with --rebuild."
            )
        _say(out, f"warning: no {backend.value} device here, so GPU offload is not verified")
        offload = None
    record = dataclasses.replace(
        built,
        version=str(found.get("version")),
        gpu_offload=None if offload is None else bool(offload),
        rpc_server=install_rpc_server(python, directory / RPC_SOURCE, marker.parent.parent.parent, load_env, out),
    )
    write_record(marker, record)
    shown = {None: "not verified", True: "yes", False: "no"}[record.gpu_offload]
    _say(out, f"installed llama-cpp-python {record.version} for {record.backend} (GPU offload: {shown})")
    return record
