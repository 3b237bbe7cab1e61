"""``toolpair serve``: the managed llama-cpp-python engine and the proxy, in one process.

Before anything starts, :func:`plan_serve` settles every decision (model,
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

``/ready`` (:mod:`proxy.http.probes`) answers 200 while some engine is ready, with
each engine's state and restarts, and the queue, in the body.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import importlib.util
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from engine_launcher.builder.backends import EngineDevices, parse_backend
from engine_launcher.builder.gguf import GGUFError, context_length, read_metadata
from engine_launcher.builder.gguf import chat_template as gguf_chat_template
from engine_launcher.builder.machine import this_machine
from engine_launcher.builder.models import ModelError, bundled_model, choose_template, readable_model
from engine_launcher.builder.plan import EngineSettings, plan_engine
from engine_launcher.builder.record import read_record
from engine_launcher.builder.template_file import template_file_parts
from engine_launcher.builder.version import LLAMA_CPP_VERSION
from engine_launcher.inside.rpc import parse_endpoints
from engine_launcher.supervise.launch import (
    CACHE_TYPES,
    READY_PATH,
    SPLIT_MODES,
    EngineLaunch,
    engine_command,
    engine_env,
    free_port,
    installed_setting_names,
)
from engine_launcher.supervise.memory import MemoryEstimate, ModelShape, estimate_memory, fitting_context, gib
from engine_launcher.supervise.process import (
    ChildSpec,
    EngineState,
    EngineSupervisor,
    EngineUnavailable,
    RestartPolicy,
    Warmup,
)
from proxy import __version__
from proxy.app import create_app
from proxy.config import ConfigError, Settings
from proxy.engine.plan import engine_setup, follow_template
from proxy.engine.queueing import EnginePool, PoolEngine
from proxy.engine.upstream import EngineTarget, Upstream
from proxy.errors import EngineUnavailableError
from proxy.http.probes import READINESS
from proxy.ops.engine_probe import ENGINE_PROBE, EngineReading, EngineSnapshot, overall_state

__all__ = [
    "QUEUE",
    "SUPERVISORS",
    "ServePlan",
    "banner",
    "build_serve_app",
    "check_engine",
    "device_line",
    "engine_child",
    "plan_serve",
    "run_serve",
]

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
    memory: MemoryEstimate | None = None
    """What the engine is expected to need at the chosen n_ctx (None: the header did not say enough)."""
    memory_budget: int | None = None
    """The memory it was checked against (None: unknown)."""
    logprobs_cost: int | None = None
    """Bytes that serving logprobs costs (or would cost) at this n_ctx."""
    parallel: tuple[EngineLaunch, ...] = ()
    """With engine_parallel N > 1: the N engines, each with its own port and key (``launch`` is the first)."""
    devices: EngineDevices | None = None
    """The GPU build's devices here (None: a CPU build, or not looked at)."""
    n_layer: int | None = None
    """The model's repeating layers (from its header), for what the banner says is offloaded."""

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


# --engine-arg keys toolpair sets itself, and keys with a flag of their own.
_OWNED_ARGS = frozenset({"model", "host", "port", "api_key", "interrupt_requests", "config_file", "models"})
_FLAG_FOR_ARG = {
    "n_ctx": "-c/--ctx-size",
    "n_gpu_layers": "-ngl/--n-gpu-layers",
    "n_threads": "-t/--threads",
    "n_threads_batch": "-tb/--threads-batch",
    "n_batch": "-b/--batch-size",
    "n_ubatch": "-ub/--ubatch-size",
    "flash_attn": "-fa/--flash-attn",
    "type_k": "--cache-type-k",
    "type_v": "--cache-type-v",
    "chat_format": "--chat-template-file",
    "hf_tokenizer_config_path": "--chat-template-file",
    "use_mlock": "--mlock",
    "use_mmap": "--no-mmap",
    "main_gpu": "--main-gpu",
    "split_mode": "--split-mode",
    "tensor_split": "--tensor-split",
    "cache": "--prompt-cache-size",
    "cache_type": "--prompt-cache-size",
    "cache_size": "--prompt-cache-size",
    "logits_all": "--logprobs",
}


