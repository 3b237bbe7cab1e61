"""A real model's chat template in serve's engine: tool-call arguments as objects, a generation prompt.

The pure core first (engine_launcher/tool_call_arguments.py), then ``toolpair serve`` on the bundled
model with Qwen3-Coder's own chat template as a file (``--chat-template-file``). That template walks
each call's arguments (``arguments|items``): llama-cpp-python alone hands it the client's JSON
string, fails, and every conversation with tool calls got a 500. Alone it also closes an empty
assistant turn where the model should answer; Anthropic's count_tokens, rendered by toolpair, then
no longer matched what the engine read.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic import AsyncAnthropic

from engine_launcher.models import DEFAULT_TEMPLATE
from engine_launcher.template_check import TOOL
from engine_launcher.tool_call_arguments import ParsedArguments, render_with_object_arguments, with_object_arguments
from tests.support.serve import client, start_serve
from tests.test_check_template import survey


def _call(call_id: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def test_only_json_object_strings_are_parsed_and_nothing_is_mutated() -> None:
    calls = [
        _call("a", '{"city": "Paris"}'),
        _call("b", "not json"),
        _call("c", "[1, 2]"),  # JSON, not an object
        _call("d", {"city": "Oslo"}),  # an object already
        _call("e", 7),
    ]
    sent = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    before = json.dumps(sent)
    parsed = with_object_arguments(sent)
    assert json.dumps(sent) == before and parsed is not sent
    assert parsed[0] is sent[0]  # a message without calls is the same object
    arguments = [c["function"]["arguments"] for c in parsed[1]["tool_calls"]]
    assert arguments[0] == {"city": "Paris"} and str(arguments[0]) == '{"city": "Paris"}'
    assert arguments[1:] == ["not json", "[1, 2]", {"city": "Oslo"}, 7]
    assert [c is o for c, o in zip(parsed[1]["tool_calls"], calls, strict=True)] == [False, True, True, True, True]
    plain = with_object_arguments(sent, printable=False)[1]["tool_calls"][0]["function"]["arguments"]
    assert type(plain) is dict and plain == {"city": "Paris"}
    nothing = [{"role": "assistant", "content": "x", "tool_calls": [_call("a", "{}x")]}]
    assert with_object_arguments(nothing) is nothing


def test_objects_first_and_the_clients_strings_where_a_template_fails_on_objects() -> None:
    sent = [{"role": "assistant", "tool_calls": [_call("a", '{"city":"Paris"}')]}]
    seen: list[Any] = []

    def wants_strings(messages: Any) -> str:
        arguments = messages[0]["tool_calls"][0]["function"]["arguments"]
        seen.append(type(arguments))
        return "name\n" + arguments  # functionary's way: str + dict raises TypeError

    assert render_with_object_arguments(wants_strings, sent) == 'name\n{"city":"Paris"}'
    assert seen == [ParsedArguments, str]

    def fails_either_way(messages: Any) -> str:
        raise ValueError(f"no {type(messages[0]['tool_calls'][0]['function']['arguments']).__name__}")

    with pytest.raises(ValueError, match="no str"):  # the error the engine gave before anything was parsed
        render_with_object_arguments(fails_either_way, sent)


# --- a real serve with a real model's template ----------------------------------------------


@pytest.fixture(scope="module")
def qwen3_coder_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("qwen3-coder-template")
    text = (Path(survey.fetch_templates()) / "Qwen3-Coder.jinja").read_text()
    config = tmp / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": text, "bos_token": "", "eos_token": "<|im_end|>"}))
    process, url, _, err = start_serve(tmp, "--ctx-size", "2048", "--chat-template-file", str(config))
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        assert "Traceback" not in err.read_text()


ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}
ANTHROPIC_HISTORY: list[Any] = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_p", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_o", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [  # in finish order
            {"type": "tool_result", "tool_use_id": "toolu_o", "content": "Oslo: -3C"},
            {"type": "tool_result", "tool_use_id": "toolu_p", "content": "Paris: 18C"},
        ],
    },
]


async def test_a_template_that_walks_the_arguments_serves_chat_tool_results(qwen3_coder_served: str) -> None:
    """Two calls of one tool, results in finish order: the main case, on a template that needs objects."""
    messages: list[Any] = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("call_paris", '{"city": "Paris"}'), _call("call_oslo", '{"city": "Oslo"}')],
        },
        {"role": "tool", "tool_call_id": "call_oslo", "content": "Oslo: -3C"},
        {"role": "tool", "tool_call_id": "call_paris", "content": "Paris: 18C"},
    ]
    async with client(qwen3_coder_served) as api:
        for stream in (False, True):
            if stream:
                chunks = await api.chat.completions.create(
                    model="m", messages=messages, tools=[TOOL], max_tokens=8, temperature=0, stream=True
                )
                finishes = [c.choices[0].finish_reason async for c in chunks if c.choices]
                assert finishes[-1] in ("stop", "length", "tool_calls")
            else:
                done = await api.chat.completions.create(
                    model="m", messages=messages, tools=[TOOL], max_tokens=8, temperature=0
                )
                assert done.choices[0].finish_reason in ("stop", "length", "tool_calls")
                assert done.usage is not None and done.usage.prompt_tokens > 100  # the template's tool prompt


async def test_a_template_that_walks_the_arguments_serves_anthropic_tool_results(qwen3_coder_served: str) -> None:
    async with AsyncAnthropic(base_url=qwen3_coder_served, api_key="any", max_retries=0, timeout=120) as api:
        answer = await asyncio.wait_for(
            api.messages.create(
                model="m",
                max_tokens=8,
                tools=[ANTHROPIC_TOOL],
                messages=ANTHROPIC_HISTORY,
            ),
            120,
        )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens > 100


async def test_a_template_that_walks_the_arguments_serves_responses_tool_outputs(qwen3_coder_served: str) -> None:
    tool = {"type": "function", **TOOL["function"]}
    history: list[Any] = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {"type": "function_call", "call_id": "call_p", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_o", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_o", "output": "Oslo: -3C"},
        {"type": "function_call_output", "call_id": "call_p", "output": "Paris: 18C"},
    ]
    async with client(qwen3_coder_served) as api:
        answer = await api.responses.create(
            model="m", input=history, tools=[tool], max_output_tokens=8, temperature=0, store=False
        )
    assert answer.status in ("completed", "incomplete")
    assert answer.usage is not None and answer.usage.input_tokens > 100


async def test_count_tokens_is_what_the_engine_read(qwen3_coder_served: str) -> None:
    """toolpair renders count_tokens' prompt itself; the engine's usage says what it rendered and read."""
    requests: list[list[Any]] = [[{"role": "user", "content": "Hi"}], ANTHROPIC_HISTORY]
    async with AsyncAnthropic(base_url=qwen3_coder_served, api_key="any", max_retries=0, timeout=120) as api:
        for messages in requests:
            counted = await api.messages.count_tokens(model="m", tools=[ANTHROPIC_TOOL], messages=messages)
            read = await api.messages.create(model="m", max_tokens=1, tools=[ANTHROPIC_TOOL], messages=messages)
            assert counted.input_tokens == read.usage.input_tokens, messages


def test_a_template_file_without_special_tokens_still_answers(tmp_path: Path) -> None:
    """No EOS text in the file: the engine must not stop every answer on an empty stop string."""
    chatml = json.loads(DEFAULT_TEMPLATE.read_text())["chat_template"]
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": chatml}))
    process, url, _, _ = start_serve(tmp_path, "--ctx-size", "2048", "--chat-template-file", str(config))
    try:

        async def ask() -> Any:
            async with client(url) as api:
                return await api.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=8, temperature=0
                )

        answer = asyncio.run(ask())
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert answer.choices[0].message.content
