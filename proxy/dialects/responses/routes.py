"""The ``/v1/responses`` routes: thin handlers around :mod:`proxy.dialects.responses.request` and ``stream``.

Native mode (an engine that serves the Responses API itself, such as llama-server)
forwards the request after putting tool outputs into call order. Translate mode serves
it through the engine's Chat Completions, answering as the Responses API does, with the
bounded store (in memory, or shared in Redis) behind ``previous_response_id``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import web

from proxy._types import Body
from proxy.config import ApiMode, Settings
from proxy.dialects.chat.request import decode_body
from proxy.dialects.responses.request import (
    ResponsesPlan,
    plan_native_request,
    previous_response_id,
    translate_request,
)
from proxy.dialects.responses.store import StoredResponse, StoredResponses, create_response_store
from proxy.dialects.responses.stream import ResponsesFrames, ResponsesStream, chat_to_response
from proxy.engine.adapt import refuse_responses_logprobs
from proxy.engine.model_names import ModelPlan, with_model
from proxy.engine.route import plan_route
from proxy.engine.upstream import CREDENTIAL_HEADERS, forwardable_headers
from proxy.errors import Dialect, StoreUnavailableError
from proxy.http.body import read_body
from proxy.http.keys import ENGINE_CLIENT, SETTINGS
from proxy.http.relay import relay
from proxy.http.routing import note_model, note_route
from proxy.http.streaming import stream_reply
from proxy.ops.trace import trace_of

__all__ = ["RESPONSES_PATHS", "RESPONSES_STORE", "register_responses_routes", "responses_mode"]

log = logging.getLogger("toolpair")

RESPONSES_STORE: web.AppKey[StoredResponses] = web.AppKey("responses_store")
_DROPPED_SEEN: web.AppKey[set[str]] = web.AppKey("responses_dropped_seen")
RESPONSES_PATHS = ("/v1/responses", "/responses")
_DROPPED_HEADER = "X-Toolpair-Dropped-Tools"
_STORE_HEADER = "X-Toolpair-Store"  # "failed": answered, but the store lost it (see _keep)
_ENGINE_HEADERS = CREDENTIAL_HEADERS  # what a translated request takes from the client (its engine key)


def responses_mode(settings: Settings) -> ApiMode:
    """``native`` or ``translate``: from the setting, or from the engine kind when it is ``auto``.

    >>> responses_mode(Settings(responses_mode="auto")).value
    'translate'
    """
    return settings.responses_mode.resolve(settings.engine_kind)


def register_responses_routes(app: web.Application) -> None:
    """Add the Responses routes for this app's mode; call before the catch-all route.

    ``native`` named serves nothing but its POST (the rest goes to the engine as it is); otherwise
    each POST takes the route its plan gives (:func:`proxy.engine.route.plan_route`: native when
    the engine found now takes it whole, else translated), so the store is there for the
    translated ones.
    """
    settings = app[SETTINGS]
    if settings.responses_mode is ApiMode.NATIVE:
        for path in RESPONSES_PATHS:
            app.router.add_post(path, native_response)
        return
    app[RESPONSES_STORE] = create_response_store(settings)
    app.cleanup_ctx.append(_store_lifetime)
    app[_DROPPED_SEEN] = set()
    for path in RESPONSES_PATHS:
        app.router.add_post(path, planned_response)
        app.router.add_get(path + "/{response_id}", get_response)
        app.router.add_delete(path + "/{response_id}", delete_response)


async def planned_response(request: web.Request) -> web.StreamResponse:
    """Native or translated, as this request's plan says."""
    settings = request.app[SETTINGS]
    raw = await read_body(request, settings.max_body_bytes)
    profile = request.app[ENGINE_CLIENT].setup.profile
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None  # either route answers it with a 400
    kind_mode = ApiMode.AUTO.resolve(profile.kind)
    plan = plan_route(RESPONSES_PATHS[0], data, settings.responses_mode, kind_mode, profile)
    note_route(request, "responses", plan)
    return await (native_response if plan.mode is ApiMode.NATIVE else create_response)(request)


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    store = app[RESPONSES_STORE]
    await store.start()
    yield
    await store.close()


