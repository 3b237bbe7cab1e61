"""The ``toolpair`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from engine_launcher.builder.backends import BACKEND_CHOICES, build_plan, detect_backend
from engine_launcher.builder.gguf import GGUFError, read_metadata
from engine_launcher.builder.gguf import chat_template as gguf_chat_template
from engine_launcher.builder.install import InstallError, install_engine, rpc_server_command
from engine_launcher.builder.machine import this_machine
from engine_launcher.builder.models import ModelError, bundled_model, choose_template, readable_model
from engine_launcher.builder.plan import EngineSettings, plan_engine
from engine_launcher.builder.record import read_record
from engine_launcher.inside.rpc import DEFAULT_PORT, WILDCARD_HOSTS
from engine_launcher.supervise.launch import CACHE_TYPES, SPLIT_MODES, child_env
from engine_launcher.templates.template_check import (
    Renderer,
    TemplateSource,
    check_template,
    headline,
    meaning,
    template_from_file_text,
)
from proxy import __version__
from proxy.app import create_app
from proxy.config import ApiMode, ConfigError, LogFormat, LogLevel, Settings, choices, load_settings
from proxy.engine.detect import Detection, engine_lines, resolve_engine
from proxy.engine.kinds import EngineKind
from proxy.engine.model_names import model_line, parse_model_map
from proxy.engine.plan import TOOL_CALL_FORMATS, engine_setup, settings_for_engine
from proxy.engine.template_readback import read_back
from proxy.normalize import cli as normalize_cli
from proxy.ops.auth import keys_required, upstream_key_problem
from proxy.ops.logs import setup_logging
from proxy.ops.paths import TOOLPAIR_METRICS_PATH
from proxy.ops.status import public_url
from proxy.serve import check_engine, plan_serve, run_serve

__all__ = ["build_parser", "main", "serve_settings"]

DESCRIPTION = """\
toolpair puts parallel tool results back into call order before a request
reaches the model, so chat templates that render results by position pair each
result with the right call.

commands:
  proxy      run as a sidecar in front of an OpenAI-compatible engine you already run
             (Chat Completions, Anthropic Messages and Responses)
  serve      run llama-cpp-python for you (the bundled model by default), with toolpair in front
  engine     build and install llama-cpp-python for this machine (engine install), or show
             which backend this machine would get (engine detect)
  normalize  put tool results in JSONL or Parquet datasets into call order, with the proxy's rules
  rpc-worker run a llama.cpp RPC worker that `serve --rpc` splits a model across
  check-template  say whether a model's chat template ties tool results to their calls by
             position only (toolpair needed) or by ID
