"""Does toolpair read back the tool calls a chat template teaches its model to write?

The template writes its own turn of two parallel calls (:func:`~engine_launcher.templates.template_check.written_turn`);
toolpair reads that text the way it reads a llama-cpp-python engine's reply when it knows the
template (``toolpair serve``, ``toolpair proxy --chat-template-file``): the format and open reasoning
from :func:`~proxy.engine.plan.follow_template`, the extraction from :func:`~proxy.engine.plan.reply_plan`.
The calls must come back as they were written, with no content beside them. ``toolpair
check-template`` prints the answer and ``bench/template_survey.py`` tabulates it; the HTTP round trip
over every template is ``tests/test_template_roundtrip.py``.

Pure: a template in, a :class:`Readback` out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine_launcher.templates.template_check import (
    WRITTEN_TOOLS,
    Renderer,
    TemplateSource,
    WrittenTurn,
    written_turn,
)
from proxy.config import Settings
from proxy.engine.kinds import EngineKind
from proxy.engine.plan import engine_setup, follow_template, reply_plan
from proxy.engine.toolcalls import Content, TextExtractor, ToolCall

__all__ = ["Readback", "read_back"]


@dataclass(frozen=True)
class Readback:
    """How toolpair reads a template's calls."""

    tool_call_format: str
    """The format toolpair reads it with: the one the template teaches, or ``auto`` (every marked form)."""
    think_open: bool
    """Whether toolpair takes the reply to start inside ``<think>``."""
    turn: WrittenTurn | None
    """The calls as the template writes them; None when it renders no turn of calls."""
    read: bool
    """The calls came back as written, with no content beside them."""

    def line(self) -> str:
        """One line for ``toolpair check-template``.

        >>> Readback("hermes", False, WrittenTurn("<tool_call>...", ()), True).line()
        "tool calls: written as '<tool_call>...', read as hermes: toolpair reads them back"
        """
        if self.turn is None:
            return "tool calls: the template renders no turn of tool calls"
        text = " ".join(self.turn.text.split())
        shown = text if len(text) <= 60 else text[:57] + "..."
        fmt = self.tool_call_format + (", the prompt opening <think>" if self.think_open else "")
        verdict = "toolpair reads them back" if self.read else "toolpair does NOT read them back (they stay text)"
        return f"tool calls: written as {shown!r}, read as {fmt}: {verdict}"


def read_back(source: TemplateSource, renderer: Renderer = Renderer.LLAMA_CPP_PYTHON) -> Readback:
    """The template's own calls, read by toolpair as it reads a llama-cpp-python engine with this template.

    >>> hermes = ("{% for m in messages %}{% for c in m.tool_calls or [] %}<tool_call>"
    ...           "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
    ...           "{% endfor %}{% endfor %}")
    >>> found = read_back(TemplateSource(hermes))
    >>> found.tool_call_format, found.read
    ('hermes', True)
    """
    settings = follow_template(Settings(engine_kind=EngineKind.LLAMA_CPP_PYTHON), source.text)
    turn = written_turn(source, renderer)
    if turn is None:
        return Readback(settings.tool_call_format, settings.think_in_prompt, None, False)
    plan = reply_plan({"messages": [], "tools": WRITTEN_TOOLS}, engine_setup(settings))
    assert plan is not None  # a llama-cpp-python engine with tools sent: calls are always looked for
    extractor = TextExtractor(plan.extract)
    events = extractor.feed(turn.text) + extractor.finish()
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]
    content = "".join(e.text for e in events if isinstance(e, Content))
    read = calls == [(name, arguments) for name, arguments in turn.calls] and not content
    return Readback(settings.tool_call_format, settings.think_in_prompt, turn, read)
