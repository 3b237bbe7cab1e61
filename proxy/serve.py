"""``toolpair serve``: the managed llama-cpp-python engine and the proxy, in one process.

Before anything starts, :func:`plan_serve` settles every decision (model,
context size, chat template, GPU offload, engine port and key) and refuses a
bad setting with a clear message. :func:`build_serve_app` wires the engine in as
the upstream: with ``engine_parallel`` N, N engine processes of the same model,
each on its own loopback port and key and each with its own supervisor, whose
lifetimes are tied to the app's ``cleanup_ctx``. An
:class:`~proxy.queueing.EnginePool` over them is the app's admission: it
sends each request to a free engine, preferring the one that last served the
same conversation.
:func:`run_serve` listens, prints how to connect, and on SIGTERM or SIGINT
stops accepting, gives requests in flight ``shutdown_grace`` seconds, then stops
the engine.

``/ready`` (:mod:`proxy.health`) answers 200 while some engine is ready, with
each engine's state and restarts, and the queue, in the body.
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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from engine_launcher.backends import SystemProbes, detect_backend, parse_backend
from engine_launcher.gguf import GGUFError, context_length, read_metadata
from engine_launcher.gguf import chat_template as gguf_chat_template
from engine_launcher.install import LLAMA_CPP_VERSION, read_record
from engine_launcher.launch import READY_PATH, EngineLaunch, engine_command, engine_env, free_port
from engine_launcher.models import ModelError, bundled_model, choose_template
from engine_launcher.process import ChildSpec, EngineState, EngineSupervisor, EngineUnavailable, RestartPolicy
from proxy import __version__
from proxy.config import ConfigError, Settings
from proxy.engine_status import ENGINE_PROBE, EngineReading, EngineSnapshot, overall_state
from proxy.errors import EngineUnavailableError
from proxy.health import READINESS
from proxy.queueing import EnginePool, PoolEngine
from proxy.server import create_app
from proxy.toolcalls import detect_tool_call_format, template_opens_think
from proxy.upstream import EngineTarget, Upstream

__all__ = ["QUEUE", "SUPERVISORS", "ServePlan", "banner", "build_serve_app", "plan_serve", "run_serve"]

log = logging.getLogger("toolpair")

SUPERVISORS = web.AppKey("supervisors", dict[str, EngineSupervisor])
"""Each engine's supervisor by engine name (engine-0, engine-1, ...)."""
QUEUE = web.AppKey("queue", EnginePool)


@dataclass(frozen=True)
class ServePlan:
    """Every decision ``serve`` makes before it starts anything."""

    launch: EngineLaunch
    backend: str
    warnings: list[str] = field(default_factory=list)
    template_text: str | None = None
    """The Jinja chat template the engine renders with (for format detection)."""
    parallel: tuple[EngineLaunch, ...] = ()
    """With engine_parallel N > 1: the N engines, each with its own port and key (``launch`` is the first)."""

    @property
    def launches(self) -> tuple[EngineLaunch, ...]:
        """Every engine serve starts."""
        return self.parallel or (self.launch,)

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
    for name, least in (
        ("max_concurrency", 1),
        ("engine_max_ctx", 1),
        ("max_queue", 0),
        ("engine_max_restarts", 0),
        ("engine_parallel", 1),
    ):
        if getattr(settings, name) < least:
            raise ConfigError(f"{name} must be at least {least}")
    try:
        if settings.model:
            model = Path(settings.model).expanduser()
            if not model.is_file():
                raise ConfigError(f"model file {model} does not exist")
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
    gpu_layers = settings.engine_gpu_layers
    if gpu_layers is None:
        # An unknown build gets -1 too: a CPU build ignores it.
        gpu_layers = 0 if backend == "cpu" else -1
    launch = EngineLaunch(
        model=model,
        port=free_port(),
        api_key=secrets.token_urlsafe(24),
        n_ctx=n_ctx,
        n_gpu_layers=gpu_layers,
        chat_template=template,
    )
    if template is not None:
        template_text = json.loads(template.read_text(encoding="utf-8")).get("chat_template")
    else:
        template_text = gguf_chat_template(metadata)
    text = template_text if isinstance(template_text, str) else None
    return ServePlan(launch, backend, warnings, text, _parallel_launches(launch, settings.engine_parallel))


def _parallel_launches(first: EngineLaunch, count: int) -> tuple[EngineLaunch, ...]:
    """``count`` engines like ``first``, each on a port and with a key of its own; () for one engine."""
    if count <= 1:
        return ()
    launches = [first]
    ports = {first.port}
    while len(launches) < count:
        port = free_port()
        if port not in ports:
            ports.add(port)
            launches.append(dataclasses.replace(first, port=port, api_key=secrets.token_urlsafe(24)))
    return tuple(launches)


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
    parallel = (
        [
            f"  engines:        {len(plan.parallel)} side by side (--parallel), each with the model and its own "
            f"n_ctx {launch.n_ctx} context: {len(plan.parallel)} x one engine's memory"
        ]
        if plan.parallel
        else []
    )
    return "\n".join(
        [
            f"toolpair {__version__} serving {plan.model_name} with llama-cpp-python {LLAMA_CPP_VERSION}",
            f"  engine:         {plan.backend} build, n_ctx {launch.n_ctx}, gpu layers {launch.n_gpu_layers}, "
            f"chat template {template}",
            *parallel,
            f"  listening on:   {base}{where}   health: {base}/health   ready: {base}/ready",
            f'  OpenAI SDK:     OpenAI(base_url="{base}/v1", api_key="any")',
            f'  Anthropic SDK:  Anthropic(base_url="{base}", api_key="any")',
            f"  Claude Code:    ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=any claude",
        ]
    )