"""


def _add_listen_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8787)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    parser.add_argument("--log-level", choices=choices(LogLevel), help="default info")
    parser.add_argument("--log-format", choices=choices(LogFormat), help="text (default) or json, one object per line")
    parser.add_argument(
        "--api-keys-file", metavar="FILE", help="API keys clients must send, one per line (also TOOLPAIR_API_KEYS)"
    )


def _add_store_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    # shared Responses store for replicas (issue 14)
    parser.add_argument(
        "--responses-store",
        metavar="WHERE",
        help="where stored Responses live: memory (default) or redis://HOST:PORT/DB, shared by replicas",
    )


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


def _size(text: str) -> int:
    """A byte count: 1073741824, 1G, 1GiB, 512M, 0.

    >>> _size("1GiB"), _size("512m"), _size("0")
    (1073741824, 536870912, 0)
    """
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(cleaned[-1:], 1)
    number = cleaned[:-1] if scale > 1 else cleaned
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or e.g. 512M, 2G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value * scale)


def _shares(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r} (e.g. 3,1)") from None


_FLASH_ATTN = {"on": True, "off": False, "auto": None}


def _flash_attn(text: str) -> str:
    if text not in _FLASH_ATTN:
        raise argparse.ArgumentTypeError(f"must be on, off or auto, not {text!r}")
    return text


# serve's flags for the engine, with llama-server's names; each is also a setting (YAML, TOOLPAIR_*).
SERVE_ENGINE_SETTINGS = (
    "model",
    "engine_ctx_size",
    "chat_template",
    "engine_logprobs",
    "prompt_cache_size",
    "engine_threads",
    "engine_threads_batch",
    "engine_batch_size",
    "engine_ubatch_size",
    "engine_flash_attn",
    "engine_cache_type_k",
    "engine_cache_type_v",
    "engine_mlock",
    "engine_mmap",
    "engine_gpu_layers",
    "engine_main_gpu",
    "engine_split_mode",
    "engine_tensor_split",
    "engine_args",
)


def _add_serve_engine_options(serve: argparse.ArgumentParser) -> None:
    model = serve.add_argument_group("model, context and memory")
    model.add_argument("--model", metavar="PATH", help="GGUF model file (default: the bundled model)")
    model.add_argument(
        "-c",
        "--ctx-size",
        dest="engine_ctx_size",
        type=_positive,
        metavar="N",
        help="context size (default: the model's training context, smaller if memory is short)",
    )
    model.add_argument(
        "--chat-template-file",
        dest="chat_template",
        metavar="FILE",
        help="tokenizer_config-style JSON with the chat template (default: the model's own)",
    )
    model.add_argument(
        "--logprobs",
        dest="engine_logprobs",
        action="store_const",
        const=True,
        help="serve logprobs (costs n_ctx x vocabulary x 4 bytes of memory; off: such requests get 400)",
    )
    model.add_argument(
        "--prompt-cache-size",
        dest="prompt_cache_size",
        type=_size,
        metavar="BYTES",
        help="RAM prompt cache for recent conversations, e.g. 2G (default 1G; 0 turns it off)",
    )
    cpu = serve.add_argument_group("threads, batches and KV cache")
    cpu.add_argument(
        "-t", "--threads", dest="engine_threads", type=_positive, metavar="N", help="default: physical cores"
    )
    cpu.add_argument(
        "-tb", "--threads-batch", dest="engine_threads_batch", type=_positive, metavar="N", help="default: every core"
    )
    cpu.add_argument("-b", "--batch-size", dest="engine_batch_size", type=_positive, metavar="N", help="default 512")
    cpu.add_argument("-ub", "--ubatch-size", dest="engine_ubatch_size", type=_positive, metavar="N", help="default 512")
    cpu.add_argument(
        "-fa",
        "--flash-attn",
        dest="engine_flash_attn",
        type=_flash_attn,
        nargs="?",
        const="on",
        metavar="on|off|auto",
        help="flash attention (bare -fa: on; default: the engine's, off)",
    )
    for which in ("k", "v"):
        cpu.add_argument(
            f"--cache-type-{which}",
            dest=f"engine_cache_type_{which}",
            choices=list(CACHE_TYPES),
            metavar="TYPE",
            help=f"KV cache type for {which.upper()}: {', '.join(CACHE_TYPES)} (default f16)",
        )
    cpu.add_argument("--mlock", dest="engine_mlock", action="store_const", const=True, help="lock the model in RAM")
    cpu.add_argument(
        "--no-mmap", dest="engine_mmap", action="store_const", const=False, help="read the model instead of mapping it"
    )
    gpu = serve.add_argument_group("GPU")
    gpu.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="engine_gpu_layers",
        type=int,
        metavar="N",
        help="layers on the GPU, -1 all (default: all on a GPU build)",
    )
    gpu.add_argument("--main-gpu", dest="engine_main_gpu", type=int, metavar="I", help="GPU for the model (default 0)")
    gpu.add_argument("--split-mode", dest="engine_split_mode", choices=list(SPLIT_MODES), help="across GPUs")
    gpu.add_argument(
        "--tensor-split", dest="engine_tensor_split", type=_shares, metavar="N,N,...", help="shares per GPU, e.g. 3,1"
    )
    other = serve.add_argument_group("any other llama-cpp-python server setting")
    other.add_argument(
        "--engine-arg",
        dest="engine_args",
        action="append",
        metavar="KEY=VALUE",
        help="passed as --KEY VALUE, checked against the installed engine's settings (repeatable)",
    )


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
    _add_store_options(proxy)
    proxy.add_argument(
        "--messages-mode",
        choices=choices(ApiMode),
        help="/v1/messages: native forwards Anthropic Messages, translate converts to Chat Completions (default auto)",
    )
    _add_listen_options(proxy)
    proxy.set_defaults(run=_run_proxy)
    _add_normalize_parser(commands)

    serve = commands.add_parser(
        "serve",
        help="run llama-cpp-python and toolpair in front of it",
        description=(
            "Start llama-cpp-python with MODEL (default: the bundled Gemma 3 270M) on a private "
            "loopback port and serve it through toolpair. Install the engine first with "
            "`toolpair engine install`."
        ),
    )
    _add_serve_engine_options(serve)
    serve.add_argument_group("llama.cpp RPC").add_argument(
        "--rpc",
        dest="engine_rpc",
        metavar="HOST:PORT,...",
        type=_comma_list,
        help="split the model across these `toolpair rpc-worker`s (also TOOLPAIR_ENGINE_RPC); see docs/rpc.md",
    )
    parallel = serve.add_argument_group("parallel engines")
    parallel.add_argument(
        "--parallel",
        dest="engine_parallel",
        type=_positive,
        metavar="N",
        help="run N engines of the model side by side, N times the memory; each gets 1/N of the cores "
        "unless -t/-tb say otherwise (default 1; see docs/parallel.md)",
    )
    listening = serve.add_argument_group("listening, logging and the Responses store")
    _add_store_options(listening)
    _add_listen_options(listening)
    serve.add_argument(
        "--check",
        action="store_true",
        help="start the engine as serve would, have it generate a few tokens, say how that went and exit "
        "(0: it generated; 1: it could not, and why)",
    )
    serve.set_defaults(run=_run_serve)
    _add_rpc_worker_parser(commands)
    _add_check_template_parser(commands)

    engine = commands.add_parser("engine", help="build and install the managed engine")
    engine_commands = engine.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    install = engine_commands.add_parser(
        "install",
        help="build llama-cpp-python for a backend and install it here",
        description=(
            "Build llama-cpp-python for BACKEND (auto: detect this machine's), cache the wheel under "
            "$TOOLPAIR_CACHE/wheels/BACKEND, install it into this Python environment and verify it. "
            "Extra CMake flags come from CMAKE_ARGS."
        ),
    )
    install.add_argument("--backend", choices=BACKEND_CHOICES, help="default: engine_backend setting (auto)")
    install.add_argument("--rebuild", action="store_true", help="build again even if a cached wheel fits")
    install.add_argument(
        "--portable",
        action="store_true",
        default=None,
        help="build for llama.cpp's baseline CPU (x86-64-v3) instead of this one, to run elsewhere "
        "(also TOOLPAIR_ENGINE_PORTABLE=1)",
    )
    install.add_argument(
        "--amx",
        action="store_true",
        default=None,
        help="keep llama.cpp's AMX weight path, left out by default since it crashes (llama.cpp #20824; "
        "also TOOLPAIR_ENGINE_AMX=1)",
    )
    install.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    detect = engine_commands.add_parser("detect", help="show the backend this machine would get, and why")
    detect.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    for action in (install, detect):
        action.set_defaults(run=_run_engine)
    return parser


def _add_normalize_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    normalize = commands.add_parser("normalize", help=normalize_cli.HELP, description=normalize_cli.DESCRIPTION)
    normalize_cli.add_arguments(normalize)
    normalize.set_defaults(run=_run_normalize)


def _add_rpc_worker_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = commands.add_parser(
        "rpc-worker",
        help="run a llama.cpp RPC worker that `serve --rpc` splits a model across",
        description=(
            "Run llama.cpp's rpc-server, built by `toolpair engine install` against this engine, so that "
            "`toolpair serve --rpc HOST:PORT,...` on another machine can put model layers on this one. "
            "RPC has no authentication and no encryption: listen only on a private network that only the "
            "serving machine can reach."
        ),
    )
    worker.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    worker.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    worker.add_argument("--threads", type=_positive, metavar="N", help="CPU threads (default: the CPU's cores)")
    worker.add_argument(
        "--cache", action="store_true", help="keep received tensors in a local cache, for faster reloads"
    )
    worker.add_argument(
        "--allow-all-interfaces",
        action="store_true",
        help="allow --host 0.0.0.0 or :: (e.g. inside a container whose published port decides who can reach it)",
    )
    worker.set_defaults(run=_run_rpc_worker)


def _add_check_template_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "check-template",
        help="say whether a model's chat template pairs tool results with calls by position only",
        description=(
            "Render the chat template with one assistant turn that calls the same tool twice in parallel, "
            "with the two results in call order and reversed, and say whether only their position ties "
            "results to calls (exit 1: keep toolpair in front), an ID does or the template orders them "
            "itself (exit 0), or the template cannot render parallel calls or fails (exit 2). Default: "
            "the template `toolpair serve` would use (the model's own, or the configured chat_template, "
            "or the ChatML fallback for a model without one)."
        ),
    )
    which = check.add_mutually_exclusive_group()
    which.add_argument("--model", metavar="FILE.gguf", help="the GGUF model whose template to check")
    which.add_argument(
        "--template", metavar="FILE", help="a Jinja template, or a tokenizer_config-style JSON with chat_template"
    )
    check.add_argument(
        "--renderer",
        choices=[r.value for r in Renderer],
        default=Renderer.LLAMA_CPP_PYTHON.value,
        help="render as llama-cpp-python (toolpair serve's engine; default) or as transformers "
        "(vLLM; llama-server --jinja follows its dialect)",
    )
    check.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    check.set_defaults(run=_run_check_template)


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _settings(args: argparse.Namespace, *names: str) -> Settings:
    shared = ("host", "port", "log_level", "log_format", "api_keys_file")
    cli = {name: getattr(args, name, None) for name in (*shared, *names)}
    return load_settings(cli, config_file=args.config)


def _setup_logging(settings: Settings) -> None:
    setup_logging(settings.log_level, settings.log_format)


def load_proxy_settings(args: argparse.Namespace) -> Settings:
    """``toolpair proxy``'s settings from its flags, the environment and the config file, checked."""
    settings = _settings(
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
    return _template_file(settings.chat_template).text if settings.chat_template else None


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
    _setup_logging(settings)
    template = proxy_template(settings)
    settings, found = resolve_proxy_settings(settings)
    app = create_app(settings, find_engine=True, chat_template=template)  # auto: found in the background
    for line in proxy_banner(settings, found).splitlines():  # one record a line: JSON logs stay one object a line
        logging.getLogger("toolpair").info("%s", line)
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        handler_cancellation=True,
        access_log=None,
        print=None,
        loop=new_event_loop(),
    )
    return 0


