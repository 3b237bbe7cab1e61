# ruff: noqa: RUF001  # the fullwidth bar is how DeepSeek's tokenizer spells its tokens
"""``toolpair serve`` reading a family's own call format back, through the real engine.

The bundled model cannot write gpt-oss's or DeepSeek's calls by itself, so a GBNF ``grammar`` in
the request forces it to write exactly the text that family's template renders (gpt-oss,
DeepSeek V3.1, Kimi K2) for two parallel
calls; the family's template is serve's ``--chat-template-file``, so serve detects the format from
it as it would for the real model. What comes back must be the two calls, with no markup left in
the content, Chat stream and not. (Anthropic Messages cannot be forced this way: its translation
to Chat does not carry ``grammar`` to the engine.)
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from engine_launcher.template_check import TOOL
from tests.engine.test_toolcalls_deepseek import V31, v31_reply
from tests.engine.test_toolcalls_harmony import GPT_OSS, gpt_oss_reply
from tests.support.serve import client, start_serve
from tests.support.template_replies import rendered_reply, template_text

KIMI_K2 = "Kimi-K2-Instruct"
FAMILIES = {
    GPT_OSS: ("<|startoftext|>", "<|return|>", gpt_oss_reply),
    V31: ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", v31_reply),
    # Kimi-K2-Instruct's template changes its own lists: it renders only in toolpair's sandbox
    KIMI_K2: ("[BOS]", "<|im_end|>", lambda: rendered_reply(KIMI_K2, "<|im_end|>")),
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
