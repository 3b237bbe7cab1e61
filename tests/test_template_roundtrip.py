"""Every real chat template's own tool calls, read back through ``toolpair proxy --chat-template-file``.

For each template in llama.cpp's ``models/templates`` (fetched from the pinned sdist, as the
check-template tests do) that renders a turn of tool calls, the template writes the text its model
was trained to write for two parallel calls (``template_check.written_turn``: the conversation
ending in that turn, minus the prompt up to the generation prompt, minus what closes the turn). The
mock engine answers with that text as llama-cpp-python does (calls left in the text), and toolpair,
configured from the template's file the way ``toolpair proxy --chat-template-file FILE
--engine-kind llama-cpp-python`` is, must return the same calls (names, and arguments as JSON
objects) with no content beside them: on Chat (plain and streamed), Anthropic Messages and Responses.

The templates toolpair does not read back today are :data:`UNREAD`, each with its model family. The
test is strict both ways: a template that starts being read back fails it until it leaves the table,
so the count only rises. The count per path is printed (``-s``) and recorded as a test property.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from bench import template_survey as survey
from engine_launcher.templates.template_check import (
    WRITTEN_ANSWER,
    WRITTEN_TOOLS,
    WrittenTurn,
    template_from_file_text,
    written_answer,
    written_turn,
)
from proxy import cli
from proxy.cli.proxy import load_proxy_settings, resolve_proxy_settings
from proxy.config import Settings
from tests.mock_engine import MockEngine, answers
from tests.support.proxies import MakeProxy

UNREAD = survey.NOT_READ_BACK
"""Templates whose calls toolpair does not read back today (on any path), and why (named in docs/templates.md)."""

QUESTION = "What is the weather in Paris, and the time in Tokyo?"

Calls = list[tuple[str, Any]]


@dataclass(frozen=True)
class Reply:
    """What a client got back: the calls (name, arguments as a JSON value) and the content's text."""

    calls: Calls
    content: str


async def chat(url: str) -> Reply:
    async with AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": QUESTION}],
            tools=WRITTEN_TOOLS,  # type: ignore[arg-type]
        )
    message = reply.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]  # type: ignore[union-attr]
    return Reply(calls, message.content or "")


async def chat_stream(url: str) -> Reply:
    client = AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    ask = [{"role": "user", "content": QUESTION}]
    request: dict[str, Any] = {"model": "m", "messages": ask, "tools": WRITTEN_TOOLS}
    async with client, client.chat.completions.stream(**request) as stream:
        async for _ in stream:
            pass
        reply = await stream.get_final_completion()
    message = reply.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return Reply(calls, message.content or "")


async def messages(url: str) -> Reply:
    tools = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
        for f in (t["function"] for t in WRITTEN_TOOLS)
    ]
    async with AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
        reply = await client.messages.create(
            model="m",
            max_tokens=512,
            messages=[{"role": "user", "content": QUESTION}],
            tools=tools,  # type: ignore[arg-type]
        )
    calls = [(b.name, b.input) for b in reply.content if b.type == "tool_use"]
    return Reply(calls, "".join(b.text for b in reply.content if b.type == "text"))


async def responses(url: str) -> Reply:
    tools = [{"type": "function", **t["function"]} for t in WRITTEN_TOOLS]
    async with AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        reply = await client.responses.create(model="m", input=QUESTION, tools=tools, store=False)  # type: ignore[arg-type]
    calls = [(i.name, json.loads(i.arguments)) for i in reply.output if i.type == "function_call"]
    return Reply(calls, reply.output_text)


PATHS: dict[str, Callable[[str], Awaitable[Reply]]] = {
    "chat": chat,
    "chat-stream": chat_stream,
    "messages": messages,
    "responses": responses,
}


@dataclass(frozen=True)
class Trip:
    """One template's turn of calls, and the settings ``toolpair proxy --chat-template-file`` takes from it."""

    name: str
    turn: WrittenTurn
    settings: Settings


def proxy_settings(upstream: str, template: Path, kind: str = "llama-cpp-python") -> Settings:
    """The settings of ``toolpair proxy --upstream URL --engine-kind KIND --chat-template-file FILE``."""
    args = cli.build_parser().parse_args(
        ["proxy", "--upstream", upstream, "--engine-kind", kind, "--chat-template-file", str(template)]
    )
    settings, _ = resolve_proxy_settings(load_proxy_settings(args))
    return settings


def trips(folder: Path, upstream: str) -> list[Trip]:
    found = []
    for path in sorted(folder.glob("*.jinja"), key=lambda p: p.name.lower()):
        turn = written_turn(template_from_file_text(path.read_text(encoding="utf-8"), path.name))
        if turn is not None:
            found.append(Trip(path.stem, turn, proxy_settings(upstream, path)))
    return found


