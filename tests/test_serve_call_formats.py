# ruff: noqa: RUF001  # the fullwidth bar is how DeepSeek's tokenizer spells its tokens
"""``toolpair serve`` reading a family's own call format back, through the real engine.

The bundled model cannot write gpt-oss's or DeepSeek's calls by itself, so a GBNF ``grammar`` in
the request forces it to write exactly the text that family's template renders for two parallel
calls (gpt-oss, DeepSeek V3.1, Kimi K2; GLM 4.7, MiniMax M2 and Gemma 4 from the turn
``check-template`` has the template write). The family's template is serve's
``--chat-template-file``, so serve detects the format from it as it would for the real model.
What comes back must be the two calls, with no markup left in the content, Chat stream and not.
(Anthropic Messages cannot be forced this way: its translation to Chat does not carry
``grammar`` to the engine.)
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from engine_launcher.templates.template_check import (
    TOOL,
    WRITTEN_TOOLS,
    WrittenTurn,
    template_from_file_text,
    written_turn,
)
from tests.engine.test_toolcalls_deepseek import V31, v31_reply
from tests.engine.test_toolcalls_harmony import GPT_OSS, gpt_oss_reply
from tests.support.serve import client, start_serve
from tests.support.template_replies import reply_after_prompt, template_text

KIMI_K2 = "Kimi-K2-Instruct"
FAMILIES = {
    GPT_OSS: ("<|startoftext|>", "<|return|>", gpt_oss_reply),
    V31: ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", v31_reply),
    # Kimi-K2-Instruct's template changes its own lists: it renders only in toolpair's sandbox
    KIMI_K2: ("[BOS]", "<|im_end|>", lambda: reply_after_prompt(KIMI_K2, "<|im_end|>")),
}
CITIES = [{"city": "Paris"}, {"city": "Tokyo"}]
QUESTION = [{"role": "user", "content": "What is the temperature in Paris and Tokyo?"}]


def exactly(text: str) -> str:
    """A GBNF grammar whose only sentence is ``text``."""
    return "root ::= " + json.dumps(text, ensure_ascii=False)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    name: str = request.param
    bos, eos, reply = FAMILIES[name]
    tmp = tmp_path_factory.mktemp(name)
    config = tmp / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": template_text(name), "bos_token": bos, "eos_token": eos}))
    process, url, _, err = start_serve(tmp, "--ctx-size", "2048", "--chat-template-file", str(config))
    try:
        yield url, reply()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        assert "Traceback" not in err.read_text()


def forced(text: str) -> dict[str, Any]:
    return {"max_tokens": 600, "temperature": 0, "extra_body": {"grammar": exactly(text)}}


async def test_chat_returns_the_forced_calls_stream_and_not(family: tuple[str, str]) -> None:
    url, text = family
    async with client(url) as api:
        done = await api.chat.completions.create(model="m", messages=QUESTION, tools=[TOOL], **forced(text))  # type: ignore[call-overload]
        message = done.choices[0].message
        assert done.choices[0].finish_reason == "tool_calls", message
        assert [json.loads(c.function.arguments) for c in message.tool_calls or []] == CITIES
        assert not message.content
        ids = [c.id for c in message.tool_calls or []]
        assert len(set(ids)) == 2

        chunks = await api.chat.completions.create(  # type: ignore[call-overload]
            model="m", messages=QUESTION, tools=[TOOL], stream=True, **forced(text)
        )
        content, arguments, finishes = "", {}, []
        async for chunk in chunks:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
            finishes.append(chunk.choices[0].finish_reason)
        assert [json.loads(arguments[i]) for i in sorted(arguments)] == CITIES
        assert not content
        assert "tool_calls" in finishes


# --- families whose written turn comes from the template itself (template_check.written_turn) -------------

WRITTEN = {
    # GLM 4.7 opens <think> in its prompt: the model's text starts by closing it.
    "GLM-4.7-Flash": ("[gMASK]<sop>", "<|user|>"),
    "MiniMax-M2": ("]~!b[", "[e~["),
    "google-gemma-4-31B-it-interleaved": ("<bos>", "<turn|>"),
}


@pytest.fixture(scope="module", params=list(WRITTEN))
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, WrittenTurn]]:
    name: str = request.param
    bos, eos = WRITTEN[name]
    turn = written_turn(template_from_file_text(template_text(name), name))
    assert turn is not None and len(turn.calls) == 2, name
    tmp = tmp_path_factory.mktemp(name)
    config = tmp / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": template_text(name), "bos_token": bos, "eos_token": eos}))
    process, url, _, err = start_serve(tmp, "--ctx-size", "2048", "--chat-template-file", str(config))
    try:
        yield url, turn
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        assert "Traceback" not in err.read_text()


async def test_glm_minimax_and_gemma4_calls_come_back_typed_stream_and_not(written: tuple[str, WrittenTurn]) -> None:
    """Values written as text (GLM's <arg_value>, MiniMax's <parameter>, Gemma 4's bare 9) come back typed."""
    url, turn = written
    expected = [(name, arguments) for name, arguments in turn.calls]
    async with client(url) as api:
        done = await api.chat.completions.create(  # type: ignore[call-overload]
            model="m", messages=QUESTION, tools=WRITTEN_TOOLS, **forced(turn.text)
        )
        message = done.choices[0].message
        assert done.choices[0].finish_reason == "tool_calls", message
        got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        assert got == expected
        assert not message.content
        chunks = await api.chat.completions.create(  # type: ignore[call-overload]
            model="m", messages=QUESTION, tools=WRITTEN_TOOLS, stream=True, **forced(turn.text)
        )
        content, names, arguments = "", {}, {}
        async for chunk in chunks:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    if call.function.name:
                        names[call.index] = call.function.name
                    arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    assert [(names[i], json.loads(arguments[i])) for i in sorted(arguments)] == expected
    assert not content
