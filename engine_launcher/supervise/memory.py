"""How much memory the engine will need, estimated before it starts, and the context that fits.

A context the machine cannot hold does not fail cleanly: the engine is killed
by the kernel mid-load, or later, mid-request, when its KV cache fills. So
``serve`` adds up what the engine will allocate from the GGUF header and the
file size, compares it with what the machine has, and picks a smaller context
when it must.

The parts, as llama.cpp and llama-cpp-python allocate them:

- weights: the file's size (mapped or loaded whole);
- KV cache: per token, every layer's key and value heads at the cache type's
  width. Layers with a sliding window (Gemma 2 and 3) keep only the window,
  so they are counted at the window's size, not n_ctx;
- scores: with ``logits_all``, llama-cpp-python keeps n_ctx x n_vocab float32
  logits (the price of logprobs);
- compute buffers: one micro-batch's logits and attention scores, plus a fixed
  allowance for the runtime;
- prompt cache: its bound (which :mod:`engine_launcher.inside.engine_main` makes
  the bytes it really holds).

The estimate errs high; it is a bound to check against, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from engine_launcher.builder.gguf import Metadata

__all__ = [
    "MemoryEstimate",
    "ModelShape",
    "estimate_memory",
    "fitting_context",
    "gib",
]

MIB = 1024 * 1024
RUNTIME_BYTES = 160 * MIB
"""The Python interpreter, the server's libraries and llama.cpp's own small buffers."""

# Sliding-window layers by architecture: of every ``pattern`` layers, the last is global.
_SWA_PATTERNS = {"gemma2": 2, "gemma3": 6}


def gib(size: float) -> str:
    """A byte count for people.

    >>> gib(1.5 * 1024**3), gib(300 * 1024**2)
    ('1.5 GiB', '300 MiB')
    """
    return f"{size / 1024**3:.1f} GiB" if size >= 1024**3 else f"{size / MIB:.0f} MiB"


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a GGUF header."""

    n_layer: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    n_vocab: int
    sliding_window: int = 0
    swa_pattern: int = 0

    @classmethod
    def from_metadata(cls, metadata: Metadata) -> ModelShape | None:
        """The shape, or None when the header lacks what is needed (the estimate is then skipped)."""
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str):
            return None

        def number(key: str) -> int | None:
            value = metadata.get(f"{arch}.{key}")
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

        n_layer, n_head, n_embd = number("block_count"), number("attention.head_count"), number("embedding_length")
        tokens = metadata.get("tokenizer.ggml.tokens")
        n_vocab = tokens[1] if isinstance(tokens, tuple) and isinstance(tokens[1], int) else number("vocab_size")
        if not (n_layer and n_head and n_embd and n_vocab):
            return None
        # head_count_kv may be a per-layer array; the largest (its count here) is unknown, so use n_head.
        n_head_kv = number("attention.head_count_kv") or n_head
        key_length = number("attention.key_length") or n_embd // n_head
        value_length = number("attention.value_length") or n_embd // n_head
        window = number("attention.sliding_window") or 0
        return cls(
            n_layer,
            n_head,
            n_head_kv,
            key_length,
            value_length,
            n_vocab,
            window,
            _SWA_PATTERNS.get(arch, 0) if window else 0,
        )

    def kv_bytes(self, n_ctx: int, n_ubatch: int, bytes_k: float, bytes_v: float) -> int:
        """The KV cache for ``n_ctx`` tokens."""
        per_token_layer = self.n_head_kv * (self.key_length * bytes_k + self.value_length * bytes_v)
        if self.swa_pattern:
            full = self.n_layer // self.swa_pattern
            window = min(n_ctx, _pad(self.sliding_window + n_ubatch, 256))
            return int(per_token_layer * (full * n_ctx + (self.n_layer - full) * window))
        return int(per_token_layer * self.n_layer * n_ctx)


def _pad(value: int, to: int) -> int:
    return math.ceil(value / to) * to


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes the engine is expected to need, by part."""

    weights: int
    kv_cache: int
    scores: int
    compute: int
    prompt_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.scores + self.compute + self.prompt_cache

    def describe(self) -> str:
        """One line: the total and its parts.

        >>> print(MemoryEstimate(300 * MIB, 100 * MIB, 0, 400 * MIB, 0).describe())
        ~800 MiB (weights 300 MiB, KV cache 100 MiB, compute 400 MiB)
        """
        parts = [("weights", self.weights), ("KV cache", self.kv_cache), ("logits for logprobs", self.scores)]
        parts += [("compute", self.compute), ("prompt cache", self.prompt_cache)]
        shown = ", ".join(f"{name} {gib(size)}" for name, size in parts if size)
        return f"~{gib(self.total)} ({shown})"


def estimate_memory(
    shape: ModelShape,
    model_bytes: int,
    n_ctx: int,
    *,
    logits_all: bool,
    n_batch: int = 512,
    n_ubatch: int = 512,
    bytes_k: float = 2.0,
    bytes_v: float = 2.0,
    flash_attn: bool = False,
    prompt_cache_bytes: int = 0,
) -> MemoryEstimate:
    """What the engine will need at ``n_ctx``.

    >>> shape = ModelShape(18, 4, 1, 256, 256, 262144, 512, 6)
    >>> gib(estimate_memory(shape, 253 * MIB, 32768, logits_all=True).scores)
    '32.0 GiB'
    """
    n_ubatch = min(n_ubatch, n_batch)
    logits = n_ubatch * shape.n_vocab * 4
    attention = 0 if flash_attn else n_ubatch * n_ctx * shape.n_head * 4
    return MemoryEstimate(
        weights=model_bytes,
        kv_cache=shape.kv_bytes(n_ctx, n_ubatch, bytes_k, bytes_v),
        scores=n_ctx * shape.n_vocab * 4 if logits_all else 0,
        compute=logits + attention + RUNTIME_BYTES,
        prompt_cache=prompt_cache_bytes,
    )


def fitting_context(wanted: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n_ctx up to ``wanted`` that ``fits`` (below ``wanted``, a multiple of 256), or None.

    >>> fitting_context(32768, lambda n_ctx: n_ctx <= 10_000)
    9984
    """
    if fits(wanted):
        return wanted
    low, high = 0, wanted // 256  # in steps of 256 tokens; low fits (or is nothing), high does not
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle * 256):
            low = middle
        else:
            high = middle
    return low * 256 if low else None
