"""A real model's chat template in serve's engine: tool-call arguments as objects, a generation prompt.

The pure core first (engine_launcher/templates/tool_call_arguments.py), then ``toolpair serve`` on the bundled
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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from anthropic import AsyncAnthropic

from engine_launcher.builder.models import DEFAULT_TEMPLATE
from engine_launcher.templates.template_check import TOOL
from engine_launcher.templates.tool_call_arguments import (
    ParsedArguments,
    render_with_object_arguments,
    with_object_arguments,
)
from tests.support.conversations import parallel_weather
from tests.support.serve import client, start_serve
from tests.support.survey import survey


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


@contextmanager
def served_with_template(tmp: Path, name: str, *, bos: str, eos: str) -> Iterator[str]:
    """``toolpair serve`` with llama.cpp's template ``name`` as its ``--chat-template-file``; stopped at the end."""
    text = (Path(survey.fetch_templates()) / f"{name}.jinja").read_text()
    config = tmp / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": text, "bos_token": bos, "eos_token": eos}))
    process, url, _, err = start_serve(tmp, "--ctx-size", "2048", "--chat-template-file", str(config))
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        assert "Traceback" not in err.read_text()


def served_with(name: str, tokens: tuple[str, str], why: str) -> Any:
    """A module fixture (named by the variable that holds it): the URL of :func:`served_with_template` for template
    ``name`` with its (BOS, EOS) ``tokens``; ``why`` is the fixture's docstring."""

    def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
        bos, eos = tokens
        with served_with_template(tmp_path_factory.mktemp("template"), name, bos=bos, eos=eos) as url:
            yield url

    served.__doc__ = why
    return pytest.fixture(scope="module")(served)


qwen3_coder_served = served_with("Qwen3-Coder", ("", "<|im_end|>"), "Qwen3-Coder's template walks the arguments.")


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
    messages = parallel_weather("Paris: 18C", "Oslo: -3C", compact=False)
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


# --- a template that demands its own tool-call IDs ------------------------------------------


mistral_nemo_served = served_with(
    "mistralai-Mistral-Nemo-Instruct-2407",
    ("<s>", "</s>"),
    "Mistral Nemo's template refuses any tool-call ID that is not nine alphanumerics.",
)


