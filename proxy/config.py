"""Typed settings, from defaults, a YAML file, ``TOOLPAIR_*`` variables and the CLI.

Precedence, highest first: command line, environment, file, defaults. Every
field here is documented, with its default, in ``config/default.yaml``; a test
keeps the two in step. Unknown keys are an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from engine_launcher.supervise.launch import CACHE_TYPES, SPLIT_MODES

__all__ = [
    "ApiMode",
    "ConfigError",
    "EngineKind",
    "LogFormat",
    "LogLevel",
    "Settings",
    "listen_hosts",
    "load_settings",
    "ENV_PREFIX",
]

ENV_PREFIX = "TOOLPAIR_"

RENAMED = {"engine_max_ctx": "engine_ctx_size"}
"""Settings of earlier releases and what replaced them: naming an old one is an error, never silently ignored
(unknown ``TOOLPAIR_*`` variables in general are not errors, since other tools share the prefix)."""


class ConfigError(ValueError):
    """Raised when a setting is unknown or its value has the wrong type."""


class EngineKind(StrEnum):
    """The engines toolpair knows apart (what each can do is in ``proxy.engine.kinds``)."""

    LLAMA_CPP_PYTHON = "llama-cpp-python"  # the engine `toolpair serve` manages
    LLAMA_SERVER = "llama-server"  # llama.cpp's server with --jinja
    GENERIC = "generic"  # any other OpenAI-compatible server; nothing is changed
    AUTO = "auto"  # `toolpair proxy` asks the upstream at start-up (proxy.engine.detect); else generic


class ApiMode(StrEnum):
    """How ``/v1/messages`` or ``/v1/responses`` reaches the engine (``messages_mode``, ``responses_mode``)."""

    AUTO = "auto"  # native for an engine that serves the API itself (llama-server), else translate
    NATIVE = "native"  # the engine serves the API: forward the (ordered) request
    TRANSLATE = "translate"  # the engine speaks Chat Completions only

    def resolve(self, engine_kind: EngineKind) -> ApiMode:
        """``native`` or ``translate`` for this engine kind: ``auto`` is native only for llama-server.

        >>> ApiMode.AUTO.resolve(EngineKind.LLAMA_SERVER).value, ApiMode.AUTO.resolve(EngineKind.GENERIC).value
        ('native', 'translate')
        """
        if self is not ApiMode.AUTO:
            return self
        return ApiMode.NATIVE if engine_kind is EngineKind.LLAMA_SERVER else ApiMode.TRANSLATE


class LogFormat(StrEnum):
    """``log_format``: text lines for people, or one JSON object per line for collectors."""

    TEXT = "text"
    JSON = "json"


class LogLevel(StrEnum):
    """``log_level``."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


def choices(kind: type[StrEnum]) -> list[str]:
    """The values of a mode type, as the command line offers them.

    >>> choices(ApiMode)
    ['auto', 'native', 'translate']
    """
    return [member.value for member in kind]


def _enum(name: str, kind: type[StrEnum], value: Any) -> StrEnum:
    try:
        return kind(value)
    except ValueError:
        known = ", ".join(choices(kind))
        raise ConfigError(f"{name}: expected one of {known}, got {value!r}") from None