def engine_args(entries: list[str], accepted: frozenset[str]) -> dict[str, str]:
    """``--engine-arg KEY=VALUE`` entries as server settings, each key checked against the installed engine.

    >>> engine_args(["rope_freq_base=10000"], frozenset({"rope_freq_base"}))
    {'rope_freq_base': '10000'}
    """
    found: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"engine argument {entry!r} is not KEY=VALUE")
        if key in _OWNED_ARGS:
            raise ConfigError(f"engine argument {key!r}: toolpair sets it itself")
        if key in _FLAG_FOR_ARG:
            raise ConfigError(f"engine argument {key!r}: use {_FLAG_FOR_ARG[key]} instead")
        if key not in accepted:
            near = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"engine argument {key!r} is not a setting the installed llama-cpp-python accepts{hint}")
        found[key] = value
    return found


def _check_tuning(settings: Settings) -> None:
    for name, least in (
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
    ):
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


def _memory_plan(
    settings: Settings,
    shape: ModelShape | None,
    model: Path,
    trained: int | None,
    ram: int | None,
    vram: int | None,
) -> tuple[int, MemoryEstimate | None, int | None, list[str]]:
    """n_ctx, its memory estimate, the budget it was checked against, and what start-up should say about it."""
    wanted = settings.engine_ctx_size or trained or _FALLBACK_CTX
    if shape is None:
        return wanted, None, None, []
    bytes_k = CACHE_TYPES[settings.engine_cache_type_k or "f16"][1]
    bytes_v = CACHE_TYPES[settings.engine_cache_type_v or "f16"][1]
    model_bytes = model.stat().st_size

    def estimate(n_ctx: int) -> MemoryEstimate:
        return estimate_memory(
            shape,
            model_bytes,
            n_ctx,
            logits_all=bool(settings.engine_logprobs),
            n_batch=settings.engine_batch_size or 512,
            n_ubatch=settings.engine_ubatch_size or 512,
            bytes_k=bytes_k,
            bytes_v=bytes_v,
            flash_attn=bool(settings.engine_flash_attn),
            prompt_cache_bytes=settings.prompt_cache_size,
        )

    # A GPU build with every layer offloaded holds weights, KV cache and compute buffers in GPU
    # memory (``vram``, the engine plan's); what llama-cpp-python keeps in Python (scores, prompt cache) stays in RAM.

    engines = settings.engine_parallel  # --parallel N: N engines, each needing all of it

    def fits(n_ctx: int) -> bool:
        need = estimate(n_ctx)
        if vram is None:
            return ram is None or engines * need.total <= ram
        on_gpu = need.weights + need.kv_cache + need.compute
        return engines * on_gpu <= vram and (ram is None or engines * (need.scores + need.prompt_cache) <= ram)

    budget = ram if vram is None else vram
    if budget is None:
        return wanted, estimate(wanted), None, []
    where = "available" if vram is None else "of GPU memory free"
    chosen = fitting_context(wanted, fits)
    notes: list[str] = []
    if chosen is None:
        notes.append(
            f"the engine needs {_times(engines)}{estimate(256).describe()} even at n_ctx 256 and this machine has "
            f"{gib(budget)} {where}; it may not start"
        )
        chosen = min(wanted, 256)
    elif chosen < wanted:
        source = "--ctx-size" if settings.engine_ctx_size else "the model's training context"
        notes.append(
            f"n_ctx {chosen}, not {wanted} ({source}): the engine would need "
            f"{_times(engines)}{gib(estimate(wanted).total)} "
            f"and this machine has {gib(budget)} {where}"
        )
    return chosen, estimate(chosen), budget, notes


_FALLBACK_CTX = 4096
"""n_ctx for a model whose header does not give its training context."""


def _times(engines: int) -> str:
    return f"{engines} x " if engines > 1 else ""


