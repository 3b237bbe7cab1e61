"""MiniMax M3 tool calls, read from the text its own template renders."""

from __future__ import annotations

from engine_launcher.templates.template_check import WRITTEN_TOOLS, template_from_file_text, written_turn
from proxy.engine.toolcalls import Content, ExtractOptions, Reasoning, ToolCall, detect_tool_call_format
from tests.support.template_replies import every_split, extract, template_text, with_parallel_off

M3 = "MiniMax-M3"
TOKEN = "]<]minimax[>["
TOOLS = {t["function"]["name"]: t["function"]["parameters"] for t in WRITTEN_TOOLS}
PARIS = ToolCall(0, "id-0", "get_weather", '{"city":"Paris"}')
TOKYO = ToolCall(1, "id-1", "get_time", '{"city":"Tokyo","utc_offset":9}')
OPTIONS = ExtractOptions(calls="minimax-m3", tools=TOOLS)


def m3_calls() -> str:
    """The calls as M3's template writes them, without the ``</mm:think>`` before them."""
    turn = written_turn(template_from_file_text(template_text(M3), M3))
    assert turn is not None
    return turn.text.removeprefix("</mm:think>")


def test_parallel_calls_as_its_template_renders_them_at_every_split() -> None:
    events, extractor = every_split("On it.\n" + m3_calls(), OPTIONS)
    assert events == [Content("On it."), PARIS, TOKYO]  # utc_offset typed as the schema's integer
    assert extractor.malformed == 0


def test_reasoning_then_calls() -> None:
    markers = ("<mm:think>", "</mm:think>")
    options = ExtractOptions(calls="minimax-m3", tools=TOOLS, reasoning=True, think_markers=markers)
    events, _ = every_split("<mm:think>Two lookups.</mm:think>" + m3_calls(), options)
    assert events == [Reasoning("Two lookups."), PARIS, TOKYO]


def test_auto_reads_it_and_parallel_off_keeps_the_first() -> None:
    assert extract(m3_calls(), ExtractOptions(calls="auto", tools=TOOLS))[0] == [PARIS, TOKYO]
    assert with_parallel_off(m3_calls(), ExtractOptions(calls="minimax-m3", tools=TOOLS)) == [PARIS]


def test_a_tag_without_the_token_is_part_of_the_value() -> None:
    text = m3_calls().replace("Paris", "Paris <b>centre</b>")
    events, _ = every_split(text, OPTIONS)
    assert events[0] == ToolCall(0, "id-0", "get_weather", '{"city":"Paris <b>centre</b>"}')


def test_a_malformed_block_stays_content_and_is_counted() -> None:
    text = m3_calls().replace(f'{TOKEN}<invoke name="get_weather">', '<invoke name="get_weather">')
    events, extractor = every_split(text, OPTIONS)
    assert events == [Content(text)]
    assert extractor.malformed == 1


def test_a_call_cut_off_stays_content_after_the_calls_before_it() -> None:
    text = m3_calls()
    first_end = text.index("</invoke>") + len("</invoke>")
    cut = text.index('name="get_time"') + 20
    events, extractor = every_split(text[:cut], OPTIONS)
    assert events == [PARIS, Content(text[first_end:cut])]
    assert extractor.malformed == 1


def test_format_detected_from_the_real_template() -> None:
    assert detect_tool_call_format(template_text(M3)) == "minimax-m3"
