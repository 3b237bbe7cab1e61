"""MiniMax M2 (``<minimax:tool_call><invoke name=...><parameter name=...>``) and M1 (``<tool_calls>`` JSON lines).

The calls are the ones MiniMax's own templates render for two parallel calls.
"""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support.template_replies import (
    CALLS,
    CONTENT,
    TOOLS,
    assert_parallel_off_keeps_the_first,
    assert_read_back,
    assert_stays_content,
    calls_of,
    content_of,
    extract,
    rendered_reply,
    template_text,
)

M2 = ExtractOptions(calls="minimax-m2", tools=TOOLS)
M1 = ExtractOptions(calls="minimax-m1", tools=TOOLS)
M2_END = "</minimax:tool_call>"


def m1_reply() -> str:
    """M1's template leaves an assistant turn's text out when it has calls: the calls alone, as rendered."""
    return rendered_reply("MiniMax-M1", "</tool_calls>", start="<tool_calls>")


@pytest.mark.parametrize("calls", ["minimax-m2", "auto"])
def test_m2_reads_its_templates_parallel_calls_typed(calls: str) -> None:
    assert detect_tool_call_format(template_text("MiniMax-M2")) == "minimax-m2"
    assert_read_back(rendered_reply("MiniMax-M2", M2_END), ExtractOptions(calls=calls, tools=TOOLS))


def test_m2_without_the_schema_keeps_values_as_text() -> None:
    events, _ = extract(rendered_reply("MiniMax-M2", M2_END), ExtractOptions(calls="minimax-m2"))
    assert calls_of(events)[0] == ("get_weather", {"city": "Paris", "note": "42", "days": "3"})


def test_m2_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = rendered_reply("MiniMax-M2", M2_END)
    cut = text[: text.rindex("</invoke>")]
    assert_stays_content(cut, M2, calls=1)
    events, _ = extract(cut, M2)
    assert content_of(events) == CONTENT + cut[cut.rindex("</invoke>") + len("</invoke>") :]


@pytest.mark.parametrize(
    "bad",
    [
        '<minimax:tool_call>\n<invoke>\n<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>',
        '<minimax:tool_call>\n<invoke name="get_weather">\nParis\n</invoke>\n</minimax:tool_call>',
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</invoke>',
        "<minimax:tool_call>\n</minimax:tool_call>",
    ],
)
def test_m2_malformed_blocks_stay_content(bad: str) -> None:
    events, _ = extract("Sure. " + bad, M2)
    assert content_of(events) == "Sure. " + bad
    assert_stays_content("Sure. " + bad, M2)


def test_m2_parallel_off_keeps_the_first() -> None:
    assert_parallel_off_keeps_the_first(rendered_reply("MiniMax-M2", M2_END), "minimax-m2")


def test_m2_text_after_an_unclosed_block_is_content() -> None:
    text = rendered_reply("MiniMax-M2", M2_END).removesuffix(M2_END) + "Done."
    events, extractor = extract(text, M2)
    assert calls_of(events) == CALLS and content_of(events) == CONTENT + "Done." and extractor.malformed == 0


@pytest.mark.parametrize("calls", ["minimax-m1", "auto"])
def test_m1_reads_its_templates_json_lines(calls: str) -> None:
    assert detect_tool_call_format(template_text("MiniMax-M1")) == "minimax-m1"
    assert_read_back(m1_reply(), ExtractOptions(calls=calls, tools=TOOLS), content="")


def test_m1_cut_off_and_malformed_lines_stay_content() -> None:
    text = m1_reply()
    cut = text[: text.rindex("}}")]
    assert_stays_content(cut, M1, calls=1)
    assert_stays_content('<tool_calls>\n{"name": "get_weather", "arguments": 3}\n</tool_calls>', M1)
    assert_stays_content("<tool_calls>\n</tool_calls>", M1)


@pytest.mark.parametrize("name", ["unsloth-Apriel-1.5", "Apriel-1.6-15b-Thinker-fixed"])
def test_apriel_writes_the_same_tag_with_a_json_list(name: str) -> None:
    assert detect_tool_call_format(template_text(name)) == "apriel"
    text = rendered_reply(name, "</tool_calls>")
    assert "<tool_calls>[" in text
    assert_read_back(text, ExtractOptions(calls="apriel", tools=TOOLS))