async def native_response(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    client = request.app[ENGINE_CLIENT]
    raw = await read_body(request, settings.max_body_bytes)
    plan = plan_native_request(raw, thinking_switch=client.setup.profile.template_kwargs, names=client.model_names)
    trace_of(request).order("responses", plan.report)
    note_model("responses", plan.model)
    headers = forwardable_headers(request.headers, ("accept-encoding",))
    async with (
        request.app[ENGINE_CLIENT].admitted(request, model=plan.model) as call,
        call.open("POST", request.path_qs, headers, plan.body) as response,
    ):
        return await relay(request, call, response, Dialect.RESPONSES, raw=False)


# Tool types are client text that ends up in a response header and a log line:
# only short plain names are shown as they are, and only so many.
_TOOL_TYPE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_DROPPED_HEADER_MAX = 1024
_DROPPED_SEEN_MAX = 256


def _shown(kinds: Sequence[str]) -> list[str]:
    """Dropped tool types as the header and the log may show them, each once.

    >>> _shown(["web_search", "x\\r\\nSet-Cookie: a=1", "web_search", "y" * 65])
    ['web_search', '(invalid)']
    """
    return list(dict.fromkeys(kind if _TOOL_TYPE.fullmatch(kind) else "(invalid)" for kind in kinds))


def _dropped(request: web.Request, plan: ResponsesPlan) -> dict[str, str]:
    """Hosted tools the engine was not offered: logged once per tool type, named in a header each time."""
    if not plan.dropped_tools:
        return {}
    names = _shown(plan.dropped_tools)
    seen = request.app[_DROPPED_SEEN]
    fresh = [kind for kind in names if kind not in seen][: max(0, _DROPPED_SEEN_MAX - len(seen))]
    if fresh:
        seen.update(fresh)
        log.info("responses: hosted tools not offered to the engine (it cannot run them): %s", ", ".join(fresh))
    value = ",".join(names)
    if len(value) > _DROPPED_HEADER_MAX:
        value = value[: value.rfind(",", 0, _DROPPED_HEADER_MAX)] + ",..."
    return {_DROPPED_HEADER: value}


async def _keep(
    request: web.Request, plan: ResponsesPlan, response: dict[str, Any], size: int, parent: StoredResponse | None
) -> bool:
    """Store a response that was asked to be stored; False when the store failed.

    The store was reachable before the engine was asked (``ready``), so this fails only when
    it went away during the generation. The response is delivered all the same: the work is
    done, and a stream may already have sent it. A later ``previous_response_id`` naming it gets
    503 while the store is down, 404 after.
    """
    if not plan.store:
        return True
    items = [*plan.items, *response["output"]]
    try:
        await request.app[RESPONSES_STORE].put(response["id"], items, response, size=size, previous=parent)
    except StoreUnavailableError as exc:
        log.warning("responses: %s was answered but not stored: %s", response["id"], exc.message)
        return False
    return True


async def create_response(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    store = request.app[RESPONSES_STORE]
    raw = await read_body(request, settings.max_body_bytes)
    data = decode_body(raw)
    refuse_responses_logprobs(data, request.app[ENGINE_CLIENT].setup.profile)
    previous = previous_response_id(data)
    parent = await store.get(previous, previous=True) if previous else None
    plan = translate_request(
        data, parent.items if parent else None, sees_images=request.app[ENGINE_CLIENT].setup.sees_images
    )
    model = request.app[ENGINE_CLIENT].model_names.plan(data)  # the answer echoes the client's name anyway
    note_model("responses", model)
    plan = dataclasses.replace(plan, chat=with_model(plan.chat, model))
    if plan.store and parent is None:
        await store.ready()  # a store that is down refuses now, before the engine works for nothing
    trace_of(request).order("responses", plan.report)
    headers = _dropped(request, plan)
    engine_headers = {k: v for k, v in request.headers.items() if k.lower() in _ENGINE_HEADERS}
    response_id, created_at = "resp_" + uuid.uuid4().hex, int(time.time())
    if plan.stream:
        frames = ResponsesFrames(ResponsesStream(plan, response_id, created_at))

        async def keep() -> None:  # before response.completed goes out, so the client finds it stored
            answer = frames.stream.response
            await _keep(request, plan, answer, len(raw) + len(orjson.dumps(answer)), parent)

        return await stream_reply(
            request, _chunks(request, plan, model, engine_headers), frames, headers=headers, before_finish=keep
        )
    async with request.app[ENGINE_CLIENT].admitted(request, plan.chat, model=model) as call:
        completion = await call.completion(plan.chat, engine_headers)
    response = chat_to_response(completion, plan, response_id, created_at)
    body = orjson.dumps(response)
    if not await _keep(request, plan, response, len(raw) + len(body), parent):
        headers[_STORE_HEADER] = "failed"
    return web.Response(body=body, content_type="application/json", headers=headers)


async def _chunks(
    request: web.Request, plan: ResponsesPlan, model: ModelPlan, engine_headers: dict[str, str]
) -> AsyncGenerator[Body | None, None]:
    async with (
        request.app[ENGINE_CLIENT].admitted(request, plan.chat, model=model) as call,
        # Usage asked for, so an engine that streams none gets it counted (the final response reports it).
        aclosing(call.stream({**plan.chat, "stream_options": {"include_usage": True}}, engine_headers)) as chunks,
    ):
        async for chunk in chunks:
            yield chunk


async def get_response(request: web.Request) -> web.StreamResponse:
    entry = await request.app[RESPONSES_STORE].get(request.match_info["response_id"])
    return web.Response(body=orjson.dumps(entry.response), content_type="application/json")


async def delete_response(request: web.Request) -> web.StreamResponse:
    store = request.app[RESPONSES_STORE]
    response_id = request.match_info["response_id"]
    if not await store.delete(response_id):
        await store.get(response_id)  # not stored: the 404 says why
    body = {"id": response_id, "object": "response.deleted", "deleted": True}
    return web.Response(body=orjson.dumps(body), content_type="application/json")
