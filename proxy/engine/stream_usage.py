"""Usage for a stream whose engine reports none (llama-cpp-python), counted by the engine itself.

A client that sets ``stream_options.include_usage`` expects the stream to end
with a chunk carrying ``usage``; llama-cpp-python never sends one. Numbers are
asked of the engine, not estimated:

- ``prompt_tokens``: the same request replayed without streaming, with
  ``max_tokens: 1``. The engine renders the prompt with its own template and
  reports its length. Its prompt cache still holds that prompt from the stream
  that just ended (toolpair holds the engine's admission the whole time), so
  the replay costs one token: measured 36 ms after a 1524-token prompt that
  took 18 s to read cold.
- ``completion_tokens``: the engine's tokenizer count of the text the model
  produced (``token_count_path``, minus what it counts for an empty text: the
  BOS token). Tokens a stop sequence swallowed are not in that text, so this
  can be lower than the engine's own non-stream count by those few tokens.

Any failure leaves usage out (and is logged) rather than inventing numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from multidict import CIMultiDict

from proxy._types import Body
from proxy.engine.replies import read_json_object
from proxy.engine.upstream import Upstream
from proxy.errors import UpstreamError

__all__ = ["count_usage", "usage_chunk"]

log = logging.getLogger("toolpair")

_REPLAY_DROP = ("stream", "stream_options", "max_completion_tokens", "min_tokens", "n")


async def _post(upstream: Upstream, path: str, headers: Mapping[str, str], body: Body) -> Body:
    merged = CIMultiDict(headers)
    merged["Content-Type"] = "application/json"
    response = await upstream.open("POST", path, merged, orjson.dumps(body))
    if response.status != 200:
        response.close()
        raise UpstreamError(f"{path} answered {response.status}")
    return (await read_json_object(upstream, response))[1]


async def _count(upstream: Upstream, path: str, headers: Mapping[str, str], text: str) -> int:
    counted = await _post(upstream, path, headers, {"input": text})
    count = counted.get("count")
    if not isinstance(count, int):
        raise UpstreamError(f"{path} answered no count")
    return count


async def count_usage(
    upstream: Upstream,
    chat_path: str,
    count_path: str,
    headers: Mapping[str, str],
    request: Body,
    generated: str,
) -> Body | None:
    """``{"prompt_tokens", "completion_tokens", "total_tokens"}`` for a finished stream, or None."""
    replay = {k: v for k, v in request.items() if k not in _REPLAY_DROP}
    replay.update(stream=False, max_tokens=1)
    try:
        reply = await _post(upstream, chat_path, headers, replay)
        usage = reply.get("usage")
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(prompt, int):
            raise UpstreamError(f"{chat_path} answered no usage")
        completion = max(
            0, await _count(upstream, count_path, headers, generated) - await _count(upstream, count_path, headers, "")
        )
    except UpstreamError as exc:
        log.warning("stream usage left out: %s", exc.message)
        return None
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def usage_chunk(head: Body, usage: Body) -> Body:
    """The final chunk of an OpenAI stream with ``include_usage``: no choices, just usage."""
    return {**head, "choices": [], "usage": usage}
