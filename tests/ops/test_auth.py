"""API keys through the real HTTP path, on every route family, and which credentials reach the engine."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from proxy.config import ConfigError, Settings, load_settings
from proxy.engine.upstream import Upstream
from proxy.errors import Dialect, dialect_for_path
from proxy.ops.paths import HEALTH_PATH, METRICS_PATH, READY_PATH, STATUS_PATH
from tests.mock_engine import MockEngine
from tests.real_engine import RealEngine
from tests.support.http import send_and_read
from tests.support.proxies import MakeProxy, ProxyFactory, proxy_app

KEYS = ["tp-key-one", "tp-key-two"]
USER = {"role": "user", "content": "hi"}

# One request per route family, with a body each family's handler accepts.
FAMILIES: dict[str, tuple[str, bytes]] = {
    "chat": ("/v1/chat/completions", orjson.dumps({"model": "m", "messages": [USER]})),
    "chat-unprefixed": ("/chat/completions", orjson.dumps({"model": "m", "messages": [USER]})),
    "passthrough": ("/v1/models", b""),
    "anthropic": ("/v1/messages", orjson.dumps({"model": "m", "max_tokens": 4, "messages": [USER]})),
    "anthropic-count": ("/v1/messages/count_tokens", orjson.dumps({"model": "m", "messages": [USER]})),
    "responses": ("/v1/responses", orjson.dumps({"model": "m", "input": "hi"})),
}


def dialect_of(family: str) -> Dialect:
    return {"anthropic": Dialect.ANTHROPIC, "anthropic-count": Dialect.ANTHROPIC, "responses": Dialect.RESPONSES}.get(
        family, Dialect.OPENAI
    )


class Proxy:
    def __init__(self, url: str, engine: MockEngine) -> None:
        self.url = url
        self.engine = engine

    async def call(self, family: str, headers: dict[str, str]) -> tuple[int, Any, Any]:
        path, body = FAMILIES[family]
        method = "GET" if not body else "POST"
        return await send_and_read(self.url, body or None, path, method=method, headers=headers)


async def _proxy(engine: MockEngine, **settings: Any) -> AsyncIterator[Proxy]:
    async with ProxyFactory(engine.url).running(**settings) as (url, _):
        yield Proxy(url, engine)


@pytest.fixture
async def keyed(engine: MockEngine) -> AsyncIterator[Proxy]:
    async for proxy in _proxy(engine, api_keys=KEYS):
        yield proxy


def credential_headers(received: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in received.items() if k.lower() in ("authorization", "x-api-key")}


def assert_refused(family: str, status: int, body: Any, headers: Any, engine: MockEngine, message: str) -> None:
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert headers["X-Toolpair-Error"] == "invalid_api_key"
    if dialect_of(family) is Dialect.ANTHROPIC:
        assert body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
        assert message in body["error"]["message"]
    else:
        assert set(body) == {"error"}
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "invalid_api_key"
        assert message in body["error"]["message"]
    assert body["error"]["source"] == "toolpair"
    assert engine.received == []


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing API key"),
        ({"Authorization": "Bearer wrong"}, "invalid API key"),
        ({"x-api-key": "wrong"}, "invalid API key"),
        ({"Authorization": "Bearer "}, "missing API key"),
        ({"Authorization": f"Basic {KEYS[0]}"}, "missing API key"),  # right value, wrong scheme
        ({"Authorization": KEYS[0]}, "missing API key"),  # no scheme at all
        ({"x-api-key": KEYS[0][:-1]}, "invalid API key"),  # a prefix of a key
        ({"x-api-key": KEYS[0] + "x"}, "invalid API key"),
    ],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "empty-bearer", "basic", "no-scheme", "prefix", "longer"],
)
async def test_missing_or_wrong_key_is_a_401_in_the_family_shape(
    keyed: Proxy, family: str, headers: dict[str, str], message: str
) -> None:
    status, body, response_headers = await keyed.call(family, headers)
    assert_refused(family, status, body, response_headers, keyed.engine, message)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEYS[0]}"},
        {"authorization": f"bearer {KEYS[1]}"},
        {"x-api-key": KEYS[1]},
        {"X-Api-Key": KEYS[0], "Authorization": "Bearer not-ours"},  # the Anthropic SDK may send both
    ],
    ids=["bearer", "bearer-lowercase-second-key", "x-api-key", "both"],
)
async def test_right_key_passes_and_never_reaches_the_engine(
    keyed: Proxy, family: str, headers: dict[str, str]
) -> None:
    status, _, _ = await keyed.call(family, headers)
    assert status == 200
    # count_tokens without a template answers an estimate and needs no engine call.
    assert len(keyed.engine.received) == (0 if family == "anthropic-count" else 1)
    assert all(credential_headers(seen.headers) == {} for seen in keyed.engine.received)


@pytest.mark.parametrize("path", [HEALTH_PATH, READY_PATH, HEALTH_PATH + "?verbose=1", METRICS_PATH])
async def test_probes_and_metrics_are_open(keyed: Proxy, path: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(keyed.url + path) as response:
        assert response.status != 401


@pytest.mark.parametrize("path", ["/healthz", HEALTH_PATH + "/", "/v1" + HEALTH_PATH, STATUS_PATH])
async def test_paths_near_the_probes_are_guarded(keyed: Proxy, path: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(keyed.url + path) as response:
        assert response.status == 401
    assert keyed.engine.received == []


async def test_metrics_can_require_a_key(engine: MockEngine) -> None:
    async for proxy in _proxy(engine, api_keys=KEYS, metrics_require_key=True):
        async with aiohttp.ClientSession() as session:
            async with session.get(proxy.url + METRICS_PATH) as response:
                assert response.status == 401
            async with session.get(proxy.url + METRICS_PATH, headers={"x-api-key": KEYS[0]}) as response:
                assert response.status == 200
                assert "toolpair_requests_total" in await response.text()
            async with session.get(proxy.url + HEALTH_PATH) as response:
                assert response.status == 200


async def test_openai_sdk_sees_an_authentication_error(keyed: Proxy) -> None:
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as chat:
            await client.chat.completions.create(model="m", messages=[USER])  # type: ignore[list-item]
        with pytest.raises(openai.AuthenticationError) as responses:
            await client.responses.create(model="m", input="hi")
    for error in (chat.value, responses.value):
        assert error.status_code == 401 and error.code == "invalid_api_key"
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key=KEYS[0], max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=[USER])  # type: ignore[list-item]
    assert reply.choices[0].message.content == "ok"


@pytest.mark.parametrize("how", ["api_key", "auth_token"])
async def test_anthropic_sdk_sees_an_authentication_error_either_way(keyed: Proxy, how: str) -> None:
    async with anthropic.AsyncAnthropic(base_url=keyed.url, max_retries=0, **{how: "wrong"}) as client:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    async with anthropic.AsyncAnthropic(base_url=keyed.url, max_retries=0, **{how: KEYS[1]}) as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert raw.status_code == 200
    assert credential_headers(keyed.engine.last.headers) == {}


async def test_keys_from_file_and_environment(engine: MockEngine, tmp_path: Path, make_proxy: MakeProxy) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# rotated 2026-11\n\n  file-key  \n")
    settings = load_settings(
        {"upstream": engine.url}, {"TOOLPAIR_API_KEYS": "env-a, env-b", "TOOLPAIR_API_KEYS_FILE": str(key_file)}
    )
    assert settings.api_keys == ["env-a", "env-b"]
    assert "env-a" not in repr(settings)
    async with make_proxy.running(settings=settings) as (url, _), aiohttp.ClientSession() as session:
        for key, expected in [("env-a", 200), ("env-b", 200), ("file-key", 200), ("# rotated 2026-11", 401)]:
            async with session.get(url + "/v1/models", headers={"x-api-key": key}) as response:
                assert response.status == expected, key


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read"), ("\n# only a comment\n", "holds no key")])
def test_unusable_key_file_stops_start_up(tmp_path: Path, content: str | None, message: str) -> None:
    key_file = tmp_path / "keys"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(ConfigError, match=message):
        proxy_app(Settings(upstream="http://127.0.0.1:9", api_keys_file=str(key_file)))


def test_empty_key_in_the_list_is_refused() -> None:
    with pytest.raises(ConfigError, match="must not be empty"):
        proxy_app(Settings(upstream="http://127.0.0.1:9", api_keys=["ok", " "]))


# -- which credentials reach the engine


async def headers_seen_by_engine(engine: MockEngine, client_headers: dict[str, str], **settings: Any) -> dict[str, str]:
    async for proxy in _proxy(engine, **settings):
        for family in ("chat", "passthrough"):
            status, _, _ = await proxy.call(family, client_headers)
            assert status == 200
        first, second = engine.received[-2:]
        assert credential_headers(first.headers) == credential_headers(second.headers)
        return credential_headers(second.headers)
    raise AssertionError("not reached")


async def test_without_keys_of_its_own_client_credentials_pass_through(engine: MockEngine) -> None:
    sent = {"Authorization": "Bearer client", "x-api-key": "client-x"}
    assert await headers_seen_by_engine(engine, sent) == {"authorization": "Bearer client", "x-api-key": "client-x"}


async def test_upstream_api_key_replaces_client_credentials(engine: MockEngine) -> None:
    sent = {"Authorization": f"Bearer {KEYS[0]}", "x-api-key": KEYS[0]}
    seen = await headers_seen_by_engine(engine, sent, api_keys=KEYS, upstream_api_key="engine-key")
    assert seen == {"authorization": "Bearer engine-key"}


async def test_upstream_api_key_replaces_them_without_keys_of_its_own_too(engine: MockEngine) -> None:
    seen = await headers_seen_by_engine(engine, {"x-api-key": "client"}, upstream_api_key="engine-key")
    assert seen == {"authorization": "Bearer engine-key"}


async def test_with_keys_and_no_upstream_key_nothing_is_forwarded(engine: MockEngine) -> None:
    assert await headers_seen_by_engine(engine, {"Authorization": f"Bearer {KEYS[1]}"}, api_keys=KEYS) == {}


async def test_real_engine_key_handling(real_engine: RealEngine, make_proxy_to: MakeProxy) -> None:
    """The real llama-cpp-python server requires its own key: it answers only when toolpair sends it."""
    chat: Any = {"model": "gemma", "messages": [USER], "max_tokens": 1}
    keyed = {"api_keys": KEYS, "upstream_api_key": real_engine.api_key}
    async with make_proxy_to.running(upstream=real_engine.url, **keyed) as (url, _):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[0], max_retries=0) as client:
            reply = await client.chat.completions.create(**chat)
        assert reply.choices[0].message.content is not None
    # Without upstream_api_key the client's toolpair key is not forwarded, so the engine refuses.
    async with make_proxy_to.running(upstream=real_engine.url, api_keys=[real_engine.api_key]) as (url, _):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=real_engine.api_key, max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError) as caught:
                await client.chat.completions.create(**chat)
        assert "source" not in str(caught.value.body)  # the engine's refusal, not toolpair's


# -- path families and the exposure warning


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/v1/messages", Dialect.ANTHROPIC),
        ("/messages", Dialect.ANTHROPIC),
        ("/v1/messages/count_tokens", Dialect.ANTHROPIC),
        ("/v1/responses", Dialect.RESPONSES),
        ("/v1/responses/resp_1/input_items", Dialect.RESPONSES),
        ("/v1/chat/completions", Dialect.OPENAI),
        ("/v1/models", Dialect.OPENAI),
        ("/v1/messagesx", Dialect.OPENAI),
        ("/v2/messages", Dialect.OPENAI),
        ("/", Dialect.OPENAI),
        ("", Dialect.OPENAI),
        ("/v1", Dialect.OPENAI),
    ],
)
def test_dialect_for_path(path: str, dialect: Dialect) -> None:
    assert dialect_for_path(path) is dialect


@pytest.mark.parametrize(
    ("host", "keys", "warns"),
    [
        ("0.0.0.0", [], True),
        ("::", [], True),
        ("192.168.1.5", [], True),
        ("toolpair.internal", [], True),
        ("0.0.0.0", KEYS, False),
        ("127.0.0.1", [], False),
        ("127.0.0.2", [], False),
        ("::1", [], False),
        ("localhost", [], False),
    ],
)
async def test_exposure_warning_at_start_up(
    engine: MockEngine, make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture, host: str, keys: list[str], warns: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="toolpair")
    async with make_proxy.running(host=host, api_keys=keys):
        pass
    warnings = [r.getMessage() for r in caplog.records if "beyond loopback" in r.getMessage()]
    assert len(warnings) == (1 if warns else 0)
    if warns:
        assert host in warnings[0] and "api_keys" in warnings[0]


@pytest.mark.parametrize(
    ("api_key", "forward", "expected"),
    [
        (None, True, {"authorization": "Bearer client", "x-api-key": "client-x"}),
        (None, False, {}),
        ("engine-key", True, {"authorization": "Bearer engine-key"}),
        ("engine-key", False, {"authorization": "Bearer engine-key"}),
    ],
)
async def test_upstream_credential_policy_outside_any_request(
    engine: MockEngine, api_key: str | None, forward: bool, expected: dict[str, str]
) -> None:
    """The Upstream applies it on its own, e.g. for the managed engine's health polls."""
    upstream = Upstream(engine.url, api_key=api_key, forward_credentials=forward)
    await upstream.start()
    try:
        sent = {"Authorization": "Bearer client", "X-Api-Key": "client-x", "X-Other": "kept"}
        async with upstream.open("GET", "/v1/models", sent, None):
            pass
    finally:
        await upstream.close()
    assert credential_headers(engine.last.headers) == expected
    assert engine.last.headers["X-Other"] == "kept"


def test_a_sidecar_with_an_engine_key_but_no_keys_of_its_own_refuses_to_start() -> None:
    # It would let every client, with a wrong key or none, use a key-protected engine with toolpair's key.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPAIR_")}
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "proxy", "--upstream", "http://127.0.0.1:9"],
        env={**env, "TOOLPAIR_UPSTREAM_API_KEY": "engine-secret"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "upstream_api_key (TOOLPAIR_UPSTREAM_API_KEY) is set but toolpair checks no keys of its own" in run.stderr
    assert "engine-secret" not in run.stderr + run.stdout