@dataclass(frozen=True)
class Settings:
    """Every setting toolpair reads. See config/default.yaml for the meaning of each."""

    # listening
    host: str = "127.0.0.1"
    port: int = 8787
    # upstream (sidecar mode)
    upstream: str | None = None
    connect_timeout: float = 10.0
    upstream_read_timeout: float | None = 600.0
    # limits
    max_body_bytes: int = 64 * 1024 * 1024
    body_read_timeout: float | None = 120.0
    # logging
    log_level: LogLevel = LogLevel.INFO
    # OpenAI Responses (/v1/responses)
    responses_mode: ApiMode = ApiMode.AUTO
    responses_store_max_entries: int = 1000
    responses_store_max_bytes: int = 128 * 1024 * 1024
    # shared Responses store for replicas (issue 14): memory, or redis://HOST:PORT/DB
    responses_store: str = "memory"
    responses_store_ttl: float | None = 30 * 24 * 3600.0
    # production: API keys, metrics, logs (issue 8). Secrets are kept out of repr().
    api_keys: list[str] = field(default_factory=list, repr=False)
    api_keys_file: str | None = None
    upstream_api_key: str | None = field(default=None, repr=False)
    metrics_require_key: bool = False
    log_format: LogFormat = LogFormat.TEXT
    log_bodies: bool = False
    # engine adaptation and tool-call extraction (issue 4)
    engine_kind: EngineKind = EngineKind.AUTO
    tool_call_format: str = "auto"
    reasoning: bool = True
    think_in_prompt: bool = False
    think_follows_switch: bool = False
    reasoning_markers: list[str] = field(default_factory=lambda: ["<think>", "</think>"])
    tool_call_ids: str = "any"
    vision: bool = False
    # Anthropic Messages (/v1/messages, /v1/messages/count_tokens)
    messages_mode: ApiMode = ApiMode.AUTO
    messages_model: str | None = None
    # model names (issue 27): PATTERN=MODEL entries, first match wins (proxy.engine.model_names)
    model_map: list[str] = field(default_factory=list)
    normalize_billing_stamp: bool = True
    messages_ping_interval: float = 5.0
    count_tokens_template: str | None = None
    # managed engine (toolpair serve)
    model: str | None = None
    chat_template: str | None = None
    engine_backend: str = "auto"
    engine_amx: bool = False  # llama.cpp's AMX weight path: built in by `engine install`, loaded by `serve`
    engine_gpu_layers: int | None = None
    engine_start_timeout: float = 300.0
    engine_ready_wait: float = 60.0
    engine_max_restarts: int = 5
    engine_stop_timeout: float = 10.0
    shutdown_grace: float = 30.0
    max_concurrency: int = 1
    max_queue: int = 64
    # llama.cpp RPC (issue 14): workers (HOST:PORT) that `serve` splits the model across
    engine_rpc: list[str] = field(default_factory=list)
    # engine context, memory and tuning (issue 12): llama-server's names on the command line
    engine_ctx_size: int | None = None
    engine_logprobs: bool | None = None
    prompt_cache_size: int = 1024 * 1024 * 1024
    engine_threads: int | None = None
    engine_threads_batch: int | None = None
    engine_batch_size: int | None = None
    engine_ubatch_size: int | None = None
    engine_flash_attn: bool | None = None
    engine_cache_type_k: str | None = None
    engine_cache_type_v: str | None = None
    engine_mlock: bool = False
    engine_mmap: bool = True
    engine_main_gpu: int | None = None
    engine_split_mode: str | None = None
    engine_tensor_split: list[float] = field(default_factory=list)
    engine_args: list[str] = field(default_factory=list)
    # parallel engines (toolpair serve --parallel N)
    engine_parallel: int = 1

    def __post_init__(self) -> None:
        """Settings are checked here, once, however they were made: a mode string becomes its mode, and a
        number or name out of its range is refused before anything starts (:func:`_check_tuning`)."""
        for name, kind in _enum_fields().items():
            value = getattr(self, name)
            if type(value) is not kind:
                object.__setattr__(self, name, _enum(name, kind, value))
        _check_tuning(self)


def listen_hosts(host: str) -> list[str]:
    """The addresses ``host`` names: one, or several separated by commas (as llama-server's ``--host`` takes).

    >>> listen_hosts("127.0.0.1,::1"), listen_hosts("0.0.0.0"), listen_hosts("")
    (['127.0.0.1', '::1'], ['0.0.0.0'], [''])
    """
    return [part.strip() for part in host.split(",") if part.strip()] or [host]


