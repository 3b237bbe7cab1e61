"""``toolpair engine install``: build llama-cpp-python for a backend, install it, verify it.

Wheels are built with ``pip wheel --no-cache-dir`` into a directory of their
own per backend (``$TOOLPAIR_CACHE/wheels/<backend>/``) and installed from
there with ``--only-binary --find-links``. pip's wheel cache is keyed by the
source, not by ``CMAKE_ARGS``, so it could hand back a CPU wheel for a CUDA
request; keeping it out of the loop makes that impossible. A wheel already in
the directory, built with the same CMake flags, is reused: builds take minutes.

After installing, the engine is imported in the target interpreter: a GPU
backend must report ``llama_supports_gpu_offload()``. What was installed is
recorded in ``<prefix>/share/toolpair/engine.json``, which ``serve`` reads to
decide GPU offload and to warn when the build does not match the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from engine_launcher.backends import Backend, BuildPlan, Probes, SystemProbes, build_plan, detect_backend, install_hint
from engine_launcher.models import cache_root, sha256_file

__all__ = [
    "LLAMA_CPP_VERSION",
    "BuildProgress",
    "EngineRecord",
    "InstallError",
    "build_wheel",
    "cached_wheel",
    "install_engine",
    "read_record",
    "record_path",
    "wheel_command",
    "wheel_dir",
]

LLAMA_CPP_VERSION = "0.3.36"
REQUIREMENT = f"llama-cpp-python=={LLAMA_CPP_VERSION}"
_LOG_TAIL = 30


class InstallError(RuntimeError):
    """Raised when building, installing or verifying the engine fails; the message says what to do."""


@dataclass(frozen=True)
class EngineRecord:
    """What ``toolpair engine install`` put into an environment."""

    backend: str
    version: str
    wheel: str
    sha256: str
    gpu_offload: bool | None
    """None when it could not be checked (no device of that kind where it was installed)."""
    cmake_args: list[str]

    @property
    def gpu(self) -> bool:
        return self.backend != Backend.CPU.value


def record_path(prefix: str | Path = sys.prefix) -> Path:
    return Path(prefix) / "share" / "toolpair" / "engine.json"


def read_record(path: Path | None = None) -> EngineRecord | None:
    """The install record, or None when the engine was not installed by toolpair."""
    try:
        data = json.loads((path or record_path()).read_text())
        return EngineRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def _write_record(path: Path, record: EngineRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")


def wheel_dir(backend: Backend, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "wheels" / backend.value


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
    """

    def __init__(self) -> None:
        self.status = "starting"

    def feed(self, line: str) -> str | None:
        status = self.status
        percent = re.match(r"^\s*\[\s*(\d{1,3})%\]", line)
        if percent:
            status = f"compiling {int(percent.group(1))}%"
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


