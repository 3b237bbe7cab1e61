"""A model file `toolpair serve` cannot read ends it with one line naming the file and the fix (issue 14).

The case from the field: a root-owned 0600 model (mounted, or assembled into an
image's cache at build time) and a server that runs as another user (uid 10001
in the image). Root reads any file whatever its mode, so when the tests run as
root the command runs as ``nobody`` through ``setpriv``; run as any other user,
the test takes the permission away from that user itself. Either way the
operating system, not a stub, says no.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_launcher.builder import models
from tests.support.serve import ROOT, run_serve

AS_ROOT = os.geteuid() == 0


def _as_other_user() -> list[str]:
    if not AS_ROOT:
        return []
    setpriv = shutil.which("setpriv")  # util-linux, on every Debian and Ubuntu
    assert setpriv, "setpriv (util-linux) is needed to run as another user"
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def _deny(path: Path, mode: int) -> None:
    """Take reading (or searching) ``path`` away from the user the command runs as."""
    path.chmod(mode if AS_ROOT else 0)  # as root: the file stays root's, the command runs as nobody


@pytest.fixture(scope="module", autouse=True)
def checkout_reachable() -> Iterator[None]:
    """As root, let ``nobody`` search its way to this checkout and its venv while these tests run.

    A checkout in a private directory (``mktemp -d`` gives 0700) would otherwise fail every test
    here with "No module named proxy" before serve ever looks at the model. Only the search bit
    is added, to the directories that lack it, and each mode is put back afterwards.
    """
    changed: dict[Path, int] = {}
    if AS_ROOT:
        for start in (ROOT, Path(sys.executable).parent):
            for directory in (start, *start.parents):
                mode = directory.stat().st_mode & 0o7777
                if directory not in changed and not mode & 0o001:
                    changed[directory] = mode
                    directory.chmod(mode | 0o001)
    try:
        yield
    finally:
        for directory, mode in changed.items():
            directory.chmod(mode)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can reach (pytest's own tmp_path is private to the user running it)."""
    path = Path(tempfile.mkdtemp(prefix="toolpair-access-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for sub in path.rglob("*"):
            sub.chmod(0o755)
        shutil.rmtree(path)


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_serve("--port", "1", *args, prefix=_as_other_user(), timeout=60, env=env, default_model=not args)


def _one_clear_line(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_an_unreadable_model_file_gives_one_line_with_the_fix(shared: Path) -> None:
    model = shared / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    _deny(model, 0o600)
    line = _one_clear_line(_serve("--model", str(model)), str(model), f"chmod a+r {model}", "cannot read")
    assert "mode 0600, owner uid 0" in line if AS_ROOT else "mode 0000" in line


def test_a_model_in_a_directory_the_user_cannot_enter_names_that_directory(shared: Path) -> None:
    private = shared / "private"
    private.mkdir()
    model = private / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    _deny(private, 0o700)
    _one_clear_line(_serve("--model", str(model)), str(model), f"directory {private} is not searchable", "chmod a+x")


def test_an_unreadable_default_model_in_the_cache_gives_the_same_line(shared: Path) -> None:
    cached = shared / "cache" / "models" / models.DEFAULT_MODEL.file_name
    cached.parent.mkdir(parents=True)
    cached.parent.parent.chmod(0o755)
    cached.parent.chmod(0o755)
    cached.write_bytes(b"GGUF" + bytes(64))
    _deny(cached, 0o600)
    _one_clear_line(_serve(env={"TOOLPAIR_CACHE": str(shared / "cache")}), str(cached), f"chmod a+r {cached}")


def test_a_missing_model_is_still_called_missing(tmp_path: Path) -> None:
    with pytest.raises(models.ModelError, match=r"model file .*nope\.gguf does not exist"):
        models.readable_model(tmp_path / "nope.gguf")
    assert models.readable_model(Path(__file__)) == Path(__file__)
