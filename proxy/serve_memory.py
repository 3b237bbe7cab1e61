"""How much context ``toolpair serve`` gives the engine, from the memory this machine has.

The engine's need is estimated from the model's header (:mod:`engine_launcher.supervise.memory`); this module
picks the largest context, up to the one asked for or trained, whose estimate fits in the memory
free where the engine keeps it (GPU memory for a fully offloaded GPU build, RAM otherwise), times
the number of engines ``--parallel`` starts, and says in a line when it had to choose less.
"""

from __future__ import annotations

from pathlib import Path

from engine_launcher.supervise.launch import CACHE_TYPES
from engine_launcher.supervise.memory import MemoryEstimate, ModelShape, estimate_memory, fitting_context, gib
from proxy.config import Settings

__all__ = ["memory_plan"]

_FALLBACK_CTX = 4096
"""n_ctx for a model whose header does not give its training context."""


def memory_plan(
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
    # memory (``vram``, from the engine plan); what llama-cpp-python keeps in Python (scores, prompt cache)
    # stays in RAM.

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


def _times(engines: int) -> str:
    return f"{engines} x " if engines > 1 else ""
