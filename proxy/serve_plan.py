"""Every decision ``toolpair serve`` makes before it starts anything: :func:`plan_serve`.

Model, chat template, engine settings, whether the installed engine fits this machine, context
size and memory (:mod:`proxy.serve_memory`), GPU offload, and each engine's port and key are settled
here into one :class:`ServePlan`; a setting that cannot work is refused with a
:class:`~proxy.config.ConfigError` in one line. Nothing is started: :mod:`proxy.serve` runs the plan.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from engine_launcher.builder.backends import EngineDevices, parse_backend
from engine_launcher.builder.gguf import GGUFError, context_length
from engine_launcher.builder.gguf import chat_template as gguf_chat_template
from engine_launcher.builder.machine import this_machine
from engine_launcher.builder.models import ModelError, serve_model
from engine_launcher.builder.plan import EngineSettings, plan_engine
from engine_launcher.builder.record import read_record
from engine_launcher.builder.template_file import template_file_parts
from engine_launcher.inside.rpc import parse_endpoints
from engine_launcher.supervise.launch import EngineLaunch, free_port, installed_setting_names
from engine_launcher.supervise.memory import MemoryEstimate, ModelShape
from proxy.config import ConfigError, Settings
from proxy.serve_memory import memory_plan

__all__ = ["ServePlan", "engine_args", "plan_serve"]


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
            print(f"assembling the model: {percent}%", file=out, flush=True)

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


def plan_serve(settings: Settings, *, out: TextIO = sys.stderr, check_machine: bool = True) -> ServePlan:
    """Resolve model, template, context, memory, offload and engine settings; raise ConfigError on anything unusable."""
    warnings: list[str] = []
    try:
        served = serve_model(settings.model, settings.chat_template, progress=_progress(out))
        model, metadata, template = served.path, served.metadata, served.template.path
        print(f"chat template: {served.template.describe()}", file=out, flush=True)
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
    n_ctx, memory, budget, notes = memory_plan(
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