def proxy_banner(settings: Settings, found: Detection | None) -> str:
    """What ``toolpair proxy`` says at start-up: the engine (when named) and what each path does.

    A detected engine is not known yet when this is said: the log says what was found, and when.

    >>> from proxy.engine.detect import detect_engine, ProbeAnswer
    >>> found = detect_engine([ProbeAnswer("/health", 200, {"server": "llama.cpp"})])
    >>> settings = Settings(upstream="http://127.0.0.1:8080", engine_kind=found.kind)
    >>> print(proxy_banner(settings, found).splitlines()[1])
      engine:         llama-server (detected: /health answered with "Server: llama.cpp")
    """
    base = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '', '::') else settings.host}:{settings.port}"
    upstream = public_url(settings.upstream or "")
    credentials = (
        "toolpair checks its own keys; the engine gets upstream_api_key"
        if keys_required(settings) and settings.upstream_api_key
        else "toolpair checks its own keys; none reach the engine"
        if keys_required(settings)
        else "the client's own (Authorization, x-api-key) reach the engine, which checks them"
    )
    lines = [
        f"toolpair {__version__} in front of {upstream}, listening on {base}",
        *engine_lines(settings, found),
        *_tool_call_lines(settings),
        model_line(parse_model_map(settings.model_map), None),
        f"  /metrics:       the engine's own, toolpair's families appended; toolpair's alone: {TOOLPAIR_METRICS_PATH}",
        f"  credentials:    {credentials}",
        "  override:       --engine-kind, --messages-mode, --responses-mode, --model-map",
        f'  OpenAI SDK:     OpenAI(base_url="{base}/v1", api_key="any")',
        f"  Claude Code:    ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=any claude",
    ]
    return "\n".join(lines)


