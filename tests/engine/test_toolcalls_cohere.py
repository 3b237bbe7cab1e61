"""Command R7B and Cohere2: ``<|START_ACTION|>[{"tool_name": ..., "parameters": {...}}]<|END_ACTION|>``.

Read from their own templates' turns, with reasoning in ``<|START_THINKING|>…<|END_THINKING|>`` as the
templates say (Cohere2's prompt opens it; Command R7B's model opens it itself, when thinking is on).
"""

from __future__ import annotations

import pytest

from engine_launcher.templates.template_check import WRITTEN_ANSWER, template_from_file_text, written_answer
from proxy.engine.toolcalls import (
    CONTENT_WRAPPERS,
    Content,
    ExtractOptions,
    Reasoning,
    detect_tool_call_format,
    template_reasoning,
)
from tests.support import template_replies as replies

NAMES = ["Cohere2MoE", "CohereForAI-c4ai-command-r7b-12-2024-tool_use"]
COHERE = ExtractOptions(calls="cohere", tools=replies.TOOLS)
OPEN, END = "<|START_ACTION|>", "<|END_ACTION|>"


def turn(name: str) -> str:
    """The template's calls; neither template renders a turn's content beside its calls."""
    return replies.rendered_reply(name, END, start=OPEN)


@pytest.mark.parametrize("name", NAMES)
def test_every_cohere_template_is_detected(name: str) -> None:
    assert detect_tool_call_format(replies.template_text(name)) == "cohere"


@pytest.mark.parametrize("calls", ["cohere", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_the_templates_own_parallel_calls_are_read_back(name: str, calls: str) -> None:
    text = turn(name)
    assert '"tool_name": "get_weather"' in text
    replies.assert_read_back(text, ExtractOptions(calls=calls, tools=replies.TOOLS), content="")


@pytest.mark.parametrize(
    ("name", "variables", "opened"),
    [("Cohere2MoE", {}, True), ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", {"enable_thinking": True}, False)],
)
def test_reasoning_in_the_templates_own_markers_then_calls(name: str, variables: dict[str, bool], opened: bool) -> None:
    form = template_reasoning(replies.template_text(name), variables)
    assert form is not None and (form.open, form.close, form.opens_in_prompt) == (
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        opened,
    )
    options = ExtractOptions(
        calls="cohere", tools=replies.TOOLS, reasoning=True, think_open=opened, think_markers=(form.open, form.close)
    )
    text = ("" if opened else form.open) + "I will look up both cities." + form.close + turn(name)
    events, _ = replies.extract(text, options)
    assert [e.text for e in events if isinstance(e, Reasoning)] == ["I will look up both cities."]
    assert replies.calls_of(events) == replies.CALLS and replies.content_of(events) == ""
    replies.every_split(text, options)


def test_without_the_close_marker_the_calls_stand() -> None:
    events, _ = replies.extract(
        '<|START_ACTION|>[{"tool_name": "get_weather", "parameters": {"city": "Paris"}}]', COHERE
    )
    assert replies.calls_of(events) == [("get_weather", {"city": "Paris"})] and replies.content_of(events) == ""


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
    replies.assert_stays_content("Sure. " + bad, COHERE)


def test_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(turn(NAMES[1]), "cohere")


@pytest.mark.parametrize("tools", [replies.TOOLS, {}])
@pytest.mark.parametrize("name", NAMES)
def test_a_plain_answer_is_clean_content(name: str, tools: dict[str, object]) -> None:
    written = written_answer(template_from_file_text(replies.template_text(name), name))
    assert written is not None
    answer, closing = written
    text = answer + closing[: closing.index("<|END_OF_TURN_TOKEN|>")]  # where the engine stops
    assert "<|START_" in text and "<|END_" in text
    options = replies.reading_reasoning(
        name, calls="cohere" if tools else None, tools=tools, wrappers=CONTENT_WRAPPERS["cohere"]
    )
    events, extractor = replies.extract(text, options)
    assert replies.content_of(events) == WRITTEN_ANSWER and extractor.malformed == 0
    replies.every_split(text, options)


def test_reasoning_then_an_answer_in_its_tokens() -> None:
    text = "Easy.<|END_THINKING|><|START_TEXT|>It is sunny.\n<|END_TEXT|>"
    options = ExtractOptions(
        wrappers=CONTENT_WRAPPERS["cohere"],
        reasoning=True,
        think_open=True,
        think_markers=("<|START_THINKING|>", "<|END_THINKING|>"),
    )
    events, _ = replies.extract(text, options)
    assert events == [Reasoning("Easy."), Content("It is sunny.")]
    replies.every_split(text, options)
