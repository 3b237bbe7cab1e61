"""``toolpair serve``: the managed llama-cpp-python engine and the proxy, in one process.

Before anything starts, :func:`~proxy.serve_plan.plan_serve` settles every decision (model,
context size, chat template, GPU offload, engine port and key) and refuses a
bad setting with a clear message. :func:`build_serve_app` wires the engine in as
the upstream: with ``engine_parallel`` N, N engine processes of the same model,
each on its own loopback port and key and each with its own supervisor, whose
lifetimes are tied to the app's ``cleanup_ctx``. An
:class:`~proxy.engine.queueing.EnginePool` over them is the app's admission: it
sends each request to a free engine, preferring the one that last served the
same conversation.
:func:`run_serve` listens, prints how to connect, and on SIGTERM or SIGINT
stops accepting, gives requests in flight ``shutdown_grace`` seconds, then stops
the engine.

What the engines are doing is read in one place, :func:`engine_snapshot`: ``/toolpair/status``
and ``/metrics`` show it whole, and ``/ready`` (:mod:`proxy.http.probes`) answers 200 while some
engine in it is ready, with each engine's state and restarts, and the queue, in the body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TextIO

from aiohttp import web

from engine_launcher.supervise.launch import READY_PATH, EngineLaunch, engine_command, engine_env
from engine_launcher.supervise.process import (
    ChildSpec,
    EngineState,
    EngineSupervisor,
    EngineUnavailable,
    RestartPolicy,
    Warmup,
)
from proxy.app import create_app
from proxy.banner import serve_banner
from proxy.config import ConfigError, Settings, listen_hosts
from proxy.engine.plan import engine_setup, follow_template
from proxy.engine.queueing import EnginePool, PoolEngine
from proxy.engine.upstream import EngineTarget, Upstream
from proxy.errors import EngineUnavailableError
from proxy.http.probes import READINESS
from proxy.ops.engine_probe import ENGINE_PROBE, EngineReading, EngineSnapshot, overall_state
from proxy.serve_plan import ServePlan

__all__ = [
    "QUEUE",
    "SUPERVISORS",
    "build_serve_app",
    "check_engine",
    "engine_child",
    "engine_snapshot",
    "managed_settings",
    "run_serve",
]

log = logging.getLogger("toolpair")

SUPERVISORS = web.AppKey("supervisors", dict[str, EngineSupervisor])
"""Each engine's supervisor by engine name (engine-0, engine-1, ...)."""
QUEUE = web.AppKey("queue", EnginePool)


def managed_settings(settings: Settings, plan: ServePlan) -> Settings:
    """Settings that follow from the engine serve runs: its kind, its template's tool-call format.

    Only ``auto`` or unset values are filled in; explicit settings win.
    """
    changes: dict[str, object] = {"engine_kind": "llama-cpp-python", "engine_logprobs": plan.launch.logits_all}
    if settings.count_tokens_template is None and plan.launch.chat_template is not None:
        # count_tokens renders with the very template the engine uses, so its count is exact.
        changes["count_tokens_template"] = str(plan.launch.chat_template)
    return follow_template(dataclasses.replace(settings, **changes), plan.template_text or "")  # type: ignore[arg-type]


WARMUP_PATH = "/v1/completions"
WARMUP_BODY = b'{"prompt": "Hello", "max_tokens": 4, "temperature": 0}'
"""A few tokens through the engine's plainest generation path: enough that every kind of matrix
multiply the model needs has run once, before the engine counts as ready."""


def engine_child(launch: EngineLaunch) -> ChildSpec:
    """How one managed engine is started, told apart from loaded, and proved able to generate."""
    warmup = Warmup(
        launch.url + WARMUP_PATH,
        WARMUP_BODY,
        {"Authorization": f"Bearer {launch.api_key}", "Content-Type": "application/json"},
    )
    return ChildSpec(engine_command(launch), launch.url + READY_PATH, engine_env(launch, os.environ), warmup)