def _tool_call_lines(settings: Settings) -> list[str]:
    """The banner's line on how tool calls are read out of the engine's text, where they are."""
    if settings.engine_kind is EngineKind.AUTO:
        return []  # not known until the engine is found: the log says then
    if engine_setup(settings).profile.parses_tool_calls or settings.tool_call_format == "none":
        return []
    source = f"from {settings.chat_template}" if settings.chat_template else "no --chat-template-file"
    think = "; the prompt opens <think>" if settings.think_in_prompt else ""
    return [f"  tool calls:     {settings.tool_call_format} ({source}){think}"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (it roughly halves the per-request overhead), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _run_normalize(args: argparse.Namespace) -> int:
    return normalize_cli.run_args(args)


def serve_settings(args: argparse.Namespace) -> Settings:
    """serve's settings: its flags over TOOLPAIR_* variables over the config file over defaults."""
    if isinstance(args.engine_flash_attn, str):
        args.engine_flash_attn = _FLASH_ATTN[args.engine_flash_attn]  # auto: None, the engine's default
    return _settings(args, "responses_store", *SERVE_ENGINE_SETTINGS, "engine_parallel", "engine_rpc")


def _run_serve(args: argparse.Namespace) -> int:
    settings = serve_settings(args)
    _setup_logging(settings)
    plan = plan_serve(settings)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        if args.check:
            return runner.run(check_engine(settings, plan))
        return runner.run(run_serve(settings, plan))


def _run_rpc_worker(args: argparse.Namespace) -> int:
    if args.host.strip() in WILDCARD_HOSTS and not args.allow_all_interfaces:
        print(
            f"toolpair rpc-worker: refusing --host {args.host!r}: RPC has no authentication, and this listens on "
            "every interface. Give the private address to listen on, or add --allow-all-interfaces where "
            "something else (a container's published port, a firewall) decides who can connect.",
            file=sys.stderr,
        )
        return 2
    record = read_record()
    server = record.rpc_server if record else None
    if not server or not os.access(server, os.X_OK):
        print(
            "toolpair rpc-worker: rpc-server is not installed in this environment: run `toolpair engine install` "
            "(it builds the engine with RPC, and rpc-server against it)",
            file=sys.stderr,
        )
        return 1
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"toolpair rpc-worker: listening on {args.host}:{args.port} without authentication; "
            "only the serving machine may be able to reach it",
            file=sys.stderr,
        )
    assert record is not None
    # The worker offers the devices serve's engine would use, with the same environment: serve's plan.
    engine = plan_engine(EngineSettings(), this_machine(), record, os.environ)
    devices = engine.devices
    if engine.refusal is not None:  # as serve: rpc-server would fail too
        print(f"toolpair rpc-worker: {engine.refusal}", file=sys.stderr)
        return 2
    if devices is not None and devices.problem:
        print(f"toolpair rpc-worker: warning: {devices.problem}", file=sys.stderr)
    elif devices is not None and devices.names:
        note = f" ({devices.note})" if devices.note else ""
        print(f"toolpair rpc-worker: device: {', '.join(devices.names)}{note}", file=sys.stderr)
    print(f"toolpair rpc-worker: {server} on {args.host}:{args.port}", file=sys.stderr, flush=True)
    command = rpc_server_command(server, args.host, args.port, threads=args.threads, cache=args.cache)
    # rpc-server says its endpoint and devices through stdio, which a pipe or a file (a journal, `docker
    # logs`) would hold back until 4 KiB gathered: line-buffered, where coreutils' stdbuf is there.
    stdbuf = shutil.which("stdbuf")
    if stdbuf is not None:
        command = [stdbuf, "-oL", *command]
    os.execve(command[0], command, child_env(os.environ, engine.env))


