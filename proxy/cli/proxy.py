"""``toolpair proxy``: toolpair as a sidecar in front of an engine someone else runs."""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from proxy.app import create_app
from proxy.banner import proxy_banner
from proxy.cli.common import (
    Subcommands,
    add_listen_options,
    add_store_options,
    command_settings,
    new_event_loop,
    read_template_file,
    start_logging,
)
from proxy.config import ApiMode, ConfigError, Settings, choices, listen_hosts
from proxy.engine.detect import Detection, resolve_engine
from proxy.engine.kinds import EngineKind
from proxy.engine.model_names import parse_model_map
from proxy.engine.plan import TOOL_CALL_FORMATS, settings_for_engine
from proxy.ops.auth import upstream_key_problem

__all__ = ["add_parser", "load_proxy_settings", "proxy_template", "resolve_proxy_settings"]


def add_parser(commands: Subcommands) -> None:
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
        "--responses-mode",
        choices=choices(ApiMode),
        help="serve /v1/responses by forwarding it to the engine (native) or through its chat completions "
        "(translate); auto: native for llama-server, translate otherwise",
    )
    _add_engine_options(proxy)
    proxy.add_argument(
        "--model-map",
        dest="model_map",
        action="append",
        metavar="PATTERN=MODEL",
        help="send MODEL to the engine for a requested model name matching the glob PATTERN (repeatable, first "
        "match wins; answers carry the client's name). Without one, an engine listing one model gets it for "
        "names it does not know",
    )
    add_store_options(proxy)
    proxy.add_argument(
        "--messages-mode",
        choices=choices(ApiMode),
        help="/v1/messages: native forwards Anthropic Messages, translate converts to Chat Completions (default auto)",
    )
    add_listen_options(proxy)
    proxy.set_defaults(run=_run_proxy)


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine-kind",
        choices=choices(EngineKind),
        help="what the upstream is, which decides what toolpair adapts (default auto: toolpair proxy asks "
        "the upstream; llama-server is told by its 'Server: llama.cpp' header, anything else is generic)",
    )
    parser.add_argument(
        "--tool-call-format",
        choices=TOOL_CALL_FORMATS,
        help="how the model writes tool calls, for engines that return them as text (default auto)",
    )
    parser.add_argument(
        "--chat-template-file",
        dest="chat_template",
        metavar="FILE",
        help="the model's chat template (Jinja, or tokenizer_config-style JSON), for an engine that returns "
        "tool calls as text: the call format and open reasoning follow from it (default: auto reads every "
        "marked form)",
    )


def load_proxy_settings(args: argparse.Namespace) -> Settings:
    """``toolpair proxy``'s settings from its flags, the environment and the config file, checked."""
    settings = command_settings(
        args,
        "upstream",
        "responses_mode",
        "messages_mode",
        "model_map",
        "engine_kind",
        "tool_call_format",
        "chat_template",
        "responses_store",
    )
    if not settings.upstream:
        raise ConfigError("an upstream is required: --upstream URL, TOOLPAIR_UPSTREAM or 'upstream:' in the config")
    problem = upstream_key_problem(settings)
    if problem is not None:
        raise ConfigError(problem)
    parse_model_map(settings.model_map)  # a bad entry is refused before anything starts
    return settings


def proxy_template(settings: Settings) -> str | None:
    """The ``--chat-template-file`` (``chat_template:``) text, read once at start-up; None without one."""
    return read_template_file(settings.chat_template).text if settings.chat_template else None


def resolve_proxy_settings(settings: Settings) -> tuple[Settings, Detection | None]:
    """What ``toolpair proxy`` starts with: a named engine resolved now, and what its chat template teaches.

    A ``--chat-template-file`` sets the tool-call format and open reasoning
    (:func:`~proxy.engine.plan.settings_for_engine`) for an engine that leaves calls in its text.
    An ``engine_kind`` of ``auto`` stays so: the engine is found in the background, and the same
    rule is applied to what is found (:class:`~proxy.engine.watch.EngineWatch`).
    """
    if settings.engine_kind is EngineKind.AUTO:
        return settings, None
    settings, found = resolve_engine(settings, None)
    return settings_for_engine(settings, proxy_template(settings)), found


def _run_proxy(args: argparse.Namespace) -> int:
    settings = load_proxy_settings(args)
    start_logging(settings)
    template = proxy_template(settings)
    settings, found = resolve_proxy_settings(settings)
    app = create_app(settings, find_engine=True, chat_template=template)  # auto: found in the background
    for line in proxy_banner(settings, found).splitlines():  # one record a line: JSON logs stay one object a line
        logging.getLogger("toolpair").info("%s", line)
    try:
        web.run_app(
            app,
            host=listen_hosts(settings.host),
            port=settings.port,
            handler_cancellation=True,
            access_log=None,
            print=None,
            loop=new_event_loop(),
        )
    except OSError as exc:  # an address that does not resolve, is not this machine's, or is taken
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    return 0
