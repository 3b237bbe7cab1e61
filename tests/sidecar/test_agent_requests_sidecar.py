"""Claude Code's and Codex's requests through ``toolpair proxy`` (no flags) in front of llama-server (issue 27).

Two engines, each behind a recording hop that keeps what it received:

- llama-server with one model (the bundled Gemma 270M), a context that holds Claude Code's 14 tools;
- llama-server's router (``--models-dir``: two models, each loaded on demand in its own child),
  at most one loaded at a time. The two are the bundled GGUF under two names.

The router knows its models by file name, so the names agents send (Claude Code's ``claude-*``
and its Haiku name for background work, Codex's own) are refused there unless toolpair maps
them: with none loaded the client gets the router's refusal with the names it knows and the flag
that maps them, in its API's own error shape; with one loaded, unknown names go to it; with
``--model-map`` they go where the map says. The tests of this module run in order: the router
starts with nothing loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.claude_code_fixture import TOOL_NAMES, claude_code_request
from tests.reliability.processes import Process
from tests.sidecar.llama_server import (
    MODEL_ALIAS,
    TINY_BODIES,
    SidecarStack,
    llama_server_binary,
    models_dir,
    skip_unless_built,
    start_llama_router,
    start_sidecar,
)
from tests.sidecar.test_llama_server_sidecar import Answer, send

BINARY = llama_server_binary()
pytestmark = skip_unless_built(BINARY)

FIXTURES = Path(__file__).parent.parent / "fixtures"
MODELS = ("gemma-a", "gemma-b")
CONTEXT = ("-c", "16384", "-np", "1")
"""Claude Code's request is about 13k tokens: one slot that holds it."""
OPUS, HAIKU, CODEX = "claude-opus-5-5", "claude-haiku-4-5-20251001", "local-model"
BODIES = TINY_BODIES


