"""``toolpair serve``: the managed llama-cpp-python engine and the proxy, in one process.

Before anything starts, :func:`plan_serve` settles every decision (model,
context size, chat template, GPU offload, engine port and key) and refuses a
bad setting with a clear message. :func:`build_serve_app` wires the engine in as
the upstream: its supervisor's lifetime is tied to the app's ``cleanup_ctx``,
and an :class:`~proxy.engine.queueing.EngineQueue` is the app's admission.
:func:`run_serve` listens, prints how to connect, and on SIGTERM or SIGINT
stops accepting, gives requests in flight ``shutdown_grace`` seconds, then stops
the engine.

``/ready`` (:mod:`proxy.http.probes`) answers 200 only while the engine is ready,
with its state, restarts and queue in the body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from engine_launcher.backends import RPC_FLAG, SystemProbes, detect_backend, parse_backend
from engine_launcher.gguf import GGUFError, context_length, read_metadata
from engine_launcher.gguf import chat_template as gguf_chat_template
from engine_launcher.install import LLAMA_CPP_VERSION, read_record
from engine_launcher.launch import READY_PATH, EngineLaunch, engine_command, engine_env, free_port
from engine_launcher.models import ModelError, bundled_model, choose_template, readable_model
from engine_launcher.process import ChildSpec, EngineState, EngineSupervisor, EngineUnavailable, RestartPolicy
from engine_launcher.rpc import parse_endpoints
from proxy import __version__
from proxy.config import ConfigError, Settings
from proxy.engine.plan import engine_setup
from proxy.engine.queueing import EngineQueue
from proxy.engine.toolcalls import detect_tool_call_format, template_opens_think
from proxy.engine.upstream import Upstream
from proxy.errors import EngineUnavailableError
from proxy.http.app import create_app
from proxy.http.probes import READINESS
from proxy.ops.engine_probe import ENGINE_PROBE, EngineSnapshot

__all__ = ["QUEUE", "SUPERVISOR", "ServePlan", "banner", "build_serve_app", "plan_serve", "run_serve"]

log = logging.getLogger("toolpair")

SUPERVISOR = web.AppKey("supervisor", EngineSupervisor)
QUEUE = web.AppKey("queue", EngineQueue)


@dataclass(frozen=True)
class ServePlan:
    """Every decision ``serve`` makes before it starts anything."""

    launch: EngineLaunch
    backend: str
    warnings: list[str] = field(default_factory=list)
    template_text: str | None = None
    """The Jinja chat template the engine renders with (for format detection)."""

    @property
    def model_name(self) -> str:
        return self.launch.model.name


def _progress(out: TextIO) -> Callable[[int, int], None]:
    shown = [-1]

    def report(done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if percent // 10 != shown[0] // 10 or done == total:
            shown[0] = percent
            print(f"assembling the bundled model: {percent}%", file=out, flush=True)

    return report


def plan_serve(settings: Settings, *, out: TextIO = sys.stderr, check_machine: bool = True) -> ServePlan:
    """Resolve model, template, context and offload; raise ConfigError on anything unusable."""
    warnings: list[str] = []
    for name, least in (("max_concurrency", 1), ("engine_max_ctx", 1), ("max_queue", 0), ("engine_max_restarts", 0)):
        if getattr(settings, name) < least:
            raise ConfigError(f"{name} must be at least {least}")
    try:
        if settings.model:
            model = readable_model(Path(settings.model).expanduser())
        else:
            model = bundled_model(progress=_progress(out))
        metadata = read_metadata(model)
        template = choose_template(settings.chat_template, metadata)
        backend_choice = parse_backend(settings.engine_backend)
    except (ModelError, GGUFError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    trained = context_length(metadata)
    n_ctx = min(trained, settings.engine_max_ctx) if trained else settings.engine_max_ctx
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError("llama-cpp-python is not installed here: run `toolpair engine install`")
    record = read_record()
    if record is None:
        backend = "unknown"
        warnings.append("llama-cpp-python was not installed by `toolpair engine install`; its backend is unknown")
    else:
        backend = record.backend
        if check_machine:
            found = detect_backend(os.environ, SystemProbes(timeout=3.0), explicit=settings.engine_backend)
            if found.backend.value != record.backend:
                wanted = (
                    f"engine_backend is {found.backend.value}"
                    if backend_choice is not None
                    else f"this machine gets {found.backend.value} ({found.reason})"
                )
                warnings.append(
                    f"the engine is built for {record.backend}, but {wanted}; "
                    f"run `toolpair engine install --backend {found.backend.value}`"
                )
    try:
        rpc_servers = parse_endpoints(settings.engine_rpc)
    except ValueError as exc:
        raise ConfigError(f"engine_rpc: {exc}") from None
    if rpc_servers and record is not None and RPC_FLAG not in record.cmake_args:
        raise ConfigError("the engine was built without RPC: run `toolpair engine install --rebuild`")
    gpu_layers = settings.engine_gpu_layers
    if gpu_layers is None:
        # An unknown build gets -1 too: a CPU build ignores it. RPC workers count as GPUs: all layers go to them.
        gpu_layers = 0 if backend == "cpu" and not rpc_servers else -1
    launch = EngineLaunch(
        model=model,
        port=free_port(),
        api_key=secrets.token_urlsafe(24),
        n_ctx=n_ctx,
        n_gpu_layers=gpu_layers,
        chat_template=template,
        rpc_servers=rpc_servers,
    )
    if template is not None:
        template_text = json.loads(template.read_text(encoding="utf-8")).get("chat_template")
    else:
        template_text = gguf_chat_template(metadata)
    return ServePlan(launch, backend, warnings, template_text if isinstance(template_text, str) else None)


def managed_settings(settings: Settings, plan: ServePlan) -> Settings:
    """Settings that follow from the engine serve runs: its kind, its template's tool-call format.

    Only ``auto`` or unset values are filled in; explicit settings win.
    """
    changes: dict[str, object] = {"engine_kind": "llama-cpp-python"}
    text = plan.template_text or ""
    if settings.tool_call_format == "auto" and text:
        detected = detect_tool_call_format(text)
        changes["tool_call_format"] = "auto" if detected == "none" else detected
    if not settings.think_in_prompt and text:
        changes["think_in_prompt"] = template_opens_think(text)
    if settings.count_tokens_template is None and plan.launch.chat_template is not None:
        # count_tokens renders with the very template the engine uses, so its count is exact.
        changes["count_tokens_template"] = str(plan.launch.chat_template)
    return dataclasses.replace(settings, **changes)  # type: ignore[arg-type]


def _local(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else (f"[{host}]" if ":" in host else host)


def banner(settings: Settings, plan: ServePlan) -> str:
    """How to connect, printed at start-up.

    >>> from pathlib import Path
    >>> plan = ServePlan(EngineLaunch(Path("m.gguf"), 1, "k", 4096), "cpu")
    >>> print(banner(Settings(port=8787), plan).splitlines()[3])
      OpenAI SDK:     OpenAI(base_url="http://127.0.0.1:8787/v1", api_key="any")
    """
    base = f"http://{_local(settings.host)}:{settings.port}"
    launch = plan.launch
    template = launch.chat_template.name if launch.chat_template else "the model's own"
    where = " (all interfaces)" if settings.host in ("0.0.0.0", "", "::") else ""
    return "\n".join(
        [
            f"toolpair {__version__} serving {plan.model_name} with llama-cpp-python {LLAMA_CPP_VERSION}",
            f"  engine:         {plan.backend} build, n_ctx {launch.n_ctx}, gpu layers {launch.n_gpu_layers}, "
            f"chat template {template}"
            + (f", RPC workers {','.join(launch.rpc_servers)}" if launch.rpc_servers else ""),
            f"  listening on:   {base}{where}   health: {base}/health   ready: {base}/ready",
            f'  OpenAI SDK:     OpenAI(base_url="{base}/v1", api_key="any")',
            f'  Anthropic SDK:  Anthropic(base_url="{base}", api_key="any")',
            f"  Claude Code:    ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=any claude",
        ]
    )


def _engine_status(engine: EngineSupervisor, queue: EngineQueue) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": engine.state.value,
        "restarts": engine.restarts,
        "queue": {"active": queue.active, "waiting": queue.waiting, "max_queue": queue.max_queue},
    }
    if engine.reason:
        status["reason"] = engine.reason.splitlines()[0]
    return status


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine = app[SUPERVISOR]
    await engine.start()
    yield
    await engine.shutdown()


def build_serve_app(
    settings: Settings, plan: ServePlan, *, on_give_up: Callable[[str], None] | None = None
) -> web.Application:
    """The proxy app with the managed engine as its upstream and its queue as admission."""
    launch = plan.launch
    spec = ChildSpec(engine_command(launch), launch.url + READY_PATH, engine_env(launch, os.environ))
    policy = RestartPolicy(
        start_timeout=settings.engine_start_timeout,
        stop_timeout=settings.engine_stop_timeout,
        max_restarts=settings.engine_max_restarts,
    )
    engine = EngineSupervisor(spec, policy, on_give_up=on_give_up, quote_requests=settings.log_bodies)

    async def engine_ready() -> None:
        try:
            await engine.ensure_ready()
        except EngineUnavailable as exc:
            raise EngineUnavailableError(f"the engine is not available: {str(exc).splitlines()[0]}") from None

    queue = EngineQueue(
        engine_ready,
        max_concurrency=settings.max_concurrency,
        max_queue=settings.max_queue,
        ready_timeout=settings.engine_ready_wait,
    )
    # The managed engine is llama-cpp-python: adapt requests to it and extract its tool calls.
    settings = managed_settings(settings, plan)
    upstream = Upstream(
        launch.url,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.upstream_read_timeout,
        api_key=launch.api_key,
        reuses_connections=engine_setup(settings).profile.reuses_connections,
    )
    app = create_app(settings, upstream, admission=queue)
    app[SUPERVISOR] = engine
    app[QUEUE] = queue
    app[ENGINE_PROBE] = lambda: EngineSnapshot(
        state=engine.state.value,
        restarts=engine.restarts,
        backend=plan.backend,
        model=plan.model_name,
        queue_depth=queue.waiting,
    )

    async def engine_is_ready() -> tuple[bool, dict[str, Any]]:
        # Readiness is the engine's state, read for health output only.
        return engine.state is EngineState.READY, {"engine": _engine_status(engine, queue)}

    app[READINESS] = engine_is_ready
    app.cleanup_ctx.append(_engine_ctx)
    return app


async def run_serve(settings: Settings, plan: ServePlan, *, out: TextIO = sys.stdout) -> int:
    """Serve until SIGTERM or SIGINT (exit 0) or until the engine gives up (exit 1)."""
    stop = asyncio.Event()
    exit_code = 0

    def give_up(reason: str) -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()

    for warning in plan.warnings:
        log.warning("%s", warning)
    app = build_serve_app(settings, plan, on_give_up=give_up)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=settings.shutdown_grace)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    print(banner(settings, plan), file=out, flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)  # a second signal now ends toolpair at once
    log.info(
        "shutting down: no new connections; requests in flight get %gs, then the engine stops",
        settings.shutdown_grace,
    )
    await runner.cleanup()
    log.info("toolpair stopped")
    return exit_code
