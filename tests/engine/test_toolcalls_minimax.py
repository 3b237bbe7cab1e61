"""MiniMax M2 (``<minimax:tool_call><invoke name=...><parameter name=...>``) and M1 (``<tool_calls>`` JSON lines).

The calls are the ones MiniMax's own templates render for two parallel calls.
"""

from __future__ import annotations

import pytest

from proxy.engine.toolcalls import ExtractOptions, detect_tool_call_format
from tests.support import template_replies as replies

M2 = ExtractOptions(calls="minimax-m2", tools=replies.TOOLS)
M1 = ExtractOptions(calls="minimax-m1", tools=replies.TOOLS)
M2_END = "</minimax:tool_call>"


def m1_reply() -> str:
    """M1's template leaves an assistant turn's text out when it has calls: the calls alone, as rendered."""
    return replies.rendered_reply("MiniMax-M1", "</tool_calls>", start="<tool_calls>")


@pytest.mark.parametrize("calls", ["minimax-m2", "auto"])
def test_m2_reads_its_templates_parallel_calls_typed(calls: str) -> None:
    assert detect_tool_call_format(replies.template_text("MiniMax-M2")) == "minimax-m2"
    replies.assert_read_back(
        replies.rendered_reply("MiniMax-M2", M2_END), ExtractOptions(calls=calls, tools=replies.TOOLS)
    )


def test_m2_without_the_schema_keeps_values_as_text() -> None:
    events, _ = replies.extract(replies.rendered_reply("MiniMax-M2", M2_END), ExtractOptions(calls="minimax-m2"))
    assert replies.calls_of(events)[0] == ("get_weather", {"city": "Paris", "note": "42", "days": "3"})


def test_m2_cut_off_in_the_second_call_keeps_the_first() -> None:
    text = replies.rendered_reply("MiniMax-M2", M2_END)
    cut = text[: text.rindex("</invoke>")]
    replies.assert_stays_content(cut, M2, calls=1)
    events, _ = replies.extract(cut, M2)
    assert replies.content_of(events) == replies.CONTENT + cut[cut.rindex("</invoke>") + len("</invoke>") :]


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
    events, _ = replies.extract("Sure. " + bad, M2)
    assert replies.content_of(events) == "Sure. " + bad
    replies.assert_stays_content("Sure. " + bad, M2)


def test_m2_parallel_off_keeps_the_first() -> None:
    replies.assert_parallel_off_keeps_the_first(replies.rendered_reply("MiniMax-M2", M2_END), "minimax-m2")


def test_m2_text_after_an_unclosed_block_is_content() -> None:
    text = replies.rendered_reply("MiniMax-M2", M2_END).removesuffix(M2_END) + "Done."
    events, extractor = replies.extract(text, M2)
    assert (
        replies.calls_of(events) == replies.CALLS
        and replies.content_of(events) == replies.CONTENT + "Done."
        and extractor.malformed == 0
    )


@pytest.mark.parametrize("calls", ["minimax-m1", "auto"])
def test_m1_reads_its_templates_json_lines(calls: str) -> None:
    assert detect_tool_call_format(replies.template_text("MiniMax-M1")) == "minimax-m1"
    replies.assert_read_back(m1_reply(), ExtractOptions(calls=calls, tools=replies.TOOLS), content="")


def test_m1_cut_off_and_malformed_lines_stay_content() -> None:
    text = m1_reply()
    cut = text[: text.rindex("}}")]
    replies.assert_stays_content(cut, M1, calls=1)
    replies.assert_stays_content('<tool_calls>\n{"name": "get_weather", "arguments": 3}\n</tool_calls>', M1)
    replies.assert_stays_content("<tool_calls>\n</tool_calls>", M1)


@pytest.mark.parametrize("name", ["unsloth-Apriel-1.5", "Apriel-1.6-15b-Thinker-fixed"])
def test_apriel_writes_the_same_tag_with_a_json_list(name: str) -> None:
    assert detect_tool_call_format(replies.template_text(name)) == "apriel"
    text = replies.rendered_reply(name, "</tool_calls>")
    assert "<tool_calls>[" in text
    replies.assert_read_back(text, ExtractOptions(calls="apriel", tools=replies.TOOLS))
