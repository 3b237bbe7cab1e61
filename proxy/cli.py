"""The ``toolpair`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from aiohttp import web

from proxy import __version__
from proxy.config import ConfigError, Settings, load_settings

__all__ = ["build_parser", "main"]

DESCRIPTION = """\
toolpair puts parallel tool results back into call order before a request
reaches the model, so chat templates that render results by position pair each
result with the right call.

commands:
  proxy   run as a sidecar in front of an OpenAI-compatible engine you already run
          (also serves Anthropic Messages: /v1/messages, /v1/messages/count_tokens)
"""


def _add_listen_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8787)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="default info")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolpair", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"toolpair {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    proxy = commands.add_parser(
        "proxy",
        help="run as a sidecar in front of an engine you already run",
        description=(
            "Listen for OpenAI-compatible requests, restore the call order of tool results, "
            "and forward everything to UPSTREAM. Settings come from the command line, then "
            "TOOLPAIR_* variables, then --config, then defaults."
        ),
    )
    proxy.add_argument("--upstream", metavar="URL", help="base URL of the engine, e.g. http://127.0.0.1:8080")
    proxy.add_argument(
        "--messages-mode",
        choices=["auto", "native", "translate"],
        help="/v1/messages: native forwards Anthropic Messages, translate converts to Chat Completions (default auto)",
    )
    _add_listen_options(proxy)
    proxy.set_defaults(run=_run_proxy)
    return parser


def _settings(args: argparse.Namespace, *names: str) -> Settings:
    cli = {name: getattr(args, name, None) for name in ("host", "port", "log_level", *names)}
    return load_settings(cli, config_file=args.config)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def _run_proxy(args: argparse.Namespace) -> int:
    from proxy.server import create_app

    settings = _settings(args, "upstream", "messages_mode")
    if not settings.upstream:
        raise ConfigError("an upstream is required: --upstream URL, TOOLPAIR_UPSTREAM or 'upstream:' in the config")
    _setup_logging(settings.log_level)
    logging.getLogger("toolpair").info(
        "toolpair %s listening on http://%s:%d, upstream %s",
        __version__,
        settings.host,
        settings.port,
        settings.upstream,
    )
    web.run_app(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        handler_cancellation=True,
        access_log=None,
        print=None,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    try:
        code: int = args.run(args)
    except ConfigError as exc:
        print(f"toolpair: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
