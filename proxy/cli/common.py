"""What more than one ``toolpair`` command uses: shared flags, settings loading, the event loop, template files."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TypeAlias

from engine_launcher.templates.template_check import TemplateSource, template_from_file_text
from proxy.config import ConfigError, LogFormat, LogLevel, Settings, choices, load_settings
from proxy.ops.logs import setup_logging

__all__ = [
    "Subcommands",
    "add_listen_options",
    "add_store_options",
    "comma_list",
    "command_settings",
    "new_event_loop",
    "positive",
    "read_template_file",
    "start_logging",
]

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns: each command's module adds its parser to it."""


def add_listen_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--host", help="address to listen on, or several separated by commas (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8787)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    parser.add_argument("--log-level", choices=choices(LogLevel), help="default info")
    parser.add_argument("--log-format", choices=choices(LogFormat), help="text (default) or json, one object per line")
    parser.add_argument(
        "--api-keys-file", metavar="FILE", help="API keys clients must send, one per line (also TOOLPAIR_API_KEYS)"
    )


def add_store_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    # shared Responses store for replicas (issue 14)
    parser.add_argument(
        "--responses-store",
        metavar="WHERE",
        help="where stored Responses live: memory (default) or redis://HOST:PORT/DB, shared by replicas",
    )


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def command_settings(args: argparse.Namespace, *names: str) -> Settings:
    """A listening command's settings: the listen flags and ``names`` from ``args``, over the environment and file."""
    shared = ("host", "port", "log_level", "log_format", "api_keys_file")
    cli = {name: getattr(args, name, None) for name in (*shared, *names)}
    return load_settings(cli, config_file=args.config)


def start_logging(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (it roughly halves the per-request overhead), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def read_template_file(path: str) -> TemplateSource:
    """A chat template file (Jinja, or tokenizer_config-style JSON), read once; a bad one is a ConfigError."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read template {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"template {path} is not UTF-8 text") from None
    try:
        return template_from_file_text(text, path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
