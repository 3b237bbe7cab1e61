"""Model names through ``toolpair proxy`` in front of a real llama-server (issue 27 item 3).

llama-server serves the bundled model as ``m`` and answers under that name whatever it was asked.
Clients ask for their own names (Claude Code ``claude-*``, Codex ``local-model``): toolpair with no
flags sends them as llama-server's only model, ``--model-map`` as its entries say, and the answers
name what the client asked for. A recording hop keeps what llama-server received.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tests.sidecar.llama_server import (
    MODEL_ALIAS,
    NEEDS_LLAMA_SERVER,
    TINY_BODIES,
    SidecarStack,
    module_stack,
    start_sidecar,
)

pytestmark = NEEDS_LLAMA_SERVER

BODIES = TINY_BODIES


class Stack(SidecarStack):
    """llama-server <- recording hop <- toolpair proxy, once with no flags and once with ``--model-map``."""

    def start_sidecars(self, upstream: str) -> None:
        self.plain = self.keep(start_sidecar(self.tmp, upstream))
        self.mapped = self.keep(start_sidecar(self.tmp, upstream, "--model-map", "claude-*haiku*=m"))


stack = module_stack(Stack, "model-names")


async def send(url: str, body: Any) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, data=orjson.dumps(body)) as response:
        return response.status, await response.read()


def answer_names(raw: bytes, stream: bool) -> list[str]:
    """The ``model`` of the answer, or of every streamed event that names one (nested ones included)."""
    docs = [orjson.loads(raw)] if not stream else [
        orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]  # fmt: skip
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("model"), str):
                found.append(value["model"])
            for inner in value.values():
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(docs)
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", list(BODIES), ids=["chat", "anthropic", "responses"])
async def test_a_name_llama_server_does_not_know_goes_to_its_one_model_and_comes_back_as_asked(
    stack: Stack, path: str, stream: bool
) -> None:
    assert stack.hop is not None
    body = {**BODIES[path], "model": "claude-opus-4-5", "stream": stream}
    direct_status, direct = await send(stack.engine.url + path, body)
    assert direct_status == 200 and set(answer_names(direct, stream)) == {MODEL_ALIAS}  # its own name
    status, raw = await send(stack.plain.url + path, body)
    assert status == 200, raw
    assert orjson.loads(stack.hop.last(path).body) == {**body, "model": MODEL_ALIAS}  # the name, nothing else
    names = answer_names(raw, stream)
    assert names and set(names) == {"claude-opus-4-5"}, raw


async def test_a_name_it_knows_reaches_it_as_the_clients_bytes(stack: Stack) -> None:
    assert stack.hop is not None
    raw = orjson.dumps({**BODIES["/v1/messages"], "model": MODEL_ALIAS}).replace(b",", b", ")
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.plain.url + "/v1/messages", data=raw) as response,
    ):
        assert response.status == 200
        assert (await response.json())["model"] == MODEL_ALIAS
    assert stack.hop.last("/v1/messages").body == raw


async def test_the_model_map_decides_and_the_banner_says_so(stack: Stack) -> None:
    assert stack.hop is not None
    body = {**BODIES["/v1/messages"], "model": "claude-haiku-4-5-20251001", "stream": True}
    status, raw = await send(stack.mapped.url + "/v1/messages", body)
    assert status == 200, raw
    assert orjson.loads(stack.hop.last("/v1/messages").body)["model"] == MODEL_ALIAS
    assert set(answer_names(raw, True)) == {"claude-haiku-4-5-20251001"}
    # with a map, a name it does not match goes as sent: llama-server's single model takes any name
    codex = {**BODIES["/v1/responses"], "model": "local-model"}
    status, raw = await send(stack.mapped.url + "/v1/responses", codex)
    assert status == 200 and orjson.loads(stack.hop.last("/v1/responses").body)["model"] == "local-model"
    log = stack.mapped.log.read_text()
    assert "model names:    claude-*haiku*=m (first match; answers carry the client's name)" in log
    assert "model names:    one model: m (names the engine does not know go to it)" in stack.plain.log.read_text()
