# ruff: noqa: RUF001, RUF002  # the fullwidth bar is how Hunyuan's tokenizer spells its end of turn
"""Hunyuan Hy3 calls: GLM's key and value pairs, every tag suffixed ``:opensource``, in a ``<tool_calls>`` section.

As tencent's Hy3 template renders two calls::

    <tool_calls:opensource>
    <tool_call:opensource>get_weather<tool_sep:opensource>
    <arg_key:opensource>city</arg_key:opensource>
    <arg_value:opensource>Paris</arg_value:opensource>
    </tool_call:opensource>
    <tool_call:opensource>get_time<tool_sep:opensource>
    ...
    </tool_calls:opensource><｜hy_eos:opensource｜>

Each call is read by :class:`~._glm.GlmReader` (values typed by the tool's schema), told the
suffix and the separator. The template ends the section with its end-of-turn token; an engine
normally stops at it unwritten, and where it is written it is consumed, not content. Calls go out
as each closes; a section the reply ends inside keeps them, and the rest is text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._events import ParsedCall, Step, StepState
from proxy.engine.toolcalls._glm import GlmReader
from proxy.engine.toolcalls._scan import skip_space

__all__ = ["HY3_OPEN", "HY3_SUFFIX", "Hy3Parser"]

HY3_SUFFIX = ":opensource"
HY3_OPEN = f"<tool_calls{HY3_SUFFIX}>"
_SECTION_CLOSE = f"</tool_calls{HY3_SUFFIX}>"
_CALL = f"<tool_call{HY3_SUFFIX}>"
_CALL_CLOSE = f"</tool_call{HY3_SUFFIX}>"
_SEPARATOR = f"<tool_sep{HY3_SUFFIX}>"
_END_OF_TURN = f"<｜hy_eos{HY3_SUFFIX}｜>"


class Hy3Parser:
    """Reads the calls after ``<tool_calls:opensource>``, up to its close (and an end-of-turn token after it)."""

    counts_malformed = True

    def __init__(self, tools: Mapping[str, Any]) -> None:
        self._tools = tools
        self._phase = "between"  # between calls, call, closed
        self._pos = 0
        self._last = 0  # end of the last complete call
        self._calls = 0
        self._reader: GlmReader | None = None

    def step(self, text: str, final: bool) -> Step:
        calls: list[ParsedCall] = []
        try:
            state = self._advance(text, final, calls)
        except ValueError:
            state = "fail"
        if state == "more" and final:
            state = "done" if self._calls and self._phase != "call" else "fail"
        return Step(state, self._last, calls)

    def _advance(self, text: str, final: bool, calls: list[ParsedCall]) -> StepState:
        while True:
            if self._phase == "call":
                assert self._reader is not None
                read = self._reader.read(text, final)
                if read is None:
                    return "more"
                end, call = read
                calls.append(call)
                self._calls += 1
                self._pos = self._last = end + len(_CALL_CLOSE)
                self._phase, self._reader = "between", None
                continue
            pos = skip_space(text, self._pos)
            rest = text[pos:]
            if self._phase == "closed":
                if rest.startswith(_END_OF_TURN):
                    self._last = pos + len(_END_OF_TURN)
                    return "done"
                return "more" if _END_OF_TURN.startswith(rest) else "done"  # held while it may still come
            if rest.startswith(_CALL):
                self._reader = GlmReader(pos + len(_CALL), self._tools, suffix=HY3_SUFFIX, separator=_SEPARATOR)
                self._phase = "call"
            elif rest.startswith(_SECTION_CLOSE):
                if not self._calls:
                    return "fail"
                self._pos = self._last = pos + len(_SECTION_CLOSE)
                self._phase = "closed"
            elif not rest or _CALL.startswith(rest) or _SECTION_CLOSE.startswith(rest):
                return "more"
            else:
                return "done" if self._calls else "fail"  # an unclosed section: the calls stand, the rest is text
