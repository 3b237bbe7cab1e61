"""The ``/v1/chat/completions`` handler.

Plan (:func:`proxy.dialects.chat.request.plan_engine_request`: validate, order, adapt), then one of two paths:

- nothing in the reply to rewrite, or an engine error: the byte relay (:func:`proxy.http.relay.relay`),
  the fast path, with byte-level checks that an engine fault never passes as success;
- tool calls, reasoning or usage to add: the engine client decodes the reply into chunk dicts
  (:meth:`proxy.engine.client.EngineCall.decoded`), and :class:`ChatStream` encodes them again,
  through the one streaming handler.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from aiohttp import web

from proxy._types import Body
from proxy.dialects.chat.request import plan_engine_request
from proxy.dialects.chat.stream import ChatStream
from proxy.engine.model_names import ModelPlan, restore_chunk, restore_model
from proxy.engine.upstream import forwardable_headers
from proxy.errors import Dialect
from proxy.http.body import read_body
from proxy.http.keys import ENGINE_CLIENT, SETTINGS
from proxy.http.relay import relay
from proxy.http.routing import note_model
from proxy.http.streaming import stream_reply
from proxy.ops.trace import trace_of

__all__ = ["chat_completions"]

log = logging.getLogger("toolpair")

# Request headers that never go upstream from an API route: we may rewrite the
# response, so it must come back uncompressed.
_API_DROP = ("accept-encoding",)
# Headers that no longer describe the body once it is rewritten.
_REWRITE_DROP = ("content-length", "content-encoding")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings = app[SETTINGS]
    client = app[ENGINE_CLIENT]
    plan = plan_engine_request(await read_body(request, settings.max_body_bytes), client.setup, client.model_names)
    trace_of(request).order("chat", plan.order)
    if plan.adapted:
        log.debug("chat: adapted for %s: %s", client.setup.profile.kind, ", ".join(plan.adapted))
    note_model("chat", plan.model)
    headers = forwardable_headers(request.headers, _API_DROP)
    async with (
        client.admitted(request, plan.data) as call,
        call.open("POST", request.path_qs, headers, plan.body) as response,
    ):
        if plan.reply is None or response.status >= 400:

            async def diagnose() -> None:
                await call.diagnose(plan.data, headers)

            return await relay(
                request,
                call,
                response,
                Dialect.OPENAI,
                raw=False,
                completions=True,
                on_empty=diagnose,
                model=plan.model,
            )
        out_headers = forwardable_headers(response.headers, _REWRITE_DROP)
        if response.content_type != "text/event-stream":
            body, _ = await call.reply(response, plan.reply)
            body = restore_model(body, plan.model)
            return web.Response(status=response.status, reason=response.reason, headers=out_headers, body=body)
        chunks = call.decoded(response, plan.reply, plan.data, headers)
        if plan.model.changed:
            chunks = _named(chunks, plan.model)
        return await stream_reply(request, chunks, ChatStream(), headers=out_headers, engine_pings=True)


async def _named(chunks: AsyncGenerator[Body | None, None], model: ModelPlan) -> AsyncGenerator[Body | None, None]:
    """The decoded chunks naming the client's model (the engine got another name)."""
    async with aclosing(chunks):
        async for chunk in chunks:
            yield restore_chunk(chunk, model)
