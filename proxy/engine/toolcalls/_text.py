"""Raw model text in, content, reasoning and tool calls out: one stream transducer.

``feed(text) -> list[Event]`` and ``finish() -> list[Event]``; any split of
the text gives the same events, merged, as the whole text (the tests check
every split). The non-stream path runs the same transducer over the whole
reply, so a stream and a non-stream reply never disagree.

What is held back, and only until it is decided:

- at the start, a possible ``<think>`` (with the whitespace before it);
- in reasoning, a possible ``</think>``;
- in content, a possible start marker of a call, and the whitespace just
  before it (a call's surrounding whitespace is not content);
- with ``mistral`` named, a reply that opens with ``[``, and with ``llama3`` or
  ``auto``, one that opens with ``{``, until that JSON closes: it may be a call
  whose marker the engine dropped;
- with ``functionary-v3.2``, the reply's first line, until it says whose segment
  the reply opens with (:data:`OPENED_BY_PROMPT`);
- once a marker has come, the call's text until the call is complete and
  well formed. Then it goes out as one :class:`ToolCall`; malformed or cut-off
  call text goes out as content, and is counted in ``malformed``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.engine.toolcalls._apertus import APERTUS, APERTUS_OPEN
from proxy.engine.toolcalls._cohere import COHERE, COHERE_OPEN, COHERE_WRAPPERS
from proxy.engine.toolcalls._deepseek import DEEPSEEK, DEEPSEEK_CALLS
from proxy.engine.toolcalls._dsml import DSML, DSML_OPENERS
from proxy.engine.toolcalls._events import (
    Content,
    Event,
    IdSource,
    ParsedCall,
    Reasoning,
    Step,
    ToolCall,
    random_call_id,
)
from proxy.engine.toolcalls._functionary import FunctionaryParser
from proxy.engine.toolcalls._functionary_v32 import SEGMENT, FunctionaryV32Parser
from proxy.engine.toolcalls._gemma4 import GEMMA4_OPEN, Gemma4Parser
from proxy.engine.toolcalls._gigachat import GIGACHAT_END, GIGACHAT_OPENERS
from proxy.engine.toolcalls._glimmer import GLIMMER
from proxy.engine.toolcalls._harmony import HARMONY, HARMONY_OPENERS, HarmonyDialect, HarmonyReader
from proxy.engine.toolcalls._hy3 import HY3_OPEN, Hy3Parser
from proxy.engine.toolcalls._invoke import InvokeParser
from proxy.engine.toolcalls._jsonlist import ListFormat, ListParser
from proxy.engine.toolcalls._kimi import KIMI, KIMI_SECTION
from proxy.engine.toolcalls._kimi_k3 import KIMI_K3_OPEN, KIMI_K3_WRAPPERS, KimiK3Parser
from proxy.engine.toolcalls._lfm2 import LFM2_OPEN, Lfm2Parser
from proxy.engine.toolcalls._llama3 import PYTHON_TAG, Llama3Parser
from proxy.engine.toolcalls._minicpm import MINICPM5, MINICPM5_OPEN
from proxy.engine.toolcalls._minimax import MINIMAX_M1_OPEN, MINIMAX_M2, MINIMAX_M2_OPEN, MiniMaxM1Parser
from proxy.engine.toolcalls._minimax_m3 import MINIMAX_M3_OPEN, MiniMaxM3Parser
from proxy.engine.toolcalls._mistral import TOOL_CALLS, MistralParser
from proxy.engine.toolcalls._nemotron import NEMOTRON, NEMOTRON_OPEN
from proxy.engine.toolcalls._qwen3coder import FUNCTION_OPEN
from proxy.engine.toolcalls._scan import held_suffix
from proxy.engine.toolcalls._sectioned import SectionParser
from proxy.engine.toolcalls._seed import SEED_CLOSE, SEED_OPEN
from proxy.engine.toolcalls._solar import SOLAR, SOLAR_SECTION, SOLAR_WRAPPERS
from proxy.engine.toolcalls._tagged import TOOL_CALL_OPEN, TaggedCallParser
from proxy.ops.privacy import private

__all__ = [
    "CONTENT_WRAPPERS",
    "DEFAULT_REASONING_MARKERS",
    "FORMATS",
    "MESSAGE_DIALECTS",
    "OPENED_BY_PROMPT",
    "ExtractOptions",
    "TextExtractor",
]

log = logging.getLogger("toolpair.toolcalls")

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DEFAULT_REASONING_MARKERS = (THINK_OPEN, THINK_CLOSE)

_LISTS: dict[str, ListFormat] = {NEMOTRON_OPEN: NEMOTRON, COHERE_OPEN: COHERE, APERTUS_OPEN: APERTUS}
"""The start marker of each family that writes its calls as one JSON array (:mod:`._jsonlist`)."""

FORMATS: dict[str, tuple[str, ...]] = {
    "hermes": (TOOL_CALL_OPEN,),
    "qwen3-coder": (TOOL_CALL_OPEN, FUNCTION_OPEN),
    "mistral": (TOOL_CALLS,),
    "llama3": (PYTHON_TAG,),
    "deepseek-v3.1": (DEEPSEEK_CALLS,),
    "deepseek-r1": (DEEPSEEK_CALLS,),
    "kimi-k2": (KIMI_SECTION,),
    "harmony": (),
    "glimmer": (),
    "glm": (TOOL_CALL_OPEN,),
    "minimax-m2": (MINIMAX_M2_OPEN,),
    "minimax-m1": (MINIMAX_M1_OPEN,),
    "apriel": (MINIMAX_M1_OPEN,),
    "dsml": DSML_OPENERS,
    "gemma4": (GEMMA4_OPEN,),
    "lfm2": (LFM2_OPEN,),
    "seed-oss": (SEED_OPEN,),
    "minicpm5": (MINICPM5_OPEN,),
    "hy3": (HY3_OPEN,),
    "solar-open": (SOLAR_SECTION,),
    "gigachat": GIGACHAT_OPENERS,
    "minimax-m3": (MINIMAX_M3_OPEN,),
    "nemotron": (NEMOTRON_OPEN,),
    "cohere": (COHERE_OPEN,),
    "apertus": (APERTUS_OPEN,),
    "functionary-v3.1": (FUNCTION_OPEN,),
    "kimi-k3": (KIMI_K3_OPEN,),
    "functionary-v3.2": (SEGMENT,),
    "auto": (
        TOOL_CALL_OPEN,
        TOOL_CALLS,
        PYTHON_TAG,
        DEEPSEEK_CALLS,
        KIMI_SECTION,
        MINIMAX_M2_OPEN,
        MINIMAX_M1_OPEN,
        *DSML_OPENERS,
        GEMMA4_OPEN,
        LFM2_OPEN,
        SEED_OPEN,
        MINICPM5_OPEN,
        HY3_OPEN,
        SOLAR_SECTION,
        *GIGACHAT_OPENERS,
        MINIMAX_M3_OPEN,
        *_LISTS,
        KIMI_K3_OPEN,
    ),
}
"""Start markers of each format. ``auto`` knows every marked form, and a bare JSON call
(:data:`_BARE_OPENERS`); Mistral's bare list needs the format named. ``harmony``
(gpt-oss) is messages on channels, not calls in text: :class:`HarmonyReader`
reads the whole reply, when named or when an ``auto`` reply opens as harmony does."""

MESSAGE_DIALECTS: dict[str, HarmonyDialect] = {"harmony": HARMONY, "glimmer": GLIMMER}
"""The formats that are messages, read whole by :class:`HarmonyReader`: gpt-oss's harmony, Muse Glimmer's ATEM."""

OPENED_BY_PROMPT = frozenset({"functionary-v3.2"})
"""Formats whose every reply starts inside a block the prompt opened (Functionary v3.2's first segment,
after the generation prompt's ``>>>``): the reply is read as that block from its first character, and
with no tools too, since its plain answer is a block as well (``all\n...``)."""

CALLS_IN_REASONING = frozenset({"apertus"})
"""Formats whose model calls tools inside its reasoning, and reasons on after them: Apertus writes its
calls within its ``<|inner_prefix|>`` thoughts. Elsewhere a call marker in reasoning is reasoning
(a model may think aloud about the syntax)."""

CONTENT_WRAPPERS: dict[str, tuple[str, ...]] = {
    "kimi-k3": KIMI_K3_WRAPPERS,
    "cohere": COHERE_WRAPPERS,
    "solar-open": SOLAR_WRAPPERS,
    "auto": (*KIMI_K3_WRAPPERS, *COHERE_WRAPPERS, *SOLAR_WRAPPERS),
}
"""Tokens a format writes around its answer that are not part of it: dropped from content, with
the whitespace before them, whether tools were sent or not (:attr:`ExtractOptions.wrappers`).
Each is a special token of its family, never text a model means, so ``auto`` drops them all."""

_BARE_OPENERS = {"mistral": "[", "llama3": "{", "auto": "{"}
"""Formats whose call may come with no marker, when tools were sent: the JSON opener it starts with.
``auto`` reads Llama 3.x's bare ``{"name": …, "parameters": …}`` (llama-cpp-python drops the
``<|python_tag|>`` before it); only a call of one of the request's tools is taken as one."""