def _engine_status(name: str, engine: EngineSupervisor, pool: EnginePool) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": name,
        "state": engine.state.value,
        "restarts": engine.restarts,
        "active": pool.schedule.active_on(name),
        "served": pool.schedule.served_by(name),
    }
    if engine.reason:
        status["reason"] = engine.reason.splitlines()[0]
    return status


def _readings(engines: dict[str, EngineSupervisor], plan: ServePlan, pool: EnginePool) -> tuple[EngineReading, ...]:
    return tuple(
        EngineReading(
            name,
            engine.state.value,
            engine.restarts,
            pool.schedule.active_on(name),
            pool.schedule.served_by(name),
            launch.port,
        )
        for (name, engine), launch in zip(engines.items(), plan.launches, strict=True)
    )


async def _engines_ctx(app: web.Application) -> AsyncIterator[None]:
    engines = app[SUPERVISORS].values()
    for engine in engines:
        await engine.start()
    yield
    await asyncio.gather(*(engine.shutdown() for engine in engines))


def _engine_ready(name: str, engine: EngineSupervisor) -> Callable[[], Awaitable[None]]:
    async def ready() -> None:
        try:
            await engine.ensure_ready()
        except EngineUnavailable as exc:
            raise EngineUnavailableError(f"{name} is not available: {str(exc).splitlines()[0]}") from None

    return ready


def build_serve_app(
    settings: Settings, plan: ServePlan, *, on_give_up: Callable[[str], None] | None = None
) -> web.Application:
    """The proxy app with the managed engines as its upstream and a pool over them as admission.

    Each engine has its own supervisor, so each is watched and restarted on its
    own; ``on_give_up`` is called once every engine has given up.
    """
    policy = RestartPolicy(
        start_timeout=settings.engine_start_timeout,
        stop_timeout=settings.engine_stop_timeout,
        max_restarts=settings.engine_max_restarts,
    )
    engines: dict[str, EngineSupervisor] = {}

    def engine_gave_up(reason: str) -> None:
        if on_give_up is not None and all(e.state is EngineState.FAILED for e in engines.values()):
            on_give_up(reason)

    members = []
    for index, launch in enumerate(plan.launches):
        name = f"engine-{index}"
        spec = ChildSpec(engine_command(launch), launch.url + READY_PATH, engine_env(launch, os.environ))
        engine = EngineSupervisor(spec, policy, on_give_up=engine_gave_up, quote_requests=settings.log_bodies)
        engines[name] = engine
        # One engine is the app's own upstream; several are each a target of their own.
        target = EngineTarget(name, launch.url, launch.api_key) if plan.parallel else None
        members.append(PoolEngine(name, target, _engine_ready(name if plan.parallel else "the engine", engine)))
    pool = EnginePool(
        members,
        max_concurrency=settings.max_concurrency,
        max_queue=settings.max_queue,
        ready_timeout=settings.engine_ready_wait,
    )
    for name, engine in engines.items():
        pool.set_up(name, False)  # each is up once its supervisor says it is ready
        engine.add_listener(_follow(pool, name))
    upstream = Upstream(
        plan.launch.url,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.upstream_read_timeout,
        api_key=plan.launch.api_key,
    )
    # The managed engine is llama-cpp-python: adapt requests to it and extract its tool calls.
    settings = managed_settings(settings, plan)
    app = create_app(settings, upstream, admission=pool)
    app[SUPERVISORS] = engines
    app[QUEUE] = pool

    def snapshot() -> EngineSnapshot:
        readings = _readings(engines, plan, pool)
        return EngineSnapshot(
            state=overall_state(tuple(r.state for r in readings)),
            restarts=sum(r.restarts for r in readings),
            backend=plan.backend,
            model=plan.model_name,
            queue_depth=pool.waiting,
            engines=readings,
        )

    app[ENGINE_PROBE] = snapshot

    async def engine_is_ready() -> tuple[bool, dict[str, Any]]:
        # Ready while some engine can serve; the states are read for health output only.
        each = [_engine_status(name, engine, pool) for name, engine in engines.items()]
        ready = any(engine.state is EngineState.READY for engine in engines.values())
        queue = {"active": pool.active, "waiting": pool.waiting, "max_queue": pool.max_queue}
        overall = {
            "state": overall_state(tuple(e["state"] for e in each)),
            "restarts": sum(e["restarts"] for e in each),
            "queue": queue,
            "engines": each,
        }
        reasons = [e["reason"] for e in each if "reason" in e]
        if reasons:
            overall["reason"] = reasons[0]
        return ready, {"engine": overall}

    app[READINESS] = engine_is_ready
    app.cleanup_ctx.append(_engines_ctx)
    return app


def _follow(pool: EnginePool, name: str) -> Callable[[EngineState, EngineState], None]:
    """A supervisor listener that tells the pool when engine ``name`` can take requests."""

    def changed(old: EngineState, new: EngineState) -> None:
        pool.set_up(name, new is EngineState.READY, alive=new not in (EngineState.FAILED, EngineState.SHUTDOWN))
        if len(pool.engines) > 1:
            log.info("%s: %s", name, new.value)

    return changed


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