def _build_info(directory: Path) -> dict[str, object] | None:
    try:
        data = json.loads((directory / "build.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_wheel(
    plan: BuildPlan,
    directory: Path,
    *,
    requirement: str = REQUIREMENT,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    out: TextIO = sys.stderr,
) -> Path:
    """Build one wheel into ``directory``; show progress; on failure raise with the log's tail.

    The wheel is built in a scratch directory and moved in only when the
    build succeeded, so a failed or interrupted build never leaves a wheel.
    """
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "build.log"
    build_env = {**(os.environ if env is None else env), **plan.env}
    started = time.monotonic()
    progress = BuildProgress()
    tail: deque[str] = deque(maxlen=_LOG_TAIL)
    interactive = out.isatty()
    _say(out, f"building {requirement} for {plan.backend.value} (CMAKE_ARGS={plan.env.get('CMAKE_ARGS', '')!r})")
    _say(out, f"  this takes several minutes; full log: {log_path}")
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as scratch, log_path.open("w") as log:
        process = subprocess.Popen(
            wheel_command(python, requirement, Path(scratch)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=build_env, text=True, errors="replace",
        )  # fmt: skip
        assert process.stdout is not None
        last_shown = 0.0
        for line in process.stdout:
            log.write(line)
            tail.append(line.rstrip("\n"))
            status = progress.feed(line)
            now = time.monotonic()
            if status is not None or now - last_shown > 30:
                last_shown = now
                elapsed = int(now - started)
                text = f"  {progress.status} ({elapsed // 60}m{elapsed % 60:02d}s)"
                print(
                    ("\r" + text.ljust(60)) if interactive else text,
                    end="" if interactive else "\n",
                    file=out,
                    flush=True,
                )
        code = process.wait()
        if interactive:
            print(file=out)
        built = sorted(Path(scratch).glob("*.whl"))
        if code != 0 or not built:
            shown = "\n".join(f"  | {line}" for line in tail)
            raise InstallError(
                f"building {requirement} for {plan.backend.value} failed (pip exit status {code}).\n"
                f"last lines of {log_path}:\n{shown}\n"
                f"a {plan.backend.value} build needs {install_hint(plan.backend)}."
            )
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


def _reusable(directory: Path, plan: BuildPlan, default_args: Sequence[str]) -> Path | None:
    """A cached wheel built with the same CMake flags as ``plan``.

    A wheel with no build record was put there by hand (or by an older
    toolpair): it counts as built with the backend's default flags.
    """
    wheel = cached_wheel(directory)
    if wheel is None:
        return None
    info = _build_info(directory)
    built_args = info.get("cmake_args") if info else list(default_args)
    return wheel if built_args == list(plan.cmake_args) else None


def _run(command: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        list(command), capture_output=True, text=True, errors="replace", env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).strip().splitlines()[-_LOG_TAIL:]
        raise InstallError(f"{what} failed (exit status {done.returncode}):\n" + "\n".join(f"  | {x}" for x in lines))
    return done.stdout


def _verify(python: str) -> dict[str, object]:
    script = (
        "import json, llama_cpp; print(json.dumps({'version': llama_cpp.__version__, "
        "'gpu_offload': bool(llama_cpp.llama_supports_gpu_offload())}))"
    )
    out = _run([python, "-c", script], "importing llama_cpp")
    data = json.loads(out.strip().splitlines()[-1])
    assert isinstance(data, dict)
    return data


def _prefix(python: str) -> Path:
    if python == sys.executable:
        return Path(sys.prefix)  # a venv's python links to the base interpreter: compare names, not files
    return Path(_run([python, "-c", "import sys; print(sys.prefix)"], "finding the target environment").strip())


def install_engine(
    backend: str = "auto",
    *,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    probes: Probes | None = None,
    cache: Path | None = None,
    rebuild: bool = False,
    out: TextIO = sys.stderr,
) -> EngineRecord:
    """Build (or reuse) and install llama-cpp-python for ``backend`` into ``python``'s environment."""
    env = os.environ if env is None else env
    probes = probes or SystemProbes()
    detection = detect_backend(env, probes, explicit=backend)
    _say(out, f"engine backend: {detection.backend.value} ({detection.reason})")
    plan = build_plan(detection, env, probes)
    for problem in plan.problems:
        _say(out, f"warning: {problem}")
    directory = wheel_dir(detection.backend, cache)
    default_args = build_plan(detection, {k: v for k, v in env.items() if k != "CMAKE_ARGS"}, probes).cmake_args
    with _locked(directory):
        wheel = None if rebuild else _reusable(directory, plan, default_args)
        if wheel is not None:
            _say(out, f"using the cached wheel {wheel}")
        else:
            wheel = build_wheel(plan, directory, python=python, env=env, out=out)
    digest = sha256_file(wheel)
    marker = record_path(_prefix(python))
    previous = read_record(marker)
    if previous and previous.sha256 == digest and previous.backend == detection.backend.value:
        try:
            _verify(python)
        except InstallError:
            previous = None
        else:
            if previous.gpu_offload is not None or not detection.backend.gpu:
                _say(out, f"llama-cpp-python {LLAMA_CPP_VERSION} for {previous.backend} is already installed")
                return previous
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
    backend = detection.backend
    # Without a device of this kind (a `docker build`, a build host), GPU offload cannot be shown
    # here: the build is kept, unverified, and serve's engine log tells on the real machine.
    device_here = not backend.gpu or detect_backend(env, probes).backend is backend
    try:
        found = _verify(python)
    except InstallError as exc:
        if device_here:
            raise
        _say(out, f"warning: could not load the {backend.value} engine here (no {backend.value} device?): {exc}")
        found = {"version": LLAMA_CPP_VERSION, "gpu_offload": None}
    offload = found.get("gpu_offload")
    if backend.gpu and not offload:
        if device_here:
            raise InstallError(
                f"the {backend.value} build of llama-cpp-python reports no GPU offload support. "
                f"Check {directory / 'build.log'}; a {backend.value} build needs "
                f"{install_hint(backend)}. Rebuild with --rebuild."
            )
        _say(out, f"warning: no {backend.value} device here, so GPU offload is not verified")
        offload = None
    record = EngineRecord(
        backend.value,
        str(found.get("version")),
        str(wheel),
        digest,
        None if offload is None else bool(offload),
        list(plan.cmake_args),
    )
    _write_record(marker, record)
    shown = {None: "not verified", True: "yes", False: "no"}[record.gpu_offload]
    _say(out, f"installed llama-cpp-python {record.version} for {record.backend} (GPU offload: {shown})")
    return record
