"""Does a chat template tie each tool result to its call, or only put it in the same position?

toolpair exists because most chat templates render a run of tool results one after the other
with nothing but their position to say which call each answers. This module finds out which
kind a given template is, by rendering one conversation three ways, the way the engine renders it
(llama-cpp-python, ``toolpair serve``'s engine, or transformers' ``apply_chat_template``: :class:`Renderer`):

- one call of ``get_weather`` and its result (can the template render tool use at all?);
- two parallel calls of the same tool and their results in call order;
- the same two results in reversed order, as they arrive when the second call finishes first.

The two results carry the same tool name, so a template can tell them apart only by the
``tool_call_id`` that travels with each. Comparing the two renderings then gives the verdict:

- ``self-ordered``: both orders render alike (the template sorts results into call order itself);
- ``position``: the reversed rendering is the ordered one with the two result texts swapped,
  so nothing but position says which result answers which call;
- ``id``: the rendering differs in more than the texts, and every other difference is a call
  ID (the ID is printed next to its result);
- ``id-mapped``: something derived from the ID moves with the result (Cohere prints the
  index of the call whose ID matches);
- ``rejects-reordered``: call order renders, finish order fails (the engine refuses such requests);
- ``no-parallel``: one call renders but two do not (Llama 3.x: "only supports single tool-calls");
- ``drops-results``: the results are not in the rendering;
- ``fails``: the template does not render tool use at all (a syntax error, a missing filter...).

Pure: a template's text in, a :class:`TemplateVerdict` out. Reading GGUF files and template
files is the caller's business (``toolpair check-template``, ``bench/template_survey.py``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from jinja2 import TemplateError

from engine_launcher.builder.template_file import TemplateFileError, template_file_parts
from engine_launcher.templates.chat_template import render_prompt

__all__ = [
    "CALL_IDS",
    "REASONING_MARKERS",
    "RESULTS",
    "Pairing",
    "Renderer",
    "TemplateSource",
    "TOOL",
    "TemplateVerdict",
    "WRITTEN_CALLS",
    "WRITTEN_ANSWER",
    "WRITTEN_TOOLS",
    "WrittenTurn",
    "check_template",
    "conversation",
    "headline",
    "meaning",
    "render",
    "template_from_file_text",
    "written_answer",
    "written_turn",
]

CALL_IDS = ("Kq7Zt3Wm9", "Rb2Xn8Jp4")
"""Nine letters and digits each: Mistral's templates refuse any other shape of ID."""

RESULTS = ("TEMP-PARIS-31C", "TEMP-TOKYO-17C")
"""The two results' texts: distinct, equally long, and found nowhere else in a rendering."""

CITIES = ("Paris", "Tokyo")

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current temperature in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class Pairing(Enum):
    """How a template ties a tool result to its call; the value is the word the survey prints."""

    SELF_ORDERED = "self-ordered"
    POSITION = "position"
    ID = "id"
    ID_MAPPED = "id-mapped"
    REJECTS_REORDERED = "rejects-reordered"
    NO_PARALLEL = "no-parallel"
    DROPS_RESULTS = "drops-results"
    FAILS = "fails"

    @property
    def exit_status(self) -> int:
        """0: results are tied to their calls without toolpair; 1: toolpair is needed; 2: no answer."""
        if self in (Pairing.SELF_ORDERED, Pairing.ID, Pairing.ID_MAPPED):
            return 0
        if self in (Pairing.POSITION, Pairing.REJECTS_REORDERED):
            return 1
        return 2


@dataclass(frozen=True)
class TemplateSource:
    """A chat template's text with the special tokens it is rendered with, and where it came from."""

    text: str
    bos_token: str = "<s>"
    eos_token: str = "</s>"
    origin: str = ""


@dataclass(frozen=True)
class TemplateVerdict:
    pairing: Pairing
    detail: str = ""
    """The template's own error, for the verdicts that come from one."""

    @property
    def exit_status(self) -> int:
        return self.pairing.exit_status


def _call(index: int) -> dict[str, Any]:
    return {
        "id": CALL_IDS[index],
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": CITIES[index]})},
    }