_LEAST = (
    ("max_concurrency", 1),
    ("max_queue", 0),
    ("engine_max_restarts", 0),
    ("engine_parallel", 1),
    ("engine_ctx_size", 256),
    ("prompt_cache_size", 0),
    ("engine_threads", 1),
    ("engine_threads_batch", 1),
    ("engine_batch_size", 1),
    ("engine_ubatch_size", 1),
    ("engine_main_gpu", 0),
    ("engine_gpu_layers", -1),
)
"""Tuning settings and the least value each may take (None: the engine's default)."""


def _check_tuning(settings: Settings) -> None:
    """Refuse a tuning setting out of range, or a KV cache type or split mode the engine does not know.

    >>> Settings(max_queue=-1)
    Traceback (most recent call last):
    ...
    proxy.config.ConfigError: max_queue must be at least 0
    """
    for name, least in _LEAST:
        value = getattr(settings, name)
        if value is not None and value < least:
            raise ConfigError(f"{name} must be at least {least}")
    for name in ("engine_cache_type_k", "engine_cache_type_v"):
        value = getattr(settings, name)
        if value is not None and value not in CACHE_TYPES:
            raise ConfigError(f"{name} must be one of {', '.join(CACHE_TYPES)}, not {value!r}")
    if settings.engine_split_mode is not None and settings.engine_split_mode not in SPLIT_MODES:
        raise ConfigError(f"engine_split_mode must be one of {', '.join(SPLIT_MODES)}")
    if any(share < 0 for share in settings.engine_tensor_split):
        raise ConfigError("engine_tensor_split shares must not be negative")


@functools.cache
def _enum_fields() -> dict[str, type[StrEnum]]:
    return {name: kind for name, kind in _field_types().items() if isinstance(kind, type) and issubclass(kind, StrEnum)}


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(Settings)
    return {f.name: hints[f.name] for f in dataclasses.fields(Settings)}


def _coerce(name: str, kind: Any, value: Any, *, from_text: bool) -> Any:
    """Turn a YAML value or an environment string into the field's type."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        if value is None or (from_text and value.strip().lower() in ("", "null", "none")):
            return None
        return _coerce(name, options[0], value, from_text=from_text)
    if origin is list:
        (item,) = typing.get_args(kind)
        if from_text:
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(name, item, v, from_text=from_text) for v in value]
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        return _enum(name, kind, value.strip() if from_text else value)
    if kind is bool:
        if from_text:
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        elif isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if kind is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{name}: unsupported setting type {kind!r}")  # pragma: no cover


def _read_file(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return loaded


def load_settings(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Merge the four sources into one :class:`Settings`.

    ``cli`` holds only options the user gave (``None`` values are skipped).
    ``config_file`` falls back to ``TOOLPAIR_CONFIG``.

    >>> load_settings({"port": 9000}, {"TOOLPAIR_PORT": "9001"}).port
    9000
    """
    env = os.environ if env is None else env
    kinds = _field_types()
    values: dict[str, Any] = {}
    for old, new in RENAMED.items():
        if ENV_PREFIX + old.upper() in env:
            raise ConfigError(f"{ENV_PREFIX}{old.upper()} is gone: use {ENV_PREFIX}{new.upper()}")
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        for name, value in _read_file(Path(path)).items():
            if name in RENAMED:
                raise ConfigError(f"setting {name!r} in {path} is gone: use {RENAMED[name]!r}")
            if name not in kinds:
                raise ConfigError(f"unknown setting {name!r} in {path}")
            values[name] = _coerce(name, kinds[name], value, from_text=False)
    for name, kind in kinds.items():
        text = env.get(ENV_PREFIX + name.upper())
        if text is not None:
            values[name] = _coerce(ENV_PREFIX + name.upper(), kind, text, from_text=True)
    for name, value in (cli or {}).items():
        if value is None:
            continue
        if name not in kinds:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = _coerce(name, kinds[name], value, from_text=False)
    return Settings(**values)
