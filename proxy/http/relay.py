"""The byte relay: an engine's answer passed to the client as it is, chunk by chunk, never buffered whole.

The fast path of the chat route (nothing to rewrite), the native Anthropic and Responses routes,
and every other path (:func:`passthrough`). For a Chat Completions answer (``completions=True``) a
few byte-level checks keep engine faults from passing as success, without parsing the stream: a
successful plain body must be a completion object, every event must carry JSON, the stream must
end with ``[DONE]``, and an error body that is not JSON becomes an error in the OpenAI shape.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from proxy.engine.adapt import refuse_completion_logprobs
from proxy.engine.client import EngineCall, decode_completion, engine_message
from proxy.engine.model_names import ModelPlan, restore_model
from proxy.engine.upstream import forwardable_headers
from proxy.errors import Dialect, UpstreamError, UpstreamStatusError, error_event
from proxy.http.body import read_body
from proxy.http.keys import ENGINE_CLIENT, SETTINGS
from proxy.sse import FrameSplitter

__all__ = ["passthrough", "relay"]

log = logging.getLogger("toolpair")

# Response headers that no longer describe the bytes we send once we relay them.
_RELAY_DROP = ("content-length", "content-encoding")
# A plain (not event-stream) response up to this size is read whole and sent in
# one write: fewer round trips through the event loop than a chunked relay.
_BUFFER_LIMIT = 1 << 20


async def relay(
    request: web.Request,
    call: EngineCall,
    response: aiohttp.ClientResponse,
    dialect: Dialect,
    *,
    raw: bool,
    completions: bool = False,
    on_empty: Callable[[], Awaitable[None]] | None = None,
    model: ModelPlan | None = None,
) -> web.StreamResponse:
    """Relay an engine response to the client.

    ``raw`` relays bytes untouched (content encoding and length included). Otherwise an event
    stream is relayed whole frames at a time, so a failure can be reported in-band without a
    half-written frame before it; the client's response starts with the first frame, so a stream
    that ends before it is a plain HTTP error (``on_empty`` may raise the engine's own).

    ``model``: the request's model plan; when the engine got another name than the client's, the
    answer names the client's again (:func:`~proxy.engine.model_names.restore_model`, on whole frames,
    or on a plain body read whole), else its bytes pass as they came.
    """
    rename = model if model is not None and model.changed and not raw else None
    headers = forwardable_headers(response.headers, () if raw else _RELAY_DROP)
    is_sse = response.content_type == "text/event-stream"
    length = response.content_length
    whole = (length is not None and length <= _BUFFER_LIMIT) or rename is not None
    if not is_sse and whole and request.method != "HEAD":
        body = await call.upstream.read(response)
        if completions:
            body = _check_completion(body, response.status, call.upstream.base_url)
        if rename is not None:
            body = restore_model(body, rename)
        return web.Response(status=response.status, reason=response.reason, headers=headers, body=body)
    if raw and length is not None:
        headers["Content-Length"] = str(length)
    if is_sse:
        headers["Cache-Control"] = "no-cache"
        headers["X-Accel-Buffering"] = "no"
    out = web.StreamResponse(status=response.status, reason=response.reason, headers=headers)
    splitter = FrameSplitter() if is_sse and not raw else None
    checks = _CompletionFrames(call.upstream.base_url) if completions and splitter is not None else None
    try:
        if splitter is None:
            await out.prepare(request)
        async for chunk in call.upstream.chunks(response):
            if splitter is None:
                await out.write(chunk)
                continue
            frames = splitter.feed_whole(chunk)  # the chunk's whole frames as one slice: no list, no join
            if frames:
                if checks is not None:
                    checks.feed(frames)
                if rename is not None:
                    frames = restore_model(frames, rename)
                if not out.prepared:
                    await out.prepare(request)
                await out.write(frames)
        if splitter is not None and splitter.pending.strip():
            raise UpstreamError(f"upstream {call.upstream.base_url} ended its stream inside an event")
        if not out.prepared:
            if on_empty is not None:
                await on_empty()
            raise UpstreamError(f"upstream {call.upstream.base_url} ended its stream without sending anything")
        if checks is not None:
            checks.finish()
    except UpstreamError as exc:
        if not out.prepared:
            raise
        log.warning("%s %s: %s", request.method, request.path, exc.message)
        if splitter is None:
            # A plain body cannot carry an error any more: cut the connection so
            # the client sees a truncated response rather than a short valid one.
            if request.transport is not None:
                request.transport.close()
            return out
        await out.write(error_event(exc, dialect))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        log.info("%s %s: client went away", request.method, request.path)
        return out
    await out.write_eof()
    return out


def _check_completion(body: bytes, status: int, source: str) -> bytes:
    """A Chat answer read whole: a success must be a completion, an error body must be JSON.

    A success goes out as the engine sent it, byte for byte, as a relayed stream does: a reply
    cut by ``max_tokens`` inside an end-of-turn marker keeps the marker's first characters.
    """
    if status < 400:
        decode_completion(body, source)
        return body
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise UpstreamStatusError(engine_message(body), status=status)
    return body


_DATA_OBJECT = b"data: {"


def _plain_chunks(frames: bytes) -> bool:
    """Whether every frame is one ``data: {...}`` line holding ``"choices"`` or ``"error"``: no cut, no copy.

    Without CR and with no LF inside a frame, each frame ends at its first LF, which an LF follows,
    exactly where :class:`~proxy.sse.FrameSplitter` cuts it.

    >>> _plain_chunks(b'data: {"choices":[]}\\n\\ndata: {"error":{}}\\n\\n'), _plain_chunks(b"data: [DONE]\\n\\n")
    (True, False)
    """
    if b"\r" in frames:
        return False
    start, size = 0, len(frames)
    while start < size:
        if not frames.startswith(_DATA_OBJECT, start):
            return False
        end = frames.find(b"\n", start)
        if end < 0 or not frames.startswith(b"\n\n", end):
            return False
        if frames.find(b'"choices"', start, end) < 0 and frames.find(b'"error"', start, end) < 0:
            return False
        start = end + 2
    return True


class _CompletionFrames:
    """Byte-level checks on a relayed Chat stream: JSON events, ``[DONE]`` at the end.

    The rule is per frame: a frame that starts with ``data:`` must carry ``[DONE]`` or an object
    holding ``"choices"`` or ``"error"``. :meth:`feed` takes the relay's slice of whole frames;
    the usual slice passes :func:`_plain_chunks` without a copy, and only the rest (``[DONE]``,
    comments, CRs, a faulty frame) is cut into frames and checked one by one.
    """

    def __init__(self, source: str) -> None:
        self._source = source
        self._done = False

    def feed(self, frames: bytes) -> None:
        if _plain_chunks(frames):
            return
        cut = FrameSplitter()
        each = cut.feed(frames)
        if cut.pending:  # a frame ending in a lone CR: a fresh splitter holds it back, waiting for an LF
            each.append(cut.pending)
        self._feed_frames(each)

    def _feed_frames(self, frames: list[bytes]) -> None:
        for frame in frames:
            if not frame.startswith(b"data:"):
                continue  # a comment (ping) or another field
            data = frame[5:].lstrip(b" ")
            if data.startswith(b"[DONE]"):
                self._done = True
            elif not data.startswith(b"{") or (b'"choices"' not in data and b'"error"' not in data):
                raise UpstreamError(f"upstream {self._source} sent an event that is not a completion chunk")

    def finish(self) -> None:
        if not self._done:
            raise UpstreamError(
                f"upstream {self._source} ended its stream without [DONE] "
                "(llama-cpp-python does this when the prompt is longer than its context)"
            )


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Forward any other route transparently: method, path, query, headers, body, status."""
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_body_bytes) if request.body_exists else None
    if request.method == "POST" and request.path in ("/v1/completions", "/completions"):
        refuse_completion_logprobs(body, request.app[ENGINE_CLIENT].setup.profile)
    headers = forwardable_headers(request.headers)
    async with (
        request.app[ENGINE_CLIENT].admitted(request) as call,
        call.open(request.method, request.path_qs, headers, body) as response,
    ):
        return await relay(request, call, response, Dialect.OPENAI, raw=True)
