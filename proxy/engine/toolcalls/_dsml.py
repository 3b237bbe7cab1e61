# ruff: noqa: RUF001, RUF002  # the fullwidth bar is how DeepSeek's tokenizer spells DSML
"""DeepSeek V3.2 and V4 calls (DSML): ``<｜DSML｜invoke>`` elements, each value marked string or JSON.

V3.2 opens the block with ``<｜DSML｜function_calls>``, V4 with
``<｜DSML｜tool_calls>``; the elements inside are the same, and are read by
:mod:`._invoke`'s parser.
"""

from __future__ import annotations

from proxy.engine.toolcalls._invoke import InvokeGrammar

__all__ = ["DSML", "DSML_OPENERS"]

_DSML = "｜DSML｜"
DSML_OPENERS = (f"<{_DSML}function_calls>", f"<{_DSML}tool_calls>")
DSML = InvokeGrammar(_DSML, (f"</{_DSML}function_calls>", f"</{_DSML}tool_calls>"))
