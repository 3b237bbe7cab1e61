"""Command R7B and Cohere2: ``<|START_ACTION|>[{"tool_name": ..., "parameters": {...}}]<|END_ACTION|>``.

Read from their own templates' turns, with reasoning in ``<|START_THINKING|>…<|END_THINKING|>`` as the
templates say (Cohere2's prompt opens it; Command R7B's model opens it itself, when thinking is on).
"""

from __future__ import annotations

import pytest

from engine_launcher.template_check import WRITTEN_ANSWER, template_from_file_text, written_answer
from proxy.engine.toolcalls import (
    CONTENT_WRAPPERS,
    Content,
    ExtractOptions,
    Reasoning,
    detect_tool_call_format,
    template_reasoning,
)
from tests.support.template_replies import (
    CALLS,
    TOOLS,
    assert_read_back,
    assert_stays_content,
    calls_of,
    content_of,
    every_split,
    extract,
    rendered_reply,
    template_text,
)

NAMES = ["Cohere2MoE", "CohereForAI-c4ai-command-r7b-12-2024-tool_use"]
COHERE = ExtractOptions(calls="cohere", tools=TOOLS)
OPEN, END = "<|START_ACTION|>", "<|END_ACTION|>"


def turn(name: str) -> str:
    """The template's calls; neither template renders a turn's content beside its calls."""
    return rendered_reply(name, END, start=OPEN)


@pytest.mark.parametrize("name", NAMES)
def test_every_cohere_template_is_detected(name: str) -> None:
    assert detect_tool_call_format(template_text(name)) == "cohere"


@pytest.mark.parametrize("calls", ["cohere", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_the_templates_own_parallel_calls_are_read_back(name: str, calls: str) -> None:
    text = turn(name)
    assert '"tool_name": "get_weather"' in text
    assert_read_back(text, ExtractOptions(calls=calls, tools=TOOLS), content="")


@pytest.mark.parametrize(
    ("name", "variables", "opened"),
    [("Cohere2MoE", {}, True), ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", {"enable_thinking": True}, False)],
)
def test_reasoning_in_the_templates_own_markers_then_calls(name: str, variables: dict[str, bool], opened: bool) -> None:
    form = template_reasoning(template_text(name), variables)
    assert form is not None and (form.open, form.close, form.opens_in_prompt) == (
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        opened,
    )
    options = ExtractOptions(
        calls="cohere", tools=TOOLS, reasoning=True, think_open=opened, think_markers=(form.open, form.close)
    )
    text = ("" if opened else form.open) + "I will look up both cities." + form.close + turn(name)
    events, _ = extract(text, options)
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["I will look up both cities."]
    assert calls_of(events) == CALLS and content_of(events) == ""
    every_split(text, options)


def test_without_the_close_marker_the_calls_stand() -> None:
    events, _ = extract('<|START_ACTION|>[{"tool_name": "get_weather", "parameters": {"city": "Paris"}}]', COHERE)
    assert calls_of(events) == [("get_weather", {"city": "Paris"})] and content_of(events) == ""


@pytest.mark.parametrize(
    "bad",
    [
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}',
        '<|START_ACTION|>[{"tool_call_id": "0", "parameters": {"city": "Paris"}}]<|END_ACTION|>',  # no name
        '<|START_ACTION|>[{"tool_name": "get_weather", "parameters": "Paris"}]<|END_ACTION|>',
        '<|START_ACTION|>[{"tool_name": "get_weather"}, "get_time"]<|END_ACTION|>',
        "<|START_ACTION|>[]<|END_ACTION|>",
        "<|START_ACTION|>get_weather(city='Paris')<|END_ACTION|>",
    ],
)
def test_malformed_calls_stay_content(bad: str) -> None:
    assert_stays_content("Sure. " + bad, COHERE)


def test_parallel_off_keeps_the_first() -> None:
    options = ExtractOptions(calls="cohere", tools=TOOLS, parallel=False)
    events, extractor = extract(turn(NAMES[1]), options)
    assert calls_of(events) == CALLS[:1] and extractor.dropped == 1


@pytest.mark.parametrize("tools", [TOOLS, {}])
@pytest.mark.parametrize("name", NAMES)
def test_a_plain_answer_is_clean_content(name: str, tools: dict[str, object]) -> None:
    written = written_answer(template_from_file_text(template_text(name), name))
    assert written is not None
    answer, closing = written
    text = answer + closing[: closing.index("<|END_OF_TURN_TOKEN|>")]  # where the engine stops
    assert "<|START_" in text and "<|END_" in text
    form = template_reasoning(template_text(name))
    assert form is not None
    options = ExtractOptions(
        calls="cohere" if tools else None,
        tools=tools,
        wrappers=CONTENT_WRAPPERS["cohere"],
        reasoning=True,
        think_open=form.opens_in_prompt,
        think_markers=(form.open, form.close),
    )
    events, extractor = extract(text, options)
    assert content_of(events) == WRITTEN_ANSWER and extractor.malformed == 0
    every_split(text, options)


def test_reasoning_then_an_answer_in_its_tokens() -> None:
    text = "Easy.<|END_THINKING|><|START_TEXT|>It is sunny.\n<|END_TEXT|>"
    options = ExtractOptions(
        wrappers=CONTENT_WRAPPERS["cohere"],
        reasoning=True,
        think_open=True,
        think_markers=("<|START_THINKING|>", "<|END_THINKING|>"),
    )
    events, _ = extract(text, options)
    assert events == [Reasoning("Easy."), Content("It is sunny.")]
    every_split(text, options)
