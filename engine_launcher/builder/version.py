"""The one llama-cpp-python release toolpair builds, installs and changes from inside.

Written here once: the build (:mod:`.install`), the engine's fixes
(:data:`engine_launcher.inside.engine_main.ENGINE_FIXES`, each checked against it) and what serve
says all read it; ``pyproject.toml``'s ``engine`` extra and ``scripts/gpu_check.sh`` are held to it
by tests and by reading it.
"""

from __future__ import annotations

__all__ = ["LLAMA_CPP_VERSION"]

LLAMA_CPP_VERSION = "0.3.36"
