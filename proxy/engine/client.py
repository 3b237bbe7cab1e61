"""The engine client: the one place toolpair enters admission and talks Chat Completions to the engine.

Every route reaches the engine through :class:`EngineClient`. ``client.admitted(request)`` is the
only place the app's admission is entered; inside it, :class:`EngineCall` opens engine requests
(``call.open``: a response owned by a context manager) and, for the routes that need dicts rather
than bytes, turns the engine's answer into Chat Completions dicts:

- :meth:`EngineCall.completion`: one ``chat.completion`` object;
- :meth:`EngineCall.stream`: ``chat.completion.chunk`` objects one by one.

Whatever the engine needs happens here, once, for all three APIs: the request is adapted to the
engine (:mod:`proxy.engine.adapt`); tool calls and reasoning are lifted out of the reply's text
(:mod:`proxy.engine.toolcalls`); usage is counted when a stream asks for it and the engine sends
none; and every engine fault becomes a :class:`~proxy.errors.UpstreamError`:

- an error status (JSON, HTML or empty body): :class:`~proxy.errors.UpstreamStatusError` with the
  engine's own message and status;
- a body that is not a JSON object with ``choices``, an event that is not JSON, a stream cut inside
  an event, a stream without ``[DONE]``: :class:`~proxy.errors.UpstreamError` (502);
- an empty stream, or one that breaks before its first chunk: the engine is asked once more
  without streaming, to learn its error. llama-cpp-python answers a streamed prompt longer than its
  context with an empty 200 stream and reports the overflow only that way.

:class:`ChunkDecoder` is the sync core of a stream (bytes in, chunk dicts out); the chat route uses
it through :meth:`EngineCall.chunks` on a response it opened itself.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy._types import Body
from proxy.engine.adapt import adapt_chat_request
from proxy.engine.model_names import ModelNames
from proxy.engine.plan import EngineSetup, ReplyPlan, reply_plan
from proxy.engine.queueing import EnginePool, conversation_key
from proxy.engine.stop_sequences import EndMarkerGuard, strip_end_marker_prefix
from proxy.engine.toolcalls import ChunkExtractor, IdSource, extract_completion, random_call_id
from proxy.engine.upstream import EngineTarget, Upstream
from proxy.engine.watch import EngineWatch
from proxy.errors import UpstreamError, UpstreamStatusError, UpstreamTimeoutError
from proxy.ops.trace import note_toolcalls
from proxy.order import OrderReport, order_chat_results
from proxy.sse import EventDecoder

__all__ = [
    "CHAT_PATH",
    "Admission",
    "ChunkDecoder",
    "EngineCall",
    "EngineClient",
    "admit_all",
    "engine_message",
    "prepare_chat_body",
    "strip_cut_marker",
    "usage_chunk",
]

log = logging.getLogger("toolpair")

CHAT_PATH = "/v1/chat/completions"
_JSON_HEADERS = {"Content-Type": "application/json"}
_NO_DONE = "ended its stream without [DONE] (llama-cpp-python does this when the prompt is longer than its context)"

Admission = Callable[[web.Request, str | None], AbstractAsyncContextManager[EngineTarget | None]]
"""Held around each engine call, response included: where a queue or an engine-readiness wait
goes. It raises a ToolpairError to refuse a request. Called with the request's conversation key
(:func:`~proxy.engine.queueing.conversation_key`), it gives the engine to send to (one of
``serve --parallel``'s), or None for the app's upstream."""


class _Straight:
    """Admission that waits for nothing and holds nothing: no state, so one instance serves every request."""

    __slots__ = ()

    async def __aenter__(self) -> EngineTarget | None:
        return None

    async def __aexit__(self, *exc_info: object) -> None:
        return None


_STRAIGHT = _Straight()


def admit_all(
    request: web.Request, conversation: str | None = None
) -> AbstractAsyncContextManager[EngineTarget | None]:
    """The sidecar default: every request goes straight to the engine."""
    return _STRAIGHT


def prepare_chat_body(body: Body) -> tuple[Body, OrderReport]:
    """Ordering for a translated body, which has no client bytes to preserve."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body, OrderReport()
    ordered, report = order_chat_results(messages)
    return (body if ordered is messages else {**body, "messages": ordered}), report


def engine_message(raw: bytes) -> str:
    """The message of an engine's error body: JSON (OpenAI, FastAPI ``detail``), or its text.

    >>> engine_message(b'{"error": {"message": "too long"}}'), engine_message(b"<html>500</html>")
    ('too long', '<html>500</html>')
    >>> engine_message(b"")
    'no body'
    """
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")[:500] or "no body"
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return raw.decode("utf-8", "replace")[:500]


def usage_chunk(head: Body, usage: Body) -> Body:
    """The final chunk of an OpenAI stream with ``include_usage``: no choices, just usage."""
    return {**head, "choices": [], "usage": usage}


def decode_object(raw: bytes, source: str) -> Body:
    """A whole engine reply as the JSON object it must be."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamError(f"upstream {source} answered with invalid JSON") from None
    if not isinstance(data, dict):
        raise UpstreamError(f"upstream {source} answered with a non-object")
    return data


def decode_completion(raw: bytes, source: str) -> Body:
    """A whole ``chat.completion``; anything else (no ``choices`` list) is an UpstreamError.

    >>> decode_completion(b'{"choices": []}', "e")
    {'choices': []}
    """
    data = decode_object(raw, source)
    if not isinstance(data.get("choices"), list):
        raise UpstreamError(f"upstream {source} answered with something that is not a chat completion")
    return data


class ChunkDecoder:
    """Engine SSE bytes in, chunk dicts out (sync, no I/O); feeding any split of the bytes gives the same chunks.

    ``feed`` returns the chunks a piece of the body completes, already through tool-call and
    reasoning extraction when a plan asks for it. After ``[DONE]``, ``done`` is set and the rest
    is ignored. ``finish`` is the end of the body: it flushes what extraction holds, and raises
    an UpstreamError for a body that ended inside an event or without ``[DONE]``. An event that is
    not a JSON object, and an error event, raise at once.

    >>> d = ChunkDecoder(None, "e")
    >>> d.feed(b'data: {"choices": []}\\n\\ndata: [DO'), d.feed(b"NE]\\n\\n"), d.done
    ([{'choices': []}], [], True)
    """

    def __init__(self, plan: ReplyPlan | None, source: str, ids: IdSource = random_call_id) -> None:
        self.extractor = (
            ChunkExtractor(plan.extract, ids, keep_text=plan.usage, note=note_toolcalls) if plan is not None else None
        )
        self._source = source
        self._decoder = EventDecoder()
        self.done = False
        self.received = False
        """Whether any chunk came from the engine."""
        self._fault: UpstreamError | None = None
        self._markers = EndMarkerGuard()

    def feed(self, raw: bytes) -> list[Body]:
        """The chunks ``raw`` completes; a fault after some of them is held until :meth:`check`."""
        self.check()
        chunks: list[Body] = []
        if self.done:
            return chunks
        for event in self._decoder.feed(raw):
            if event.data == "[DONE]":
                self.done = True
                if self.extractor is not None:
                    chunks.extend(self.extractor.finish())
                break
            try:
                chunk = self._decode(event.data)
            except UpstreamError as exc:
                if not chunks:
                    raise
                self._fault = exc
                break
            self.received = True
            self._guard_markers(chunk)
            chunks.extend(self.extractor.feed(chunk) if self.extractor is not None else (chunk,))
        return chunks

    def _guard_markers(self, chunk: Body) -> None:
        """Hold back a possible start of an end-of-turn marker; drop it if the reply ends by length."""
        choices = chunk["choices"]
        choice = choices[0] if len(choices) == 1 and isinstance(choices[0], dict) else None
        if choice is None:
            return
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        content = delta.get("content")
        text = self._markers.feed(content) if isinstance(content, str) else ""
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            text += self._markers.finish(cut=finish == "length")
        if isinstance(content, str) or text:
            delta["content"] = text

    def check(self) -> None:
        """Raise the fault held back by :meth:`feed`, if any."""
        if self._fault is not None:
            raise self._fault

    def finish(self) -> None:
        """End of the body: a cut event or a missing ``[DONE]`` is an UpstreamError."""
        if self.done:
            return
        if self._decoder.pending:
            raise UpstreamError(f"upstream {self._source} ended its stream inside an event")
        raise UpstreamError(f"upstream {self._source} {_NO_DONE}")

    def _decode(self, data: str) -> Body:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            raise UpstreamError(f"upstream {self._source} sent a malformed event")
        if "error" in chunk and "choices" not in chunk:
            raise UpstreamError(f"upstream error: {engine_message(data.encode())}", quotes_engine=True)
        if not isinstance(chunk.get("choices"), list):
            raise UpstreamError(f"upstream {self._source} sent an event that is not a completion chunk")
        return chunk


class EngineClient:
    """The app's way to the engine: its upstream, what kind of engine it is, and the admission."""

    def __init__(self, upstream: Upstream, engine: EngineWatch, admission: Admission = admit_all) -> None:
        self.upstream = upstream
        self.engine = engine
        self._admission = admission
        # Affinity only matters with several engines to choose from; otherwise the key (a hash of the
        # system prompt, tens of KB for an agent) would be computed on every request for nothing.
        self._affinity = isinstance(admission, EnginePool) and len(admission.engines) > 1

    @property
    def setup(self) -> EngineSetup:
        """The setup for the engine found now (the watch owns it: a sidecar's engine may change)."""
        return self.engine.setup

    @property
    def model_names(self) -> ModelNames:
        """What decides each request's model name now (the watch owns it: the engine's list may change)."""
        return self.engine.model_names

    def admitted(self, request: web.Request, chat: Body | None = None) -> AbstractAsyncContextManager[EngineCall]:
        """The one place a request enters admission; the engine is this request's until the block ends.

        ``chat`` is the Chat body about to be sent, when there is one: its conversation key lets
        admission prefer the engine that served the conversation's last turn (its KV state and
        prompt cache still hold the prefix).
        """
        conversation = conversation_key(chat.get("messages")) if self._affinity and chat is not None else None
        return _Admitted(self, self._admission(request, conversation))


class _Admitted:
    """The block of :meth:`EngineClient.admitted`: the admission held, an :class:`EngineCall` to use inside.

    A class rather than a generator-based context manager: entered on every request, where the
    generator's machinery costs more than the delegation it does.
    """

    __slots__ = ("_admission", "_client")

    def __init__(self, client: EngineClient, admission: AbstractAsyncContextManager[EngineTarget | None]) -> None:
        self._client = client
        self._admission = admission

    async def __aenter__(self) -> EngineCall:
        target = await self._admission.__aenter__()
        client = self._client
        return EngineCall(client.upstream.at(target), client.setup)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._admission.__aexit__(exc_type, exc, tb)


@dataclass
class EngineCall:
    """Engine requests made for one admitted client request."""

    upstream: Upstream
    setup: EngineSetup

    def open(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """One engine request; the response is closed (or released, when read to the end) on exit."""
        return self.upstream.open(method, path_qs, headers, body)

    def adapt(self, body: Body, *, stream: bool) -> tuple[Body, ReplyPlan | None]:
        """A translated Chat body as this engine takes it, and how its reply is treated."""
        adapted, _ = adapt_chat_request({**body, "stream": stream}, self.setup.profile)
        return adapted, reply_plan(adapted, self.setup)

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        """The whole body of an engine response; a broken or silent engine raises an UpstreamError."""
        return await self.upstream.read(response)

    async def error_of(self, response: aiohttp.ClientResponse) -> UpstreamStatusError:
        """An engine's error answer as an error carrying its status and message (the body may be anything)."""
        try:
            raw = await self.upstream.read(response)
        except UpstreamError:
            raw = b""
        return UpstreamStatusError(engine_message(raw), status=response.status)

    async def reply(self, response: aiohttp.ClientResponse, plan: ReplyPlan | None) -> tuple[bytes, Body]:
        """A whole successful answer: its bytes (the engine's own when nothing was rewritten) and the completion."""
        raw = await self.read(response)
        data = decode_completion(raw, self.upstream.base_url)
        if strip_cut_marker(data):
            raw = orjson.dumps(data)
        if plan is None:
            return raw, data
        extracted = extract_completion(data, plan.extract, note=note_toolcalls)
        return (raw if extracted is data else orjson.dumps(extracted)), extracted

    async def completion(self, body: Body, headers: Mapping[str, str] | None = None) -> Body:
        """One non-streaming completion, as a dict; ``headers`` are sent too (e.g. Authorization)."""
        adapted, plan = self.adapt(body, stream=False)
        async with self.open("POST", CHAT_PATH, _json_headers(headers), orjson.dumps(adapted)) as response:
            if response.status >= 400:
                raise await self.error_of(response)
            return (await self.reply(response, plan))[1]

    async def stream(self, body: Body, headers: Mapping[str, str] | None = None) -> AsyncGenerator[Body | None, None]:
        """Stream a completion as chunk dicts; ``None`` is yielded where the engine sent bytes but no chunk yet.

        With ``stream_options.include_usage`` the last chunk carries usage, counted by toolpair if
        the engine sends none. Close the generator to stop the engine early.
        """
        adapted, plan = self.adapt(body, stream=True)
        sent = _json_headers(headers)
        async with self.open("POST", CHAT_PATH, sent, orjson.dumps(adapted)) as response:
            if response.status >= 400:
                raise await self.error_of(response)
            async for chunk in self.decoded(response, plan, adapted, sent):
                yield chunk

    async def decoded(
        self, response: aiohttp.ClientResponse, plan: ReplyPlan | None, request: Body, headers: Mapping[str, str]
    ) -> AsyncGenerator[Body | None, None]:
        """The chunks of a successful engine stream for ``request``, then the usage chunk it may owe.

        An empty stream, or one that breaks before its first chunk, is diagnosed (see the module docstring).
        """
        decoder = ChunkDecoder(plan, self.upstream.base_url)
        try:
            async for chunk in self.chunks(response, decoder):
                yield chunk
        except (UpstreamStatusError, UpstreamTimeoutError):
            raise  # the engine said what is wrong, or is not answering: asking it again would only wait again
        except UpstreamError:
            if not decoder.received:
                await self.diagnose(request, headers)
            raise
        if not decoder.received:
            await self.diagnose(request, headers)
            raise UpstreamError("the engine ended the stream without answering")
        async for chunk in self.usage_chunks(plan, decoder, request, headers):
            yield chunk

    async def chunks(self, response: aiohttp.ClientResponse, decoder: ChunkDecoder) -> AsyncIterator[Body | None]:
        """The chunks of an open engine stream, through ``decoder``; ``None`` for bytes that completed none."""
        async for raw in self.upstream.chunks(response):
            chunks = decoder.feed(raw)
            if not chunks:
                yield None
            for chunk in chunks:
                yield chunk
            decoder.check()
            if decoder.done:
                return
        decoder.finish()

    async def usage_chunks(
        self, plan: ReplyPlan | None, decoder: ChunkDecoder, request: Body, headers: Mapping[str, str]
    ) -> AsyncIterator[Body]:
        """The usage chunk a finished stream owes when the client asked for usage and the engine sent none."""
        extractor = decoder.extractor
        count_path = self.setup.profile.token_count_path
        if plan is None or not plan.usage or extractor is None or extractor.usage_seen or count_path is None:
            return
        usage = await self._count_usage(count_path, headers, request, "".join(extractor.text))
        if usage is not None:
            yield usage_chunk(extractor.head, usage)

    async def diagnose(self, body: Body, headers: Mapping[str, str]) -> None:
        """Raise the engine's own error for a request whose stream ended or broke before it began, if it has one.

        Tried twice: llama-cpp-python closes the connection just after such a stream, while the
        client pool may already hold it for reuse, so the first try can meet a dead connection.
        """
        replay = {k: v for k, v in body.items() if k not in _REPLAY_DROP}
        replay.update(stream=False, max_tokens=1)
        for _ in range(2):
            try:
                async with self.open("POST", CHAT_PATH, headers, orjson.dumps(replay)) as response:
                    if response.status >= 400:
                        raise await self.error_of(response)
                    await self.read(response)
                return
            except UpstreamStatusError:
                raise
            except UpstreamTimeoutError:
                return
            except UpstreamError as exc:
                log.info("diagnosing an empty stream: %s", exc.message)

    # Usage for a stream whose engine reports none (llama-cpp-python), counted by the engine itself:
    # - prompt_tokens: the same request replayed without streaming, with max_tokens 1. The engine renders
    #   the prompt with its own template and reports its length; its prompt cache still holds that prompt
    #   from the stream that just ended (the admission is held the whole time), so the replay costs one
    #   token: measured 36 ms after a 1524-token prompt that took 18 s to read cold.
    # - completion_tokens: the engine's tokenizer count of the text the model produced, minus what it
    #   counts for an empty text (the BOS token). Tokens a stop sequence swallowed are not in that text.
    # Any failure leaves usage out (and is logged) rather than inventing numbers.

    async def _count_usage(self, count_path: str, headers: Mapping[str, str], request: Body, text: str) -> Body | None:
        replay = {k: v for k, v in request.items() if k not in _REPLAY_DROP}
        replay.update(stream=False, max_tokens=1)
        try:
            reply = await self._post(CHAT_PATH, headers, replay)
            usage = reply.get("usage")
            prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if not isinstance(prompt, int):
                raise UpstreamError(f"{CHAT_PATH} answered no usage")
            generated = await self._count(count_path, headers, text)
            completion = max(0, generated - await self._count(count_path, headers, ""))
        except UpstreamError as exc:
            log.warning("stream usage left out: %s", exc.message)
            return None
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _post(self, path: str, headers: Mapping[str, str], body: Body) -> Body:
        async with self.open("POST", path, _json_headers(headers), orjson.dumps(body)) as response:
            if response.status != 200:
                raise UpstreamError(f"{path} answered {response.status}")
            return decode_object(await self.read(response), self.upstream.base_url)

    async def _count(self, path: str, headers: Mapping[str, str], text: str) -> int:
        count = (await self._post(path, headers, {"input": text})).get("count")
        if not isinstance(count, int):
            raise UpstreamError(f"{path} answered no count")
        return count


def strip_cut_marker(completion: Body) -> bool:
    """Drop the start of an end-of-turn marker from a reply cut by length; True if anything changed."""
    changed = False
    for choice in completion["choices"]:
        message = choice.get("message") if isinstance(choice, dict) else None
        if choice.get("finish_reason") == "length" and isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str):
                stripped = strip_end_marker_prefix(content)
                if stripped != content:
                    message["content"] = stripped
                    changed = True
    return changed


_REPLAY_DROP = ("stream", "stream_options", "max_completion_tokens", "min_tokens", "n")


def _json_headers(extra: Mapping[str, str] | None) -> Mapping[str, str]:
    if not extra:
        return _JSON_HEADERS
    merged = CIMultiDict(extra)
    merged.update(_JSON_HEADERS)
    return merged