class Engine(SidecarStack):
    """One engine <- recording hop <- ``toolpair proxy`` with the given flags (each an entry of ``sidecars``)."""

    def __init__(self, tmp: Path, router: bool, **sidecars: tuple[str, ...]) -> None:
        assert BINARY is not None
        self.router, self.flags = router, sidecars
        self.sidecars: dict[str, Process] = {}
        super().__init__(BINARY, tmp, *CONTEXT)

    def start_engine(self, *engine_args: str) -> Process:
        if not self.router:
            return super().start_engine(*engine_args)
        models = models_dir(self.tmp / "models", *MODELS)
        return start_llama_router(self.binary, self.tmp, models, *engine_args, "--models-max", "1")

    def start_sidecars(self, upstream: str) -> None:
        self.sidecars = {name: self.keep(start_sidecar(self.tmp, upstream, *a)) for name, a in self.flags.items()}

    def url(self, sidecar: str = "plain") -> str:
        return self.sidecars[sidecar].url

    def received(self, path: str) -> Any:
        assert self.hop is not None
        return orjson.loads(self.hop.last(path).body)

    def log(self, sidecar: str = "plain") -> str:
        return self.sidecars[sidecar].log.read_text()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    running = Engine(
        tmp_path_factory.mktemp("router"), True, plain=(), mapped=("--model-map", f"claude-*haiku*={MODELS[1]}")
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    running = Engine(tmp_path_factory.mktemp("single"), False, plain=())
    yield running
    running.stop()


async def loaded(router: Engine) -> dict[str, str]:
    """The router's models and their status, read from it direct."""
    answer = await send(router.engine.url, "/v1/models", method="GET")
    return {model["id"]: model["status"]["value"] for model in answer.json()["data"]}


def codex_request(model: str) -> Any:
    """Codex 0.169's captured request: a namespace of agent tools, web_search, reasoning kept encrypted."""
    codex = orjson.loads((FIXTURES / "codex_0_169_request.json").read_bytes())
    return {**codex, "model": model, "stream": False, "max_output_tokens": 4}


def message_of(api: str, answer: Answer) -> str:
    """The error message, read where the API's own error shape keeps it."""
    data = answer.json()
    if api == "/v1/messages":
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error", data
    return str(data["error"]["message"])


# --- the router with nothing loaded: the refusal names what it knows


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", list(BODIES), ids=["chat", "anthropic", "responses"])
async def test_with_none_loaded_an_unknown_name_gets_the_routers_400_with_its_names_and_the_flag(
    router: Engine, path: str, stream: bool
) -> None:
    body = {**BODIES[path], "model": OPUS, "stream": stream}
    direct = await send(router.engine.url, path, body)
    assert direct.status == 400 and direct.json()["error"]["message"] == f"model '{OPUS}' not found", direct.body
    through = await send(router.url(), path, body)
    assert through.status == 400, through.body
    message = message_of(path, through)
    assert message.startswith(f"model '{OPUS}' not found (toolpair: the engine knows the models gemma-a, gemma-b;")
    assert "--model-map PATTERN=MODEL" in message and "--model-map 'claude-*=gemma-a'" in message
    assert router.received(path)["model"] == OPUS  # the router had its say
    assert set((await loaded(router)).values()) == {"unloaded"}


async def test_with_none_loaded_codexs_translated_request_is_refused_the_same_way(router: Engine) -> None:
    through = await send(router.url(), "/v1/responses", codex_request(CODEX))
    assert through.status == 400 and through.headers["X-Toolpair-Route"] == "translate; reason=tool_type"
    assert message_of("/v1/responses", through).startswith(f"model '{CODEX}' not found (toolpair: the engine knows")
    assert "model names:    as sent (the router lists 2: gemma-a, gemma-b; loaded: none;" in router.log()


# --- one loaded: it is the one model


async def test_once_one_is_loaded_claude_codes_and_codexs_names_go_to_it(router: Engine) -> None:
    known = await send(router.url(), "/v1/chat/completions", {**BODIES["/v1/chat/completions"], "model": "gemma-a"})
    assert known.status == 200, known.body  # a name the router knows loads that model
    assert await loaded(router) == {"gemma-a": "loaded", "gemma-b": "unloaded"}
    for path, model, stream in [
        ("/v1/messages", OPUS, False),
        ("/v1/messages", HAIKU, True),  # Claude Code's background name
        ("/v1/responses", CODEX, False),
        ("/v1/chat/completions", CODEX, True),
    ]:
        answer = await send(router.url(), path, {**BODIES[path], "model": model, "stream": stream})
        assert answer.status == 200, (path, model, answer.body)
        assert router.received(path)["model"] == "gemma-a"
        said = [e.get("model", e.get("message", e.get("response", {})).get("model")) for e in answer.events()]
        assert (said if stream else [answer.json()["model"]])[0] == model
    assert "model names:    one loaded of the router's 2: gemma-a" in router.log()
    assert await loaded(router) == {"gemma-a": "loaded", "gemma-b": "unloaded"}  # nothing else was loaded


async def test_codexs_captured_request_reaches_the_router_with_every_tool(router: Engine) -> None:
    through = await send(router.url(), "/v1/responses", codex_request(CODEX))
    assert through.status == 200, through.body
    assert through.headers["X-Toolpair-Route"] == "translate; reason=tool_type"
    assert through.json()["model"] == CODEX
    sent = router.received("/v1/chat/completions")
    assert sent["model"] == "gemma-a"
    assert {t["function"]["name"] for t in sent["tools"]} == CODEX_TOOLS


async def test_a_shape_llama_servers_converter_refuses_is_answered_on_the_router_too(router: Engine) -> None:
    said = {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}  # an item without type
    items = [{"role": "user", "content": "hi"}, said, {"role": "user", "content": "again"}]
    body = {"model": "gemma-a", "max_output_tokens": 4, "input": items}
    assert (await send(router.engine.url, "/v1/responses", body)).status == 400
    through = await send(router.url(), "/v1/responses", body)
    assert through.status == 200, through.body
    assert through.headers["X-Toolpair-Route"] == "translate; reason=assistant_item_without_type"


async def test_claude_codes_captured_request_reaches_the_router_with_every_tool(router: Engine) -> None:
    await claude_code_answers(router)


# --- the map: names go where it says, and the router loads that model


async def test_the_model_map_sends_claude_codes_background_name_where_it_says(router: Engine) -> None:
    body = {**BODIES["/v1/messages"], "model": HAIKU, "stream": True}
    answer = await send(router.url("mapped"), "/v1/messages", body)
    assert answer.status == 200, answer.body
    assert router.received("/v1/messages")["model"] == "gemma-b"
    assert answer.events()[0]["message"]["model"] == HAIKU
    assert (await loaded(router))["gemma-b"] == "loaded"
    assert f"model names:    claude-*haiku*={MODELS[1]} (first match; answers carry the client's name)" in router.log(
        "mapped"
    )


# --- one model: the same requests


async def test_claude_codes_captured_request_reaches_llama_server_with_every_tool(single: Engine) -> None:
    await claude_code_answers(single)
    assert single.received("/v1/messages")["model"] == MODEL_ALIAS


async def test_codexs_captured_request_reaches_llama_server_with_every_tool(single: Engine) -> None:
    through = await send(single.url(), "/v1/responses", codex_request("local-coder"))
    assert through.status == 200, through.body
    sent = single.received("/v1/chat/completions")
    assert sent["model"] == MODEL_ALIAS and {t["function"]["name"] for t in sent["tools"]} == CODEX_TOOLS


def codex_functions() -> set[str]:
    """Every function Codex's request offers, its namespace's named ``NAMESPACE__NAME`` as toolpair sends them.

    ``web_search`` is hosted (the engine cannot run it) and is named in a response header instead.
    """
    names = set()
    for tool in codex_request(CODEX)["tools"]:
        if tool["type"] == "function":
            names.add(tool["name"])
        elif tool["type"] == "namespace":
            names.update(f"{tool['name']}__{inner['name']}" for inner in tool["tools"])
    return names


CODEX_TOOLS = codex_functions()


async def claude_code_answers(stack: Engine) -> None:
    """Claude Code's 14-tool request, streamed as it streams, answers 200 with every tool reaching the engine."""
    body = {**claude_code_request(stream=True), "model": OPUS, "max_tokens": 4}
    headers = {"x-api-key": "any", "anthropic-version": "2023-06-01"}
    answer = await send(stack.url(), "/v1/messages?beta=true", body, headers)
    assert answer.status == 200, answer.body[:2000]
    events = answer.events()
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    assert not [e for e in events if e["type"] == "error"]
    assert events[0]["message"]["model"] == OPUS
    sent = stack.received("/v1/messages")
    assert [tool["name"] for tool in sent["tools"]] == TOOL_NAMES
    assert sent["chat_template_kwargs"]["enable_thinking"] is True  # adaptive thinking, as the template's switch
    assert answer.headers["X-Toolpair-Route"] == "native; reason=whole"
