"""What ``toolpair proxy`` and ``toolpair serve`` say at start-up: one builder, two sets of facts.

Each command's banner is its headline and its facts (:func:`proxy_banner`, :func:`serve_banner`);
:func:`banner` puts them together and ends both with the same lines on how to connect, so a client
line is written once and both commands say it alike.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_launcher.builder.version import LLAMA_CPP_VERSION
from engine_launcher.supervise.memory import gib
from proxy import __version__
from proxy.config import Settings, listen_hosts
from proxy.engine.detect import Detection, engine_lines
from proxy.engine.kinds import EngineKind
from proxy.engine.model_names import model_line, parse_model_map
from proxy.engine.plan import engine_setup
from proxy.ops.auth import keys_required
from proxy.ops.paths import TOOLPAIR_METRICS_PATH
from proxy.ops.status import public_url
from proxy.serve_plan import ServePlan

__all__ = ["banner", "device_line", "listening_url", "proxy_banner", "serve_banner"]

_EVERY_INTERFACE = ("0.0.0.0", "", "::")


def listening_url(settings: Settings) -> str:
    """The URL a client on this machine reaches toolpair at: loopback for an every-interface address, the first
    of several.

    >>> listening_url(Settings(host="0.0.0.0", port=8787)), listening_url(Settings(host="::1,127.0.0.1", port=9))
    ('http://127.0.0.1:8787', 'http://[::1]:9')
    """
    host = listen_hosts(settings.host)[0]
    local = "127.0.0.1" if host in _EVERY_INTERFACE else (f"[{host}]" if ":" in host else host)
    return f"http://{local}:{settings.port}"


def banner(headline: str, facts: Iterable[str], base: str) -> str:
    """A start-up banner: the headline, the command's facts, then how each client connects to ``base``.

    >>> print(banner("toolpair", ["  engine:         e"], "http://h:1"))
    toolpair
      engine:         e
      OpenAI SDK:     OpenAI(base_url="http://h:1/v1", api_key="any")
      Anthropic SDK:  Anthropic(base_url="http://h:1", api_key="any")
      Claude Code:    ANTHROPIC_BASE_URL=http://h:1 ANTHROPIC_API_KEY=any claude
    """
    lines = [
        headline,
        *facts,
        f'  OpenAI SDK:     OpenAI(base_url="{base}/v1", api_key="any")',
        f'  Anthropic SDK:  Anthropic(base_url="{base}", api_key="any")',
        f"  Claude Code:    ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=any claude",
    ]
    return "\n".join(lines)


def proxy_banner(settings: Settings, found: Detection | None) -> str:
    """What ``toolpair proxy`` says at start-up: the engine (when named) and what each path does.

    A detected engine is not known yet when this is said: the log says what was found, and when.

    >>> from proxy.engine.detect import detect_engine, ProbeAnswer
    >>> found = detect_engine([ProbeAnswer("/health", 200, {"server": "llama.cpp"})])
    >>> settings = Settings(upstream="http://127.0.0.1:8080", engine_kind=found.kind)
    >>> print(proxy_banner(settings, found).splitlines()[1])
      engine:         llama-server (detected: /health answered with "Server: llama.cpp")
    """
    base = listening_url(settings)
    upstream = public_url(settings.upstream or "")
    credentials = (
        "toolpair checks its own keys; the engine gets upstream_api_key"
        if keys_required(settings) and settings.upstream_api_key
        else "toolpair checks its own keys; none reach the engine"
        if keys_required(settings)
        else "the client's own (Authorization, x-api-key) reach the engine, which checks them"
    )
    facts = [
        *engine_lines(settings, found),
        *_tool_call_lines(settings),
        model_line(parse_model_map(settings.model_map), None),
        f"  /metrics:       the engine's own, toolpair's families appended; toolpair's alone: {TOOLPAIR_METRICS_PATH}",
        f"  credentials:    {credentials}",
        "  override:       --engine-kind, --messages-mode, --responses-mode, --model-map",
    ]
    return banner(f"toolpair {__version__} in front of {upstream}, listening on {base}", facts, base)


def _tool_call_lines(settings: Settings) -> list[str]:
    """The banner's line on how tool calls are read out of the engine's text, where they are."""
    if settings.engine_kind is EngineKind.AUTO:
        return []  # not known until the engine is found: the log says then
    if engine_setup(settings).profile.parses_tool_calls or settings.tool_call_format == "none":
        return []
    source = f"from {settings.chat_template}" if settings.chat_template else "no --chat-template-file"
    think = "; the prompt opens <think>" if settings.think_in_prompt else ""
    return [f"  tool calls:     {settings.tool_call_format} ({source}){think}"]


def device_line(plan: ServePlan) -> str | None:
    """The banner's line about the GPU: which device, how many layers go to it, and their memory by the estimate.

    >>> from pathlib import Path
    >>> from engine_launcher.builder.backends import EngineDevices
    >>> from engine_launcher.supervise.launch import EngineLaunch
    >>> from engine_launcher.supervise.memory import MemoryEstimate
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