def plan_serve(settings: Settings, *, out: TextIO = sys.stderr, check_machine: bool = True) -> ServePlan:
    """Resolve model, template, context, memory, offload and engine settings; raise ConfigError on anything unusable."""
    warnings: list[str] = []
    _check_tuning(settings)
    try:
        if settings.model:
            model = readable_model(Path(settings.model).expanduser())
        else:
            model = bundled_model(progress=_progress(out))
        metadata = read_metadata(model)
        template = choose_template(settings.chat_template, metadata)
        parse_backend(settings.engine_backend)  # an unknown name stops here, in one line
    except (ModelError, GGUFError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError("llama-cpp-python is not installed here: run `toolpair engine install`")
    extra = engine_args(settings.engine_args, installed_setting_names())
    try:
        rpc_servers = parse_endpoints(settings.engine_rpc)
    except ValueError as exc:
        raise ConfigError(f"engine_rpc: {exc}") from None
    machine = this_machine()
    engine = plan_engine(
        EngineSettings(
            settings.engine_backend, settings.engine_amx, rpc_servers, settings.engine_gpu_layers, check_machine
        ),
        machine,
        read_record(),
        os.environ,
    )
    if engine.refusal is not None:
        raise ConfigError(engine.refusal)
    warnings += engine.warnings
    backend, devices, gpu_layers = engine.backend, engine.devices, engine.gpu_layers
    trained = context_length(metadata)
    shape = ModelShape.from_metadata(metadata)
    n_ctx, memory, budget, notes = _memory_plan(
        settings, shape, model, trained, machine.memory_available, engine.gpu_memory
    )
    warnings += notes
    if settings.engine_ctx_size and trained and settings.engine_ctx_size > trained:
        warnings.append(f"--ctx-size {settings.engine_ctx_size} is beyond the model's training context ({trained})")
    launch = EngineLaunch(
        model=model,
        port=free_port(),
        api_key=secrets.token_urlsafe(24),
        n_ctx=n_ctx,
        n_gpu_layers=gpu_layers,
        chat_template=template,
        rpc_servers=rpc_servers,
        logits_all=bool(settings.engine_logprobs),
        prompt_cache_bytes=settings.prompt_cache_size,
        # Engines that work at once share the cores: each gets its share unless told otherwise.
        n_threads=settings.engine_threads or max(1, machine.physical_cores // settings.engine_parallel),
        n_threads_batch=settings.engine_threads_batch or max(1, machine.usable_cores // settings.engine_parallel),
        n_batch=settings.engine_batch_size,
        n_ubatch=settings.engine_ubatch_size,
        flash_attn=settings.engine_flash_attn,
        cache_type_k=settings.engine_cache_type_k,
        cache_type_v=settings.engine_cache_type_v,
        use_mlock=True if settings.engine_mlock else None,
        use_mmap=None if settings.engine_mmap else False,
        main_gpu=settings.engine_main_gpu,
        split_mode=settings.engine_split_mode,
        tensor_split=tuple(settings.engine_tensor_split),
        extra=extra,
        env=engine.env,
        amx=engine.amx_weights,
    )
    template_text: str | None
    if template is not None:
        # The engine reads the file through template_file_parts (a list of named templates gives
        # its tool_use one), so the format is detected from the very template the engine renders.
        template_text = template_file_parts(json.loads(template.read_text(encoding="utf-8")))[0]
    else:
        template_text = gguf_chat_template(metadata)
    logprobs_cost = None
    if shape is not None:
        logprobs_cost = n_ctx * shape.n_vocab * 4
    return ServePlan(
        launch,
        backend,
        warnings,
        template_text,
        memory=memory,
        memory_budget=budget,
        logprobs_cost=logprobs_cost,
        parallel=_parallel_launches(launch, settings.engine_parallel),
        devices=devices,
        n_layer=shape.n_layer if shape is not None else None,
    )


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
    changes: dict[str, object] = {"engine_kind": "llama-cpp-python", "engine_logprobs": plan.launch.logits_all}
    if settings.count_tokens_template is None and plan.launch.chat_template is not None:
        # count_tokens renders with the very template the engine uses, so its count is exact.
        changes["count_tokens_template"] = str(plan.launch.chat_template)
    return follow_template(dataclasses.replace(settings, **changes), plan.template_text or "")  # type: ignore[arg-type]


def _local(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else (f"[{host}]" if ":" in host else host)


def device_line(plan: ServePlan) -> str | None:
    """The banner's line about the GPU: which device, how many layers go to it, and their memory by the estimate.

    >>> from pathlib import Path
    >>> plan = ServePlan(EngineLaunch(Path("m"), 1, "k", 4096, n_gpu_layers=-1), "vulkan",
    ...                  devices=EngineDevices(("llvmpipe",), note="software"), n_layer=18,
    ...                  memory=MemoryEstimate(240 * 2**20, 100 * 2**20, 0, 60 * 2**20, 0))
    >>> print(device_line(plan))
      device:         llvmpipe (software): all 18 layers and the output (-ngl -1), ~400 MiB there by the estimate
    """
    if plan.devices is None or not plan.devices.names:
        return None
    names = ", ".join(plan.devices.names) + (f" ({plan.devices.note})" if plan.devices.note else "")
    layers, n_layer = plan.launch.n_gpu_layers, plan.n_layer
    if layers == 0:
        return f"  device:         {names}: no layers on it (-ngl 0)"
    if n_layer is None:
        return f"  device:         {names}: {'all' if layers < 0 else layers} layers (-ngl {layers})"
    share = 1.0 if layers < 0 or layers > n_layer else layers / (n_layer + 1)
    shown = f"all {n_layer} layers and the output" if share == 1.0 else f"{layers} of {n_layer + 1} layers"
    line = f"  device:         {names}: {shown} (-ngl {layers})"
    if plan.memory is not None:
        on_device = (plan.memory.weights + plan.memory.kv_cache) * share + plan.memory.compute
        line += f", ~{gib(on_device)} there by the estimate"
    return line


def banner(settings: Settings, plan: ServePlan) -> str:
    """How to connect, printed at start-up.

    >>> from pathlib import Path
    >>> plan = ServePlan(EngineLaunch(Path("m.gguf"), 1, "k", 4096), "cpu")
    >>> print(banner(Settings(port=8787), plan).splitlines()[-3])
      OpenAI SDK:     OpenAI(base_url="http://127.0.0.1:8787/v1", api_key="any")
    """
    base = f"http://{_local(settings.host)}:{settings.port}"
    launch = plan.launch
    template = launch.chat_template.name if launch.chat_template else "the model's own"
    where = " (all interfaces)" if settings.host in ("0.0.0.0", "", "::") else ""
    threads = f"threads {launch.n_threads}/{launch.n_threads_batch}" if launch.n_threads else "threads: engine default"
    lines = [
        f"toolpair {__version__} serving {plan.model_name} with llama-cpp-python {LLAMA_CPP_VERSION}",
        f"  engine:         {plan.backend} build, n_ctx {launch.n_ctx}, gpu layers {launch.n_gpu_layers}, "
        f"{threads}, chat template {template}"
        + (f", RPC workers {','.join(launch.rpc_servers)}" if launch.rpc_servers else ""),
    ]
    device = device_line(plan)
    if device is not None:
        lines.append(device)
    engines = len(plan.launches)
    if plan.memory is not None:
        budget = f" of {gib(plan.memory_budget)} available" if plan.memory_budget is not None else ""
        if engines > 1:  # each engine holds the model and its own context
            each = f"{engines} engines x {plan.memory.describe()} = ~{gib(engines * plan.memory.total)}"
            lines.append(f"  memory:         {each}{budget}")
        else:
            lines.append(f"  memory:         {plan.memory.describe()}{budget}")
    cost = f" ({gib(plan.logprobs_cost)} at this n_ctx)" if plan.logprobs_cost is not None else ""
    if launch.logits_all:
        lines.append(f"  logprobs:       served; their logits cost{cost or ' n_ctx x vocabulary x 4 bytes'}")
    else:
        lines.append(f"  logprobs:       off (requests for them get 400); --logprobs serves them{cost}")
    cache = gib(launch.prompt_cache_bytes) if launch.prompt_cache_bytes else "off"
    lines += [
        f"  prompt cache:   {cache}{' each' if engines > 1 else ''}   engines: {engines}"
        + (" (--parallel: a conversation returns to the engine that served it)" if engines > 1 else ""),
        f"  listening on:   {base}{where}   health: {base}/health   ready: {base}/ready",
        f'  OpenAI SDK:     OpenAI(base_url="{base}/v1", api_key="any")',
        f'  Anthropic SDK:  Anthropic(base_url="{base}", api_key="any")',
        f"  Claude Code:    ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=any claude",
    ]
    return "\n".join(lines)


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
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    print(banner(settings, plan), file=out, flush=True)
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
