"""The one table of toolpair's changes inside llama-cpp-python (``engine_main.ENGINE_FIXES``), held to the code.

Each row names the test that fails without it and the release it was read against; a new
llama-cpp-python release fails here until every row has been read again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.builder.version import LLAMA_CPP_VERSION
from engine_launcher.inside import engine_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fix", engine_main.ENGINE_FIXES, ids=lambda fix: fix.test.rpartition("::")[2])
def test_each_fix_names_a_test_that_exists(fix: engine_main.EngineFix) -> None:
    path, _, name = fix.test.partition("::")
    text = (ROOT / path).read_text()
    assert re.search(rf"^(async )?def {re.escape(name)}\(", text, re.M), f"{fix.test} is no test"
    assert fix.why and fix.changes


def test_every_fix_was_read_against_the_installed_release() -> None:
    llama_cpp: Any = pytest.importorskip("llama_cpp")
    assert llama_cpp.__version__ == LLAMA_CPP_VERSION
    assert {fix.checked_against for fix in engine_main.ENGINE_FIXES} == {LLAMA_CPP_VERSION}


def test_the_table_is_every_change_engine_main_makes() -> None:
    """Every function that patches llama-cpp-python is a row (or what a row's function calls)."""
    source = (ROOT / "engine_launcher" / "inside" / "engine_main.py").read_text()
    table = source[source.index("ENGINE_FIXES: tuple") :]
    patchers = {
        "bound_prompt_cache",
        "render_chat_templates_as_models_expect",
        "take_template_kwargs_per_request",
        "write_control_tokens_as_text",
        "keep_weights_off_amx",
    }
    assert {name for name in patchers if re.search(rf"\b{name}\b", table)} == patchers
    assert len(engine_main.ENGINE_FIXES) == len(patchers)