def serve_banner(settings: Settings, plan: ServePlan) -> str:
    """What ``toolpair serve`` says once it listens: the engine it runs, its memory, and how to connect.

    >>> from pathlib import Path
    >>> from engine_launcher.supervise.launch import EngineLaunch
    >>> plan = ServePlan(EngineLaunch(Path("m.gguf"), 1, "k", 4096), "cpu")
    >>> print(serve_banner(Settings(port=8787), plan).splitlines()[-3])
      OpenAI SDK:     OpenAI(base_url="http://127.0.0.1:8787/v1", api_key="any")
    """
    base = listening_url(settings)
    launch = plan.launch
    template = launch.chat_template.name if launch.chat_template else "the model's own"
    where = " (all interfaces)" if any(host in _EVERY_INTERFACE for host in listen_hosts(settings.host)) else ""
    threads = f"threads {launch.n_threads}/{launch.n_threads_batch}" if launch.n_threads else "threads: engine default"
    facts = [
        f"  engine:         {plan.backend} build, n_ctx {launch.n_ctx}, gpu layers {launch.n_gpu_layers}, "
        f"{threads}, chat template {template}"
        + (f", RPC workers {','.join(launch.rpc_servers)}" if launch.rpc_servers else ""),
    ]
    device = device_line(plan)
    if device is not None:
        facts.append(device)
    engines = len(plan.launches)
    if plan.memory is not None:
        budget = f" of {gib(plan.memory_budget)} available" if plan.memory_budget is not None else ""
        if engines > 1:  # each engine holds the model and its own context
            each = f"{engines} engines x {plan.memory.describe()} = ~{gib(engines * plan.memory.total)}"
            facts.append(f"  memory:         {each}{budget}")
        else:
            facts.append(f"  memory:         {plan.memory.describe()}{budget}")
    cost = f" ({gib(plan.logprobs_cost)} at this n_ctx)" if plan.logprobs_cost is not None else ""
    if launch.logits_all:
        facts.append(f"  logprobs:       served; their logits cost{cost or ' n_ctx x vocabulary x 4 bytes'}")
    else:
        facts.append(f"  logprobs:       off (requests for them get 400); --logprobs serves them{cost}")
    cache = gib(launch.prompt_cache_bytes) if launch.prompt_cache_bytes else "off"
    facts += [
        f"  prompt cache:   {cache}{' each' if engines > 1 else ''}   engines: {engines}"
        + (" (--parallel: a conversation returns to the engine that served it)" if engines > 1 else ""),
        f"  listening on:   {base}{where}   health: {base}/health   ready: {base}/ready",
    ]
    headline = f"toolpair {__version__} serving {plan.model_name} with llama-cpp-python {LLAMA_CPP_VERSION}"
    return banner(headline, facts, base)