def conversation(order: tuple[int, ...]) -> list[dict[str, Any]]:
    """A user question, the assistant's parallel calls, and the results in ``order``.

    >>> [m["role"] for m in conversation((1, 0))]
    ['user', 'assistant', 'tool', 'tool']
    >>> [m["tool_call_id"] for m in conversation((1, 0))[2:]] == [CALL_IDS[1], CALL_IDS[0]]
    True
    """
    calls = sorted(order)
    question = " and ".join(CITIES[i] for i in calls)
    return [
        {"role": "user", "content": f"What is the temperature in {question}?"},
        {"role": "assistant", "content": "", "tool_calls": [_call(i) for i in calls]},
        *({"role": "tool", "content": RESULTS[i], "tool_call_id": CALL_IDS[i]} for i in order),
    ]


_NOW = datetime.now()
"""One instant for every rendering, so a template that prints the date renders both orders alike."""


def _strftime_now(form: str) -> str:
    return _NOW.strftime(form)


class Renderer(Enum):
    """Who renders the template.

    ``llama-cpp-python``: the engine ``toolpair serve`` runs, with toolpair's changes
    (:mod:`engine_launcher.templates.chat_template`): arguments as objects, else as the client's strings.
    ``transformers``: Hugging Face transformers' ``apply_chat_template``, which vLLM uses and whose
    dialect llama-server's ``--jinja`` follows: its Jinja dialect, and arguments parsed into objects.
    """

    LLAMA_CPP_PYTHON = "llama-cpp-python"
    TRANSFORMERS = "transformers"