def _serve_template(settings: Settings) -> TemplateSource:
    """The template ``toolpair serve`` would hand the engine for these settings, read from its file."""
    try:
        model = readable_model(Path(settings.model).expanduser()) if settings.model else bundled_model()
        metadata = read_metadata(model)
        chosen = choose_template(settings.chat_template, metadata)
    except (ModelError, GGUFError) as exc:
        raise ConfigError(str(exc)) from None
    if chosen is None:
        text = gguf_chat_template(metadata)
        assert text is not None  # choose_template returns None only for a model with a template
        return TemplateSource(text, origin=f"the chat template in {model.name}")
    if settings.chat_template:
        origin = f"{chosen} (chat_template setting)"
    else:
        origin = f"{chosen.name}: {model.name} has no chat template, so toolpair serve uses its ChatML fallback"
    return template_from_file_text(chosen.read_text(encoding="utf-8"), origin)


def _template_file(path: str) -> TemplateSource:
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


def _run_check_template(args: argparse.Namespace) -> int:
    if args.template:
        source = _template_file(args.template)
    else:
        source = _serve_template(load_settings({"model": args.model}, config_file=args.config))
    renderer = Renderer(args.renderer)
    verdict = check_template(source, renderer)
    print(f"template: {source.origin}")
    print(f"rendered the way {renderer.value} renders it, with one tool called twice in parallel")
    print(f"verdict: {verdict.pairing.value}: {headline(verdict.pairing)}")
    if verdict.detail:
        print(f"  the template says: {verdict.detail}")
    print(_wrapped(meaning(verdict.pairing)))
    logging.getLogger("toolpair.toolcalls").setLevel(logging.ERROR)  # the line below says how the calls fared
    print(read_back(source, renderer).line())
    return verdict.exit_status


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100, initial_indent="  ", subsequent_indent="  ")


def _run_engine(args: argparse.Namespace) -> int:
    settings = load_settings({"engine_backend": getattr(args, "backend", None)}, config_file=args.config)
    if args.engine_command == "detect":
        machine = this_machine()
        found = detect_backend(os.environ, machine, explicit=settings.engine_backend)
        plan = build_plan(found, os.environ, machine.probes, amx=settings.engine_amx)
        print(f"backend: {found.backend.value}\nreason: {found.reason}")
        print(f"CMAKE_ARGS: {plan.env.get('CMAKE_ARGS', '')}")
        for problem in plan.problems:
            print(f"warning: {problem}")
        return 0
    try:
        amx = bool(args.amx) or settings.engine_amx
        install_engine(settings.engine_backend, rebuild=args.rebuild, portable=args.portable, amx=amx)
    except (InstallError, ValueError) as exc:
        print(f"toolpair: {exc}", file=sys.stderr)
        return 1
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