class CallParser(Protocol):
    """Reads the text after a start marker; see :class:`~proxy.engine.toolcalls._events.Step`."""

    counts_malformed: bool

    def step(self, text: str, final: bool) -> Step: ...


class _Wrapper:
    """The "parser" of a wrapper token: the block is the token alone, and nothing is counted."""

    counts_malformed = False

    def step(self, text: str, final: bool) -> Step:
        return Step("done")


_WRAPPER = _Wrapper()


@dataclass(frozen=True)
class ExtractOptions:
    """What to lift out of one reply's text."""

    calls: str | None = None
    """Tool-call format (a key of :data:`FORMATS`), or None to leave calls in the text."""
    reasoning: bool = False
    """Move a leading ``<think>…</think>`` block into reasoning."""
    think_open: bool = False
    """The prompt already opened the reasoning block: the reply starts inside it."""
    think_markers: tuple[str, str] = DEFAULT_REASONING_MARKERS
    """The model's reasoning markers (see :mod:`._reasoning`): ``<think>``, ``<seed:think>``, ..."""
    parallel: bool = True
    """False keeps only the first call (``parallel_tool_calls: false``)."""
    tools: Mapping[str, Any] = field(default_factory=dict)
    """The request's function tools: name -> parameters schema."""
    harmony: bool = False
    """The model writes harmony (gpt-oss): its channels say what is reasoning, with tools or without."""
    dialect: str = "harmony"
    """Which messages ``harmony`` reads (a key of :data:`MESSAGE_DIALECTS`): Muse Glimmer's are ``glimmer``."""
    wrappers: tuple[str, ...] = ()
    """Tokens around the answer that are not content (:data:`CONTENT_WRAPPERS`): dropped where they stand."""

    @property
    def active(self) -> bool:
        return self.calls is not None or self.reasoning or self.harmony or bool(self.wrappers)


