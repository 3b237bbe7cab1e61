"""Run llama-cpp-python's server with its RAM prompt cache bounded by what it really holds.

``python -m engine_launcher.engine_main llama_cpp.server --model ...`` applies
the fix below, then runs the server module exactly as ``python -m`` would.

Why: llama-cpp-python's RAM cache keeps its entries under ``cache_size`` by
counting each entry's llama.cpp state only. Every entry also holds a copy of
the server's Python-side logits rows: with ``logits_all`` off that is up to
n_batch x n_vocab float32 values (512 MiB for Gemma's 262,144-token vocabulary)
that nothing ever reads back, since sampling happens inside llama.cpp. A 1 GiB
cache of 40 MB conversation states would hold 25 of them: 13 GiB in truth.

The fix, in the engine's own process: with ``logits_all`` off, saving and
restoring a state see the logits array as its first row only, so a saved state
carries one row (1 MiB) instead of up to n_batch rows, and neither step copies
or writes the rest. And the cache counts each entry's logits and token arrays
against its bound, so ``cache_size`` is what the cache holds.
"""

from __future__ import annotations

import contextlib
import importlib
import runpy
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["bound_prompt_cache", "main"]


def bound_prompt_cache() -> None:
    """Patch llama-cpp-python (0.3.x) in this process as described above."""
    # Imported by name: toolpair's own checks run where the engine may not be installed yet.
    llama: Any = importlib.import_module("llama_cpp.llama")
    llama_cache: Any = importlib.import_module("llama_cpp.llama_cache")
    save_state, load_state = llama.Llama.save_state, llama.Llama.load_state

    def save_compact_state(self: Any) -> Any:
        if self._logits_all:
            return save_state(self)
        with _first_logits_row(self):
            return save_state(self)

    def load_compact_state(self: Any, state: Any) -> None:
        if self._logits_all:
            load_state(self, state)
            return
        with _first_logits_row(self):
            load_state(self, state)

    def held_bytes(self: Any) -> int:
        return sum(s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes for s in self.cache_state.values())

    llama.Llama.save_state = save_compact_state
    llama.Llama.load_state = load_compact_state
    llama_cache.LlamaRAMCache.cache_size = property(held_bytes)


@contextlib.contextmanager
def _first_logits_row(model: Any) -> Iterator[None]:
    """Show ``model`` its logits array as one row (its rows are unused without logits_all)."""
    scores = model.scores
    model.scores = scores[:1]
    try:
        yield
    finally:
        model.scores = scores


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m engine_launcher.engine_main MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    bound_prompt_cache()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