def reads_back(trip: Trip, reply: Reply) -> bool:
    return reply.calls == [(name, arguments) for name, arguments in trip.turn.calls] and not reply.content


@pytest.mark.parametrize("path", PATHS)
async def test_each_template_s_own_calls_come_back_as_calls(
    templates: Path,
    engine: MockEngine,
    make_proxy: MakeProxy,
    path: str,
    record_property: Callable[[str, object], None],
) -> None:
    every = trips(templates, engine.url)
    assert len(every) >= 50, [t.name for t in every]  # the isolation of a turn still works
    proxies: dict[str, str] = {}
    unread: dict[str, Reply] = {}
    for trip in every:
        # Settings that differ only in the file they came from make the same proxy: one per family.
        shared = dataclasses.replace(trip.settings, chat_template=None)
        key = repr(shared)
        if key not in proxies:
            proxies[key] = await make_proxy(**{f.name: getattr(shared, f.name) for f in dataclasses.fields(shared)})
        engine.then(answers(trip.turn.text))
        reply = await PATHS[path](proxies[key])
        if not reads_back(trip, reply):
            unread[trip.name] = reply
    count = f"{path}: read back {len(every) - len(unread)} of {len(every)} templates that render calls"
    print(count)
    record_property("read_back", count)
    started = sorted(set(UNREAD) - set(unread))
    stopped = {name: unread[name] for name in sorted(set(unread) - set(UNREAD))}
    assert not started and not stopped, f"{count}; now read back, take off UNREAD: {started}; no longer: {stopped}"


async def chat_without_tools(url: str) -> Reply:
    async with AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}])
    message = reply.choices[0].message
    return Reply([(c.function.name, c.function.arguments) for c in message.tool_calls or []], message.content or "")  # type: ignore[union-attr]


WRAPPED_ANSWERS = {
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "<|END_OF_TURN_TOKEN|>",
    "Cohere2MoE": "<|END_OF_TURN_TOKEN|>",
    "upstage-Solar-Open-100B": "<|end|>",
    "Kimi-K3": "<|end_of_msg|>",
    "meetkai-functionary-medium-v3.2": "<|eot_id|>",
}
"""Templates whose model writes tokens around a plain answer, and the end-of-turn token its engine stops at."""


@pytest.mark.parametrize("name", WRAPPED_ANSWERS)
async def test_a_plain_answer_comes_back_without_its_familys_tokens(
    name: str, templates: Path, engine: MockEngine, make_proxy: MakeProxy
) -> None:
    written = written_answer(template_from_file_text((templates / f"{name}.jinja").read_text(encoding="utf-8")))
    assert written is not None
    answer, closing = written
    text = answer + closing[: closing.index(WRAPPED_ANSWERS[name])]
    assert text.strip() != WRITTEN_ANSWER  # tokens around it, which a client must not see
    settings = proxy_settings(engine.url, templates / f"{name}.jinja")
    urls = [await make_proxy(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)})]
    # auto, as a sidecar without the template, drops the tokens too; it cannot know a reasoning block the
    # prompt opened, nor Functionary's all\n, which is no token.
    if not settings.think_in_prompt and name != "meetkai-functionary-medium-v3.2":
        urls.append(await make_proxy(engine_kind="llama-cpp-python"))
    for url in urls:
        for path in (*PATHS.values(), chat_without_tools):
            engine.then(answers(text))
            assert await path(url) == Reply([], WRITTEN_ANSWER), (path.__name__, text, url)


async def test_without_a_template_auto_reads_llama3_bare_json_call(engine: MockEngine, make_proxy: MakeProxy) -> None:
    url = await make_proxy(engine_kind="llama-cpp-python")
    engine.then(answers('{"name": "get_weather", "parameters": {"city": "Paris"}}'))
    assert await chat(url) == Reply([("get_weather", {"city": "Paris"})], "")


def test_the_template_file_sets_the_format_for_a_text_engine_only(templates: Path) -> None:
    coder = templates / "Qwen3-Coder.jinja"
    assert proxy_settings("http://127.0.0.1:9", coder).tool_call_format == "qwen3-coder"
    assert proxy_settings("http://127.0.0.1:9", coder, "llama-server").tool_call_format == "auto"  # it parses calls


def test_an_unreadable_template_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.jinja"
    assert cli.main(["proxy", "--upstream", "http://127.0.0.1:9", "--chat-template-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"cannot read template {missing}" in err and "Traceback" not in err
