"""Relay an engine reply that toolpair rewrites: tool calls and reasoning lifted out, usage added.

Used instead of the byte relay when the plan (:mod:`proxy.engine.plan`) says
the reply needs work. A JSON reply is read whole and rewritten. A stream goes
through three sync stages, each fed as bytes arrive: :class:`EventDecoder`
(bytes to events), :class:`ChunkExtractor` (chunk dicts to chunk dicts), and
the encoder; every write is awaited inside the read loop, so a slow client
slows the engine down instead of filling memory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import aiohttp
import orjson
from aiohttp import web

from proxy._types import Body
from proxy.engine.plan import EnginePlan, EngineSetup, ReplyPlan
from proxy.engine.replies import decode_chunk, read_json_object
from proxy.engine.stream_usage import count_usage, usage_chunk
from proxy.engine.toolcalls import ChunkExtractor, IdSource, extract_completion, random_call_id
from proxy.engine.upstream import Upstream, forwardable_headers
from proxy.errors import Dialect, UpstreamError, error_event
from proxy.ops.trace import note_toolcalls
from proxy.sse import EventDecoder

__all__ = ["relay_rewritten"]

log = logging.getLogger("toolpair")

# Headers that no longer describe the body once it is rewritten.
_REWRITE_DROP = ("content-length", "content-encoding")
_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keepalive\n\n"


def _frame(chunk: Body) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class StreamRewriter:
    """Engine SSE bytes in, rewritten SSE frames out (sync, no I/O).

    After ``[DONE]``, ``done`` is set and nothing more is read; the caller adds
    the usage chunk it may owe and the ``[DONE]`` frame itself.
    """

    def __init__(self, plan: ReplyPlan, source: str, ids: IdSource = random_call_id) -> None:
        self.extractor = ChunkExtractor(plan.extract, ids, keep_text=plan.usage, note=note_toolcalls)
        self._source = source
        self._decoder = EventDecoder()
        self.done = False

    def feed(self, raw: bytes) -> list[bytes]:
        frames: list[bytes] = []
        events = self._decoder.feed(raw)
        if not events and raw:
            # Bytes came (a ping, part of a frame) but nothing goes out yet: say so, so a
            # client's read timeout sees the engine is alive (as the engine's own pings do).
            frames.append(_KEEPALIVE)
        for event in events:
            if self.done:
                break
            if event.data == "[DONE]":
                frames.extend(_frame(c) for c in self.extractor.finish())
                self.done = True
                break
            chunk = decode_chunk(event.data, self._source)
            if "error" in chunk and "choices" not in chunk:
                frames.append(b"data: " + event.data.encode() + b"\n\n")  # the engine's own in-band error
                continue
            frames.extend(_frame(c) for c in self.extractor.feed(chunk))
        return frames

    def finish(self) -> list[bytes]:
        """End of input without ``[DONE]``: flush what the extractor holds.

        Input that ends inside an event is a broken stream: an :class:`UpstreamError`.
        """
        cut = self._decoder.pending and not self.done
        self._decoder.finish()
        if cut:
            raise UpstreamError(f"upstream {self._source} ended its stream inside an event")
        if not self.done:
            # A Chat Completions stream ends with [DONE]. llama-cpp-python, for one, answers a
            # prompt longer than its context with an empty 200 stream and closes it.
            raise UpstreamError(
                f"upstream {self._source} ended its stream without [DONE] "
                "(llama-cpp-python does this when the prompt is longer than its context)"
            )
        return []


async def relay_rewritten(
    request: web.Request,
    upstream: Upstream,
    response: aiohttp.ClientResponse,
    plan: EnginePlan,
    setup: EngineSetup,
    headers: Mapping[str, str],
) -> web.StreamResponse:
    """Carry out ``plan.reply`` on a successful engine response (the caller relays errors as they are)."""
    assert plan.reply is not None
    out_headers = forwardable_headers(response.headers, _REWRITE_DROP)
    if response.content_type != "text/event-stream":
        raw, data = await read_json_object(upstream, response)
        extracted = extract_completion(data, plan.reply.extract, note=note_toolcalls)
        body = raw if extracted is data else orjson.dumps(extracted)  # nothing found: the engine's own bytes
        return web.Response(status=response.status, reason=response.reason, headers=out_headers, body=body)
    out_headers["Cache-Control"] = "no-cache"
    out_headers["X-Accel-Buffering"] = "no"
    out = web.StreamResponse(status=response.status, reason=response.reason, headers=out_headers)
    rewriter = StreamRewriter(plan.reply, upstream.base_url)
    try:
        await out.prepare(request)
        complete = False
        try:
            async for raw in upstream.chunks(response):
                frames = rewriter.feed(raw)
                if frames:
                    await out.write(b"".join(frames))
                if rewriter.done:
                    break
            complete = True
        finally:
            if complete:
                response.release()
            else:
                response.close()
        frames = rewriter.finish()
        if rewriter.done:
            frames.extend(await _usage_frames(request, upstream, plan, setup, headers, rewriter))
            frames.append(_DONE)
        if frames:
            await out.write(b"".join(frames))
    except UpstreamError as exc:
        log.warning("%s %s: %s", request.method, request.path, exc.message)
        await out.write(error_event(exc, Dialect.OPENAI))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("%s %s: client went away", request.method, request.path)
        return out
    await out.write_eof()
    return out


async def _usage_frames(
    request: web.Request,
    upstream: Upstream,
    plan: EnginePlan,
    setup: EngineSetup,
    headers: Mapping[str, str],
    rewriter: StreamRewriter,
) -> list[bytes]:
    assert plan.reply is not None
    extractor = rewriter.extractor
    count_path = setup.profile.token_count_path
    if not plan.reply.usage or extractor.usage_seen or count_path is None:
        return []
    usage = await count_usage(upstream, request.path_qs, count_path, headers, plan.data, "".join(extractor.text))
    return [] if usage is None else [_frame(usage_chunk(extractor.head, usage))]
