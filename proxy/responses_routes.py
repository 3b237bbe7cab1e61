"""The ``/v1/responses`` routes: thin handlers around :mod:`proxy.responses`.

Native mode (an engine that serves the Responses API itself, such as llama-server)
forwards the request after putting tool outputs into call order. Translate mode serves
it through the engine's Chat Completions, answering as the Responses API does, with the
bounded store (in memory, or shared in Redis) behind ``previous_response_id``.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.adapt import refuse_responses_logprobs
from proxy.chat import decode_body
from proxy.chat_upstream import chat_completion, chat_stream
from proxy.config import ConfigError, Settings
from proxy.errors import Dialect, StoreUnavailableError, ToolpairError, UpstreamError
from proxy.privacy import log_message
from proxy.queueing import conversation_key
from proxy.responses import (
    ResponsesPlan,
    ResponsesStream,
    chat_to_response,
    encode,
    plan_native_request,
    previous_response_id,
    translate_request,
)
from proxy.responses_store import StoredResponse, StoredResponses, create_response_store
from proxy.server import ADMISSION, ENGINE, SETTINGS, UPSTREAM, error_response, read_body, relay
from proxy.trace import trace_of
from proxy.upstream import forwardable_headers

__all__ = ["RESPONSES_STORE", "register_responses_routes", "responses_mode"]

log = logging.getLogger("toolpair")

RESPONSES_STORE: web.AppKey[StoredResponses] = web.AppKey("responses_store")
_DROPPED_SEEN: web.AppKey[set[str]] = web.AppKey("responses_dropped_seen")
_PATHS = ("/v1/responses", "/responses")
_DROPPED_HEADER = "X-Toolpair-Dropped-Tools"
_STORE_HEADER = "X-Toolpair-Store"  # "failed": answered, but the store lost it (see _keep)
_ENGINE_HEADERS = ("authorization",)  # what a translated request takes from the client (an engine key)


def responses_mode(settings: Settings) -> str:
    """``native`` or ``translate``: from the setting, or from the engine kind when it is ``auto``.

    >>> responses_mode(Settings(responses_mode="auto"))
    'translate'
    """
    mode = settings.responses_mode
    if mode == "auto":
        kind = settings.engine_kind
        return "native" if kind == "llama-server" else "translate"
    if mode not in ("native", "translate"):
        raise ConfigError(f"responses_mode: expected auto, native or translate, got {mode!r}")
    return mode


def register_responses_routes(app: web.Application) -> None:
    """Add the Responses routes for this app's mode; call before the catch-all route."""
    settings = app[SETTINGS]
    if responses_mode(settings) == "native":
        for path in _PATHS:
            app.router.add_post(path, native_response)
        return
    app[RESPONSES_STORE] = create_response_store(settings)
    app.cleanup_ctx.append(_store_lifetime)
    app[_DROPPED_SEEN] = set()
    for path in _PATHS:
        app.router.add_post(path, create_response)
        app.router.add_get(path + "/{response_id}", get_response)
        app.router.add_delete(path + "/{response_id}", delete_response)


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    store = app[RESPONSES_STORE]
    await store.start()
    yield
    await store.close()


