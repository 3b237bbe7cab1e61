"""How fast the installed engine computes here, measured in this process: ``python -m engine_launcher.inside.speed``.

It loads a model with llama-cpp-python directly (no server, no HTTP), evaluates
a prompt of ``--prompt-tokens`` and generates ``--gen-tokens`` greedily, and
prints one JSON line with llama.cpp's own timings: prompt and generation
tokens per second, the extra weight buffer types in use, and the text.

Two uses: ``bench/cpu_builds.py`` compares engine builds and load options with
it, each in a child process of its own; and ``make portable-check`` runs it
under an emulated older CPU, where a build that cannot run there dies with
SIGILL on its first matrix multiply.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine_launcher.inside.engine_main import extra_buffer_types, keep_weights_off_amx, load_without_extra_buffers

__all__ = ["main", "measure"]

_TEXT = (
    "The harbour town woke slowly. Fishermen mended nets along the quay while gulls argued over scraps, "
    "and the baker on Mill Street pulled the first loaves from an oven older than anyone could remember. "
)


def measure(
    model: Path, *, prompt_tokens: int, gen_tokens: int, repeats: int, extra_buffers: bool, threads: int | None
) -> dict[str, Any]:
    """Load ``model``, then time ``repeats`` runs of a prompt evaluation and a greedy generation; the best of each."""
    if not extra_buffers:
        load_without_extra_buffers()
    else:
        keep_weights_off_amx()  # as the engine would: AMX weights crash (see engine_main)
    llama: Any = importlib.import_module("llama_cpp")
    started = time.monotonic()
    kwargs: dict[str, Any] = {"n_ctx": max(512, prompt_tokens + gen_tokens + 8), "verbose": False}
    if threads:
        kwargs.update(n_threads=threads, n_threads_batch=threads)
    llm = llama.Llama(str(model), **kwargs)
    loaded = time.monotonic() - started
    tokens = llm.tokenize((_TEXT * (prompt_tokens // 30 + 2)).encode())[:prompt_tokens]
    best_prompt = best_gen = 0.0
    text = ""
    for _ in range(repeats):
        llm.reset()
        llama.llama_perf_context_reset(llm._ctx.ctx)
        out = llm.create_completion(tokens, max_tokens=gen_tokens, temperature=0.0)
        perf = llama.llama_perf_context(llm._ctx.ctx)
        if perf.t_p_eval_ms > 0:
            best_prompt = max(best_prompt, perf.n_p_eval * 1000.0 / perf.t_p_eval_ms)
        if perf.t_eval_ms > 0:
            best_gen = max(best_gen, perf.n_eval * 1000.0 / perf.t_eval_ms)
        text = out["choices"][0]["text"]
    return {
        "prompt_tokens": len(tokens),
        "gen_tokens": gen_tokens,
        "prompt_tps": round(best_prompt, 1),
        "gen_tps": round(best_gen, 1),
        "load_s": round(loaded, 2),
        "extra_buffers": extra_buffer_types() if extra_buffers else [],
        "text": text,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_launcher.inside.speed", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--no-extra-buffers", action="store_true", help="load with use_extra_bufts = false (no repacked weights)"
    )
    args = parser.parse_args(argv)
    result = measure(
        args.model,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
        repeats=args.repeats,
        extra_buffers=not args.no_extra_buffers,
        threads=args.threads,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