async def test_mistral_nemo_answers_a_claude_code_history_with_toolu_ids(mistral_nemo_served: str) -> None:
    """The IDs are mapped for the render only; count_tokens renders the same prompt the engine read."""
    async with AsyncAnthropic(base_url=mistral_nemo_served, api_key="any", max_retries=0, timeout=120) as api:
        answer = await asyncio.wait_for(
            api.messages.create(model="m", max_tokens=8, tools=[ANTHROPIC_TOOL], messages=ANTHROPIC_HISTORY), 120
        )
        counted = await api.messages.count_tokens(model="m", tools=[ANTHROPIC_TOOL], messages=ANTHROPIC_HISTORY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens > 50 and counted.input_tokens == answer.usage.input_tokens


async def test_mistral_nemo_answers_chat_tool_results_with_openai_ids(mistral_nemo_served: str) -> None:
    messages = parallel_weather("Paris: 18C", "Oslo: -3C", compact=False)
    async with client(mistral_nemo_served) as api:
        done = await api.chat.completions.create(model="m", messages=messages, tools=[TOOL], max_tokens=8)
    assert done.choices[0].finish_reason in ("stop", "length", "tool_calls")


# --- a template whose prompt opens the reasoning block ----------------------------------------


def exact_text_grammar(text: str) -> str:
    """A GBNF grammar under which the engine can write only ``text``: the model's output, forced."""
    return "root ::= " + json.dumps(text)


qwen35_served = served_with(
    "Qwen3.5-4B",
    ("", "<|im_end|>"),
    "Qwen3.5's prompt block holds both an opened and a closed <think>; with thinking on it opens.",
)


QWEN35_REPLY = "Paris is warmer.\n</think>\n\nIt is sunny in Paris."
QWEN35_REASONING = "Paris is warmer.\n"  # up to </think>, as the model wrote it


async def test_qwen35_reasoning_opened_by_its_prompt_goes_to_the_reasoning_field(qwen35_served: str) -> None:
    forced = {"grammar": exact_text_grammar(QWEN35_REPLY)}
    messages: list[Any] = [{"role": "user", "content": "Where is it warmer, Paris or Oslo?"}]
    async with client(qwen35_served) as api:
        done = await api.chat.completions.create(model="m", messages=messages, max_tokens=40, extra_body=forced)
        chunks = await api.chat.completions.create(
            model="m", messages=messages, max_tokens=40, extra_body=forced, stream=True
        )
        streamed = {"reasoning": "", "content": ""}
        async for chunk in chunks:
            for choice in chunk.choices:
                streamed["reasoning"] += (choice.delta.model_extra or {}).get("reasoning_content") or ""
                streamed["content"] += choice.delta.content or ""
    said = done.choices[0].message
    assert [(said.model_extra or {}).get("reasoning_content"), said.content] == [
        QWEN35_REASONING,
        "It is sunny in Paris.",
    ]
    assert streamed == {"reasoning": QWEN35_REASONING, "content": "It is sunny in Paris."}
    # Thinking off: the template closes the block in the prompt, so the reply is all content.
    unthinking = {"grammar": exact_text_grammar("It is sunny."), "chat_template_kwargs": {"enable_thinking": False}}
    async with client(qwen35_served) as api:
        off = await api.chat.completions.create(model="m", messages=messages, max_tokens=20, extra_body=unthinking)
    assert [(off.choices[0].message.model_extra or {}).get("reasoning_content"), off.choices[0].message.content] == [
        None,
        "It is sunny.",
    ]
    # Anthropic has no grammar field: the model writes what it likes, and it starts inside <think>.
    async with AsyncAnthropic(base_url=qwen35_served, api_key="any", max_retries=0, timeout=120) as anthropic:
        answer = await anthropic.messages.create(model="m", max_tokens=24, messages=messages)
    assert answer.content and answer.content[0].type == "thinking"
    assert not any("think>" in getattr(block, "text", "") for block in answer.content)


# --- the thinking switch reaches a template that reads it -------------------------------------


qwen3_served = served_with(
    "Qwen-Qwen3-0.6B",
    ("", "<|im_end|>"),
    "serve with Qwen3's own template: ``enable_thinking`` false adds an empty think block to the prompt.",
)


async def test_anthropic_thinking_turns_the_templates_switch_and_count_tokens_follows(qwen3_served: str) -> None:
    ask: list[Any] = [{"role": "user", "content": "Is 7 prime?"}]
    read: dict[str, int] = {}
    async with AsyncAnthropic(base_url=qwen3_served, api_key="any", max_retries=0, timeout=120) as api:
        for kind in ("adaptive", "disabled"):
            thinking: Any = {"type": kind}
            answer = await api.messages.create(model="m", max_tokens=1, messages=ask, thinking=thinking)
            counted = await api.messages.count_tokens(model="m", messages=ask, thinking=thinking)
            read[kind] = answer.usage.input_tokens
            assert counted.input_tokens == read[kind], kind
    assert read["disabled"] > read["adaptive"]  # "<think>\n\n</think>\n\n": the engine saw enable_thinking false


async def test_chat_reasoning_effort_none_turns_thinking_off_in_serve(qwen3_served: str) -> None:
    read: dict[str, int] = {}
    async with client(qwen3_served) as api:
        for effort in ("high", "none"):
            answer = await api.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "Is 7 prime?"}],
                max_tokens=1,
                extra_body={"reasoning_effort": effort},
            )
            assert answer.usage is not None
            read[effort] = answer.usage.prompt_tokens
    assert read["none"] > read["high"]