async def native_response(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    upstream = request.app[UPSTREAM]
    try:
        plan = plan_native_request(await read_body(request, settings.max_body_bytes))
        trace_of(request).order("responses", plan.report)
        headers = forwardable_headers(request.headers, ("accept-encoding",))
        async with request.app[ADMISSION](request, None) as target:
            upstream = upstream.at(target)
            response = await upstream.open("POST", request.path_qs, headers, plan.body)
            return await relay(request, upstream, response, Dialect.RESPONSES, raw=False)
    except ToolpairError as exc:
        return error_response(exc, Dialect.RESPONSES)


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
    done, and a stream has already sent it. A later ``previous_response_id`` naming it gets
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
    try:
        raw = await read_body(request, settings.max_body_bytes)
        data = decode_body(raw)
        refuse_responses_logprobs(data, request.app[ENGINE].profile)
        previous = previous_response_id(data)
        parent = await store.get(previous, previous=True) if previous else None
        plan = translate_request(data, parent.items if parent else None)
        if plan.store and parent is None:
            await store.ready()  # a store that is down refuses now, before the engine works for nothing
    except ToolpairError as exc:
        return error_response(exc, Dialect.RESPONSES)
    trace_of(request).order("responses", plan.report)
    headers = _dropped(request, plan)
    engine_headers = {k: v for k, v in request.headers.items() if k.lower() in _ENGINE_HEADERS}
    response_id, created_at = "resp_" + uuid.uuid4().hex, int(time.time())
    if plan.stream:
        return await _stream(request, plan, response_id, created_at, headers, engine_headers, len(raw), parent)
    try:
        async with request.app[ADMISSION](request, conversation_key(plan.chat.get("messages"))) as target:
            completion = await chat_completion(request.app[UPSTREAM].at(target), plan.chat, engine_headers)
        response = chat_to_response(completion, plan, response_id, created_at)
    except ToolpairError as exc:
        return error_response(exc, Dialect.RESPONSES)
    body = orjson.dumps(response)
    if not await _keep(request, plan, response, len(raw) + len(body), parent):
        headers[_STORE_HEADER] = "failed"
    return web.Response(body=body, content_type="application/json", headers=headers)


async def _stream(
    request: web.Request,
    plan: ResponsesPlan,
    response_id: str,
    created_at: int,
    headers: dict[str, str],
    engine_headers: dict[str, str],
    size: int,
    parent: StoredResponse | None,
) -> web.StreamResponse:
    """Relay the engine's chat stream as Responses events.

    The first chunk is awaited before anything is sent, so an engine that refuses the
    request still gets the client a plain HTTP error; after that, failures end the
    stream with ``response.failed``.
    """
    transducer = ResponsesStream(plan, response_id, created_at)
    out = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers}
    )
    try:
        async with (
            request.app[ADMISSION](request, conversation_key(plan.chat.get("messages"))) as target,
            aclosing(chat_stream(request.app[UPSTREAM].at(target), plan.chat, engine_headers)) as chunks,
        ):
            try:
                first = await anext(chunks, None)
            except ToolpairError as exc:
                return error_response(exc, Dialect.RESPONSES)
            await out.prepare(request)
            try:
                await out.write(encode(transducer.start()))
                if first is not None:
                    await out.write(encode(transducer.feed(first)))
                async for chunk in chunks:
                    await out.write(encode(transducer.feed(chunk)))
                final = encode(transducer.finish())
                # Stored before the client sees response.completed: its next turn may reach
                # another replica at once, and must find this response there.
                await _keep(request, plan, transducer.response, size + len(orjson.dumps(transducer.response)), parent)
                await out.write(final)
            except UpstreamError as exc:
                log.warning("%s %s: %s", request.method, request.path, log_message(exc))
                await out.write(encode(transducer.fail(exc)))
    except ToolpairError as exc:  # refused before the stream began (e.g. the engine is not ready)
        if out.prepared:
            raise  # pragma: no cover - only UpstreamError can come after prepare, and it is handled above
        return error_response(exc, Dialect.RESPONSES)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("%s %s: client went away", request.method, request.path)
        return out
    await out.write_eof()
    return out


async def get_response(request: web.Request) -> web.StreamResponse:
    try:
        entry = await request.app[RESPONSES_STORE].get(request.match_info["response_id"])
    except ToolpairError as exc:
        return error_response(exc, Dialect.RESPONSES)
    return web.Response(body=orjson.dumps(entry.response), content_type="application/json")


async def delete_response(request: web.Request) -> web.StreamResponse:
    store = request.app[RESPONSES_STORE]
    response_id = request.match_info["response_id"]
    try:
        if not await store.delete(response_id):
            await store.get(response_id)  # not stored: the 404 says why
    except ToolpairError as exc:
        return error_response(exc, Dialect.RESPONSES)
    body = {"id": response_id, "object": "response.deleted", "deleted": True}
    return web.Response(body=orjson.dumps(body), content_type="application/json")