def render(
    source: TemplateSource,
    messages: list[dict[str, Any]],
    renderer: Renderer = Renderer.LLAMA_CPP_PYTHON,
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt ``renderer`` would build from ``messages``; raises whatever the template raises.

    >>> render(TemplateSource("{% for m in messages %}[{{ m.role }}]{% endfor %}"), [{"role": "user"}])
    '[user]'
    """
    return render_prompt(
        source.text,
        messages,
        bos_token=source.bos_token,
        eos_token=source.eos_token,
        tools=[TOOL] if tools is None else tools,
        strftime_now=_strftime_now,
        as_transformers=renderer is Renderer.TRANSFORMERS,
        add_generation_prompt=add_generation_prompt,
    )


def _attempt(source: TemplateSource, order: tuple[int, ...], renderer: Renderer) -> str | BaseException:
    try:
        return render(source, conversation(order), renderer)
    except Exception as exc:  # the template is foreign code: whatever it raises is its answer, mapped here once
        return exc


def _problem(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (TemplateError, ValueError)) else f"{type(exc).__name__}: {text}"


def _swap(text: str, pair: tuple[str, str]) -> str:
    first, second = pair
    return re.sub(f"{re.escape(first)}|{re.escape(second)}", lambda m: second if m[0] == first else first, text)


def _differs_only_in_ids(one: str, other: str) -> bool:
    """Whether ``one`` and ``other`` are the same text but for which call ID stands where.

    >>> _differs_only_in_ids(f"x {CALL_IDS[0]} y {CALL_IDS[1]}", f"x {CALL_IDS[1]} y {CALL_IDS[0]}")
    True
    >>> _differs_only_in_ids("x 0 y 1", "x 1 y 0")
    False
    """
    pattern = "(" + "|".join(map(re.escape, CALL_IDS)) + ")"
    left, right = re.split(pattern, one), re.split(pattern, other)
    if len(left) != len(right):
        return False
    return all(a == b or (a in CALL_IDS and b in CALL_IDS) for a, b in zip(left, right, strict=True))


def check_template(source: TemplateSource, renderer: Renderer = Renderer.LLAMA_CPP_PYTHON) -> TemplateVerdict:
    """Render the parallel calls with their results in both orders and say how results meet calls.

    >>> position = "{% for m in messages %}{% if m.role == 'tool' %}<r>{{ m.content }}</r>{% endif %}{% endfor %}"
    >>> check_template(TemplateSource(position)).pairing
    <Pairing.POSITION: 'position'>
    >>> by_id = position.replace("<r>", "<r id={{ m.tool_call_id }}>")
    >>> check_template(TemplateSource(by_id)).pairing
    <Pairing.ID: 'id'>
    """
    single = _attempt(source, (0,), renderer)
    ordered = _attempt(source, (0, 1), renderer)
    if isinstance(ordered, BaseException):
        if isinstance(single, BaseException):
            return TemplateVerdict(Pairing.FAILS, _problem(ordered))
        return TemplateVerdict(Pairing.NO_PARALLEL, _problem(ordered))
    if not all(result in ordered for result in RESULTS):
        return TemplateVerdict(Pairing.DROPS_RESULTS)
    reversed_ = _attempt(source, (1, 0), renderer)
    if isinstance(reversed_, BaseException):
        return TemplateVerdict(Pairing.REJECTS_REORDERED, _problem(reversed_))
    if reversed_ == ordered:
        return TemplateVerdict(Pairing.SELF_ORDERED)
    swapped = _swap(ordered, RESULTS)
    if reversed_ == swapped:
        return TemplateVerdict(Pairing.POSITION)
    if _differs_only_in_ids(swapped, reversed_):
        return TemplateVerdict(Pairing.ID)
    return TemplateVerdict(Pairing.ID_MAPPED)


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "utc_offset": {"type": "integer"}},
            "required": ["city", "utc_offset"],
        },
    },
}

WRITTEN_TOOLS = [TOOL, TIME_TOOL]
"""The tools offered while the model writes :data:`WRITTEN_CALLS`."""

WRITTEN_CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("get_weather", {"city": "Paris"}),
    ("get_time", {"city": "Tokyo", "utc_offset": 9}),
)
"""Two parallel calls of two tools, with a string and a number among their arguments."""

REASONING_MARKERS: tuple[tuple[str, str], ...] = (
    ("<seed:think>", "</seed:think>"),
    ("<mm:think>", "</mm:think>"),
    ("<think:opensource>", "</think:opensource>"),
    ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<|inner_prefix|>", "<|inner_suffix|>"),
    ("<|think|>", "<|end|>"),
    ("<think>", "</think>"),
)
"""Every reasoning pair toolpair knows, most specific first (``<think>`` is also inside others).
Here because the written turn needs them (a generation prompt may open one); the proxy reads
reasoning with the same table (``proxy.engine.toolcalls._reasoning``)."""

_TURN_MARK = "Sunny-7Qx"
"""A plain assistant reply, to learn what closes a turn: found nowhere else in a rendering."""


@dataclass(frozen=True)
class WrittenTurn:
    """What a template teaches its model to write for a turn of tool calls."""

    text: str
    """The model's text for the turn: the turn as the template renders it, after the generation prompt
    and without what closes the turn (the engine stops there and leaves it out)."""
    calls: tuple[tuple[str, dict[str, Any]], ...]
    """The calls in that text: both of :data:`WRITTEN_CALLS`, or the first where two do not render."""


def _written_call(index: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": CALL_IDS[index], "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _after_prompt(turn: str, prompt: str) -> str:
    """The part of a finished conversation's rendering that the model writes after ``prompt``.

    The two share the conversation up to the assistant's turn. Where the generation prompt goes on
    past their common start (it opens ``<think>``, a finished turn closes it or leaves it out), the
    model's text starts at the last token boundary before they part: a marker they begin alike
    (``<|START_RESPONSE|>``, ``<|START_ACTION|>``) belongs to the model's text whole. A generation
    prompt that opens ``<think>`` the finished turn lacks leaves the model inside it: its text closes
    it first (with no reasoning).

    >>> _after_prompt("<a><|START_ACTION|>[...]", "<a><|START_RESPONSE|>")
    '<|START_ACTION|>[...]'
    >>> _after_prompt("<a>\\n<b>", "<a>\\n")
    '<b>'
    >>> _after_prompt("<a><b>", "<a><think>\\n")
    '</think>\\n\\n<b>'
    >>> _after_prompt("<a><|START_ACTION|>", "<a><|START_THINKING|>")
    '<|END_THINKING|><|START_ACTION|>'
    """
    shared = 0
    for a, b in zip(turn, prompt, strict=False):
        if a != b:
            break
        shared += 1
    if shared < len(prompt):
        while shared and turn[shared - 1] not in ">\n":
            shared -= 1
    text, opened = turn[shared:], prompt[shared:]
    for opening, closing in REASONING_MARKERS:
        if opening in opened and closing not in opened and closing not in text:
            # The prompt left the model inside its reasoning: its text closes it first.
            return closing + ("\n\n" if closing == "</think>" else "") + text
    return text


def _turn_text(source: TemplateSource, renderer: Renderer, turn: dict[str, Any]) -> str:
    """The model's text for ``turn``, after the question's generation prompt; raises what the template raises."""
    question = {"role": "user", "content": "What is the weather in Paris, and the time in Tokyo?"}
    prompt = render(source, [question], renderer, tools=WRITTEN_TOOLS)
    rendered = render(source, [question, turn], renderer, tools=WRITTEN_TOOLS, add_generation_prompt=False)
    return _after_prompt(rendered, prompt)


def _without_closing(text: str, closing: str) -> str:
    """``text`` less the longest end of a plain turn's ``closing`` that it ends with, cut where a token starts.

    A turn of calls may close differently from a plain one at first and alike after: Command R7B
    closes a reply ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>`` and its calls
    ``<|END_ACTION|><|END_OF_TURN_TOKEN|>``; only the shared end is what closes the turn. The cut
    falls between two whole tokens of the closing (``><``), never inside one's words.

    >>> _without_closing("<a>[...]<|END_ACTION|><|END_OF_TURN_TOKEN|>", "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>")
    '<a>[...]<|END_ACTION|>'
    >>> _without_closing("<call>x</call>", "<|im_end|>")
    '<call>x</call>'
    """
    stripped = text.rstrip()
    for start in (i for i, c in enumerate(closing) if i == 0 or (c == "<" and closing[i - 1] == ">")):
        if stripped.endswith(closing[start:]):
            return stripped[: len(stripped) - len(closing) + start]
    return text


def written_turn(source: TemplateSource, renderer: Renderer = Renderer.LLAMA_CPP_PYTHON) -> WrittenTurn | None:
    """The text the model writes for :data:`WRITTEN_CALLS`; None when the template renders no such turn.

    The turn is the rendering of the conversation ending in the assistant's calls, minus the
    rendering of the same conversation up to the generation prompt, minus what closes a turn (learnt
    from a plain reply rendered the same way). Both calls where the template renders them, else the
    first alone (Llama 3.x and gpt-oss write one call a turn); the turn's content empty, else None
    (DeepSeek R1's template writes calls only then).

    >>> chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}"
    ...           "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}</call>{% endfor %}<|im_end|>\\n"
    ...           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
    >>> written_turn(TemplateSource(chatml)).text
    '<call>get_weather</call><call>get_time</call>'
    """
    try:
        reply = _turn_text(source, renderer, {"role": "assistant", "content": _TURN_MARK})
    except Exception:  # the template is foreign code: whatever it raises, it teaches no turn
        return None
    closing = reply[reply.find(_TURN_MARK) + len(_TURN_MARK) :].strip() if _TURN_MARK in reply else ""
    for count in (2, 1):
        chosen = WRITTEN_CALLS[:count]
        calls = [_written_call(i, name, arguments) for i, (name, arguments) in enumerate(chosen)]
        for content in ("", None):
            try:
                text = _turn_text(source, renderer, {"role": "assistant", "content": content, "tool_calls": calls})
            except Exception:  # as above: this shape of turn is not one the template renders
                continue
            if not all(name in text for name, _ in chosen):
                continue
            # The model stops at its first end of turn, once its calls are written (DeepSeek R1
            # distills render an empty reply after them); GigaChat 3 writes its call as a message
            # after one, so there the separator is not where the model stops.
            first = text.find(closing) if closing else -1
            if first >= 0 and all(name in text[:first] for name, _ in chosen):
                return WrittenTurn(text[:first], chosen)
            return WrittenTurn(_without_closing(text, closing), chosen)
    return None


WRITTEN_ANSWER = _TURN_MARK
"""The plain answer :func:`written_answer` renders."""


def written_answer(source: TemplateSource, renderer: Renderer = Renderer.LLAMA_CPP_PYTHON) -> tuple[str, str] | None:
    """The model's text for the plain answer :data:`WRITTEN_ANSWER`, and what closes its turn; None when none renders.

    The text runs from the generation prompt through the answer, the tokens a family writes before
    it included (Command R7B's ``<|START_RESPONSE|>``); the closing is the rest of the turn as
    rendered (``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``), whose end the engine stops at and leaves out.

    >>> chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
    ...           "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
    >>> written_answer(TemplateSource(chatml))
    ('Sunny-7Qx', '<|im_end|>\\n')
    """
    try:
        reply = _turn_text(source, renderer, {"role": "assistant", "content": _TURN_MARK})
    except Exception:  # the template is foreign code: whatever it raises, it teaches no answer
        return None
    end = reply.find(_TURN_MARK)
    if end < 0:
        return None
    end += len(_TURN_MARK)
    return reply[:end], reply[end:]


def template_from_file_text(text: str, origin: str = "") -> TemplateSource:
    """A template from a file's text: a tokenizer_config-style JSON object, or the bare Jinja.

    JSON gives its own ``bos_token`` and ``eos_token`` (see
    :func:`~engine_launcher.templates.chat_template.template_file_parts`). Raises ValueError when a JSON file
    holds no usable template.

    >>> template_from_file_text('{"chat_template": "{{ 1 }}", "bos_token": "<b>", "eos_token": "<e>"}').bos_token
    '<b>'
    """
    stripped = text.lstrip()
    if not stripped.startswith("{") or stripped.startswith(("{%", "{{", "{#")):
        return TemplateSource(text, origin=origin)
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{origin or 'the template file'} looks like JSON but does not parse: {exc}") from None
    try:
        template, bos, eos = template_file_parts(config)
    except TemplateFileError as exc:
        raise ValueError(f"{origin or 'the template file'}: {exc}") from None
    return TemplateSource(template, bos_token=bos, eos_token=eos, origin=origin)


_MEANING = {
    Pairing.POSITION: (
        "results are tied to their calls by position only",
        "Nothing but its place in the prompt tells the model which result answers which call. A client "
        "that sends parallel results in finish order (most agent frameworks do) hands this model the "
        "wrong pairing; toolpair puts them back into call order first, so keep it in front.",
    ),
    Pairing.ID: (
        "results are tied to their calls by ID",
        "The template prints each call's ID next to its result, so the model can pair them in any order. "
        "toolpair's reordering is harmless here, but not needed for pairing.",
    ),
    Pairing.ID_MAPPED: (
        "results are tied to their calls by ID, rendered as something derived from it",
        "The template looks up each result's call by ID and prints what it found (Cohere prints the "
        "call's index), so the model can pair them in any order. toolpair's reordering is not needed for pairing.",
    ),
    Pairing.SELF_ORDERED: (
        "the template puts results into call order itself",
        "Results render the same in any order. toolpair's reordering is not needed for pairing.",
    ),
    Pairing.REJECTS_REORDERED: (
        "the template refuses results that are not in call order",
        "Requests with parallel results in finish order fail to render; toolpair puts them into call "
        "order first, so keep it in front.",
    ),
    Pairing.NO_PARALLEL: (
        "the template cannot render parallel tool calls",
        "It renders one call, but refuses two in one assistant turn. Give this model one tool at a time "
        "(parallel_tool_calls: false); there is nothing for toolpair to pair.",
    ),
    Pairing.DROPS_RESULTS: (
        "the template leaves tool results out of the prompt",
        "The model never sees what its tools returned; use a template made for tool use (--chat-template-file).",
    ),
    Pairing.FAILS: (
        "the template fails to render a conversation with tool calls",
        "Requests with tool calls fail before they reach the model; use a template made for tool use "
        "(--chat-template-file).",
    ),
}


def headline(pairing: Pairing) -> str:
    """One line: what the template does with parallel results.

    >>> headline(Pairing.POSITION)
    'results are tied to their calls by position only'
    """
    return _MEANING[pairing][0]


def meaning(pairing: Pairing) -> str:
    """What the verdict means for the user, with toolpair and without."""
    return _MEANING[pairing][1]