class TextExtractor:
    """One reply's text -> :class:`Content`, :class:`Reasoning` and :class:`ToolCall` events.

    >>> x = TextExtractor(ExtractOptions(calls="hermes"), ids=lambda style: "call_1")
    >>> x.feed('Sure.\\n<tool_call>{"name": "f", "arguments": {}}</tool') + x.feed('_call>') + x.finish()
    [Content(text='Sure.'), ToolCall(index=0, id='call_1', name='f', arguments='{}')]
    """

    def __init__(self, options: ExtractOptions, ids: IdSource = random_call_id) -> None:
        if options.calls is not None and options.calls not in FORMATS:
            raise ValueError(f"unknown tool-call format {options.calls!r}")
        self._options = options
        self._ids = ids
        self._wrappers = frozenset(options.wrappers)
        self._markers = (FORMATS[options.calls] if options.calls else ()) + options.wrappers
        self._marker_starts = frozenset(m[0] for m in self._markers)
        """The characters a marker starts with: a piece with none of them holds no call (:meth:`feed`)."""
        self._bare = _BARE_OPENERS.get(options.calls or "") if options.tools else None
        self._opened = options.calls in OPENED_BY_PROMPT
        self._reasoning_calls = options.calls in CALLS_IN_REASONING
        self._after_call = "content"  # the phase a call block returns to
        if not options.reasoning:
            self._phase = "content"
        else:
            self._phase = "reasoning" if options.think_open else "start"
        self._think_open, self._think_close = options.think_markers
        self._buffer = ""
        self._trim = options.reasoning and options.think_open  # drop whitespace that opens a section
        self._harmony: HarmonyReader | None = None
        self._opening = self._phase  # the phase an auto reply that is not harmony starts in
        if options.harmony or options.calls in MESSAGE_DIALECTS:
            dialect = MESSAGE_DIALECTS[options.calls if options.calls in MESSAGE_DIALECTS else options.dialect]
            self._phase = "harmony"
            self._harmony = HarmonyReader(options.tools if options.calls else None, dialect)
        elif options.calls == "auto":
            self._phase = "sniff"
        self._at_start = True
        self._parser: CallParser | None = None
        self._marker = ""  # the marker (and whitespace before it) of the block being read
        self._block_calls = 0
        self.calls = 0
        """Calls emitted so far."""
        self.malformed = 0
        """Call blocks that turned out malformed and went out as text."""
        self.dropped = 0
        """Calls left out because ``parallel`` is off."""

    def feed(self, text: str) -> list[Event]:
        # The common piece, a few characters of plain content with at most whitespace held back, is
        # content as it is (its own trailing whitespace held, as _content holds it): this path skips
        # the state machine, and it is where a reply spends its time.
        if (
            self._phase == "content"
            and not self._trim
            and (not self._at_start or (self._bare is None and not self._opened))
            and (not self._buffer or self._buffer.isspace())
            and self._marker_starts.isdisjoint(text)
        ):
            body = text.rstrip()
            if not body:
                self._buffer += text
                return []
            held, self._buffer = self._buffer, text[len(body) :]
            return [Content(held + body)]
        if (
            self._phase == "reasoning"
            and not self._trim
            and not self._buffer
            and text
            and self._think_close[0] not in text
            and not (self._reasoning_calls and not self._marker_starts.isdisjoint(text))
        ):
            return [Reasoning(text)]
        self._buffer += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        return self._run(final=True)

    def _run(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while self._advance(out, final):
            pass
        return out

    def _advance(self, out: list[Event], final: bool) -> bool:
        """One step of the state machine; True when it should run again."""
        if self._phase == "harmony":
            return self._harmony_step(out, final)
        if self._phase == "sniff":
            return self._sniff(final)
        if self._phase == "start":
            return self._start(final)
        if self._phase == "reasoning":
            return self._reasoning(out, final)
        if self._phase == "call":
            return self._call(out, final)
        return self._content(out, final)

    def _start(self, final: bool) -> bool:
        stripped = self._buffer.lstrip()
        if stripped.startswith(self._think_open):
            self._buffer = stripped[len(self._think_open) :]
            self._phase, self._trim = "reasoning", True
            return True
        if stripped.startswith(self._think_close):
            # An empty block whose opener the prompt wrote: DeepSeek V3.2's history renders a turn
            # as ``</think>`` then its calls, so the model writes that close when the prompt opened none.
            self._buffer = stripped[len(self._think_close) :]
            self._phase, self._trim = "content", True
            return True
        if not final and (self._think_open.startswith(stripped) or self._think_close.startswith(stripped)):
            return False
        self._phase = "content"
        return True

    def _sniff(self, final: bool) -> bool:
        """With ``auto``: does the reply open as harmony does? Held only while it still may."""
        stripped = self._buffer.lstrip()
        if any(stripped.startswith(o.lstrip()) for o in HARMONY_OPENERS):
            self._phase, self._harmony = "harmony", HarmonyReader(self._options.tools)
            return True
        if not final and any(o.lstrip().startswith(stripped) for o in HARMONY_OPENERS):
            return False
        self._phase = self._opening
        return True

    def _harmony_step(self, out: list[Event], final: bool) -> bool:
        assert self._harmony is not None
        events = self._harmony.feed(self._buffer)
        self._buffer = ""
        if final:
            events += self._harmony.finish()
        for event in events:
            if isinstance(event, ParsedCall):
                self._emit(event, out)
            else:
                out.append(event)
        self.malformed = self._harmony.malformed
        return False

    def _trimmed(self) -> bool:
        """Drop whitespace at the start of a section; False while there is nothing else yet."""
        if self._trim:
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return False
            self._trim = False
        return True

    def _reasoning(self, out: list[Event], final: bool) -> bool:
        if not self._trimmed():
            return False
        end = self._buffer.find(self._think_close)
        if self._reasoning_calls and self._call_in_reasoning(out, end):
            return True
        if end >= 0:
            if end:
                out.append(Reasoning(self._buffer[:end]))
            self._buffer = self._buffer[end + len(self._think_close) :]
            self._phase, self._trim = "content", True
            return True
        held = (self._think_close, *self._markers) if self._reasoning_calls else (self._think_close,)
        keep = 0 if final else held_suffix(self._buffer, held)
        cut = len(self._buffer) - keep
        if cut:
            out.append(Reasoning(self._buffer[:cut]))
            self._buffer = self._buffer[cut:]
        return False

    def _call_in_reasoning(self, out: list[Event], end: int) -> bool:
        """A call's start marker before the reasoning's close (``end``, -1 when none yet): read the call, and
        then the reasoning again (:data:`CALLS_IN_REASONING`)."""
        buffer = self._buffer
        limit = end if end >= 0 else len(buffer)
        found = min(((i, m) for m in self._markers if (i := buffer.find(m, 0, limit)) >= 0), default=None)
        if found is None:
            return False
        index, marker = found
        before = buffer[:index]
        text = before.rstrip()
        if text:
            out.append(Reasoning(text))
        self._marker = before[len(text) :] + marker
        self._buffer = buffer[index + len(marker) :]
        self._begin(self._parser_for(marker))
        self._after_call = "reasoning"
        return True

    def _content(self, out: list[Event], final: bool) -> bool:
        if not self._trimmed():
            return False
        if self._at_start and self._bare is not None and self._open_bare(final):
            return True
        if self._at_start and self._opened:
            self._at_start, self._marker = False, ""
            self._begin(self._parser_for(self._markers[0]))
            return True
        buffer = self._buffer
        found = min(((i, m) for m in self._markers if (i := buffer.find(m)) >= 0), default=None)
        if found is not None:
            index, marker = found
            before = buffer[:index]
            text = before.rstrip()
            if text:
                out.append(Content(text))
            self._marker = before[len(text) :] + marker
            self._buffer = buffer[index + len(marker) :]
            self._begin(self._parser_for(marker))
            return True
        cut = len(buffer)
        if not final and self._markers:
            cut -= held_suffix(buffer, self._markers)
            while cut and buffer[cut - 1].isspace():
                cut -= 1
        if cut:
            out.append(Content(buffer[:cut]))
            self._buffer = buffer[cut:]
        return False

    def _open_bare(self, final: bool) -> bool:
        """At the start of the content: does a marker-less call (a JSON opener) begin here?"""
        stripped = self._buffer.lstrip()
        if not stripped:
            if final:
                self._at_start = False
            return False
        self._at_start = False
        if stripped[0] != self._bare:
            return False
        self._marker = self._buffer[: len(self._buffer) - len(stripped)]
        self._buffer = stripped
        known = self._options.tools.keys()
        parser = MistralParser(known, bare=True) if self._bare == "[" else Llama3Parser(known, bare=True)
        self._begin(parser)
        return True

    def _parser_for(self, marker: str) -> CallParser:
        if marker in self._wrappers:
            return _WRAPPER
        if marker == TOOL_CALLS:
            return MistralParser(self._options.tools.keys())
        if marker == PYTHON_TAG:
            return Llama3Parser(self._options.tools.keys())
        if marker in GIGACHAT_OPENERS:
            return Llama3Parser(self._options.tools.keys(), ends=GIGACHAT_END)
        if marker == DEEPSEEK_CALLS:
            return SectionParser(DEEPSEEK)
        if marker == KIMI_SECTION:
            return SectionParser(KIMI)
        if marker == SOLAR_SECTION:
            return SectionParser(SOLAR)
        if marker == KIMI_K3_OPEN:
            return KimiK3Parser(self._options.tools)
        if marker == SEGMENT:
            return FunctionaryV32Parser(self._options.tools)
        if marker == MINIMAX_M3_OPEN:
            return MiniMaxM3Parser(self._options.tools)
        if marker == MINIMAX_M2_OPEN:
            return InvokeParser(MINIMAX_M2, self._options.tools)
        if marker in DSML_OPENERS:
            return InvokeParser(DSML, self._options.tools)
        if marker == LFM2_OPEN:
            return Lfm2Parser()
        if marker in _LISTS:
            return ListParser(_LISTS[marker])
        if marker == GEMMA4_OPEN:
            return Gemma4Parser()
        if marker == MINIMAX_M1_OPEN:
            return MiniMaxM1Parser()
        if marker == HY3_OPEN:
            return Hy3Parser(self._options.tools)
        if marker == MINICPM5_OPEN:
            return InvokeParser(MINICPM5, self._options.tools)
        if marker == SEED_OPEN:
            return TaggedCallParser(self._options.tools, close=SEED_CLOSE)
        if marker == FUNCTION_OPEN and self._options.calls == "functionary-v3.1":
            return FunctionaryParser()
        return TaggedCallParser(self._options.tools, after_function_tag=marker == FUNCTION_OPEN)

    def _begin(self, parser: CallParser) -> None:
        self._parser, self._phase, self._block_calls = parser, "call", 0

    def _call(self, out: list[Event], final: bool) -> bool:
        assert self._parser is not None
        step = self._parser.step(self._buffer, final)
        for call in step.calls:
            self._emit(call, out)
        if step.state == "more" and not final:
            return False
        if step.state == "done":
            self._buffer = self._buffer[step.consumed :]
            self._trim = True
        else:
            if self._parser.counts_malformed:
                self.malformed += 1
                text = self._marker + self._buffer
                log.warning("malformed %s tool call kept as text: %s", self._options.calls, private(repr(text[:200])))
            if step.consumed == 0 and self._block_calls == 0:
                literal = self._marker + self._buffer[: step.literal]
                if literal:
                    out.append(Reasoning(literal) if self._after_call == "reasoning" else Content(literal))
                self._buffer = self._buffer[step.literal :]
            else:
                self._buffer = self._buffer[step.consumed :]
        self._parser, self._phase, self._marker = None, self._after_call, ""
        self._after_call = "content"
        return True

    def _emit(self, call: ParsedCall, out: list[Event]) -> None:
        self._block_calls += 1
        if self.calls and not self._options.parallel:
            self.dropped += 1
            return
        call_id = call.id or self._ids(call.id_style)
        out.append(ToolCall(self.calls, call_id, call.name, call.arguments))
        self.calls += 1