def engine_snapshot(engines: dict[str, EngineSupervisor], plan: ServePlan, pool: EnginePool) -> EngineSnapshot:
    """What the engines are doing now: the one status view ``/toolpair/status``, ``/metrics`` and ``/ready`` show."""
    readings = tuple(
        EngineReading(
            name,
            engine.state.value,
            engine.restarts,
            pool.schedule.active_on(name),
            pool.schedule.served_by(name),
            launch.port,
            engine.reason.splitlines()[0] if engine.reason else None,
        )
        for (name, engine), launch in zip(engines.items(), plan.launches, strict=True)
    )
    return EngineSnapshot(
        state=overall_state(tuple(r.state for r in readings)),
        restarts=sum(r.restarts for r in readings),
        backend=plan.backend,
        model=plan.model_name,
        queue_depth=pool.waiting,
        engines=readings,
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
        engine = EngineSupervisor(
            engine_child(launch), policy, on_give_up=engine_gave_up, quote_requests=settings.log_bodies
        )
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
    # The managed engine is llama-cpp-python: adapt requests to it and extract its tool calls.
    settings = managed_settings(settings, plan)

    async def explain_failure(name: str | None, sent_at: float) -> str | None:
        engine = engines.get(name or "engine-0")
        return None if engine is None else await engine.crash_since(sent_at)

    upstream = Upstream(
        plan.launch.url,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.upstream_read_timeout,
        api_key=plan.launch.api_key,
        reuses_connections=engine_setup(settings).profile.reuses_connections,
        explain_failure=explain_failure,
    )
    app = create_app(settings, upstream, admission=pool, engine_metrics=False)
    app[SUPERVISORS] = engines
    app[QUEUE] = pool

    def snapshot() -> EngineSnapshot:
        return engine_snapshot(engines, plan, pool)

    app[ENGINE_PROBE] = snapshot

    async def engine_is_ready() -> tuple[bool, dict[str, Any]]:
        # Ready while some engine can serve; the rest of the snapshot is for the body only.
        now = snapshot()
        overall: dict[str, Any] = {
            "state": now.state,
            "restarts": now.restarts,
            "queue": {"active": pool.active, "waiting": pool.waiting, "max_queue": pool.max_queue},
            "engines": [reading.shown() for reading in now.engines],
        }
        reasons = [reading.reason for reading in now.engines if reading.reason is not None]
        if reasons:
            overall["reason"] = reasons[0]
        return any(reading.state == EngineState.READY.value for reading in now.engines), {"engine": overall}

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


async def _announce_ready(engines: dict[str, EngineSupervisor], out: TextIO) -> None:
    """Say so once every engine has generated its warm-up tokens; a failed start is said by the give-up."""
    try:
        await asyncio.gather(*(engine.ensure_ready() for engine in engines.values()))
    except EngineUnavailable:
        return
    warmup = max((engine.warmup_seconds or 0.0) for engine in engines.values())
    print(f"  ready:          the engine generated its first tokens (warm-up {warmup:.1f}s)", file=out, flush=True)


async def check_engine(settings: Settings, plan: ServePlan, *, out: TextIO = sys.stdout) -> int:
    """``serve --check``: start the first engine as serve would, warm it up, say how it went; 0 when it generated.

    The quick answer to "does the engine run on this machine": ``make test``
    asks it before the suite, so a build that cannot compute here fails in
    one line that names the cause instead of in every test that talks to it.
    """
    policy = RestartPolicy(start_timeout=settings.engine_start_timeout, stop_timeout=settings.engine_stop_timeout)
    engine = EngineSupervisor(engine_child(plan.launch), policy, quote_requests=settings.log_bodies)
    started = time.monotonic()
    try:
        await engine.ensure_ready()
    except EngineUnavailable as exc:
        print(f"toolpair serve --check: FAILED: {exc}", file=out, flush=True)
        return 1
    finally:
        await engine.shutdown()
    print(
        f"toolpair serve --check: ok: the {plan.backend} engine loaded {plan.model_name} and generated "
        f"(ready in {time.monotonic() - started:.1f}s, of which warm-up {engine.warmup_seconds or 0.0:.1f}s)",
        file=out,
        flush=True,
    )
    return 0


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
    try:
        for host in listen_hosts(settings.host):
            await web.TCPSite(runner, host, settings.port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    print(serve_banner(settings, plan), file=out, flush=True)
    announcing = asyncio.create_task(_announce_ready(app[SUPERVISORS], out))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)  # a second signal now ends toolpair at once
        announcing.cancel()
    log.info(
        "shutting down: no new connections; requests in flight get %gs, then the engine stops",
        settings.shutdown_grace,
    )
    await runner.cleanup()
    log.info("toolpair stopped")
    return exit_code
