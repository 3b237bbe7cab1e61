"""Token logprobs stay with the text they spell when the end-of-turn marker guard holds or drops text.

A reply cut by its token limit can end in the first characters of a marker (``<|im``); toolpair
drops them, whole reply or stream. Their tokens' logprobs go too; a token that begins in kept
text (``.<|``) stays. Pure: chunk dicts and completions, no network.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.engine.client import ChunkDecoder, strip_cut_marker


def _chunk(content: str, tokens: list[str], finish: str | None = None) -> bytes:
    entries = [{"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []} for t in tokens]
    choice: dict[str, Any] = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    if tokens:
        choice["logprobs"] = {"content": entries}
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


def _run(pieces: list[tuple[str, list[str]]], finish: str) -> tuple[str, list[str]]:
    decoder = ChunkDecoder(None, "http://engine")
    body = b"".join(_chunk(text, tokens) for text, tokens in pieces) + _chunk("", [], finish) + b"data: [DONE]\n\n"
    chunks = decoder.feed(body)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    tokens = [e["token"] for c in chunks for e in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
    return text, tokens


PIECES = [("Say", ["Say"]), (" hello", [" hello"]), (".<|", [".<|"]), ("im_", ["im_"])]


def test_a_cut_marker_takes_its_tokens_with_it_in_a_stream() -> None:
    assert _run(PIECES, "length") == ("Say hello.", ["Say", " hello", ".<|"])


def test_held_text_that_was_no_marker_goes_out_with_its_tokens() -> None:
    pieces = [("a ", ["a", " "]), ("<", ["<"]), ("b", ["b"])]
    assert _run(pieces, "length") == ("a <b", ["a", " ", "<", "b"])
    assert _run(PIECES, "stop") == ("Say hello.<|im_", ["Say", " hello", ".<|", "im_"])


@pytest.mark.parametrize("split", [1, 2, 3, 4])
def test_tokens_arrive_with_the_text_they_begin_in(split: int) -> None:
    # However the engine groups tokens into chunks, each token goes out once, in order.
    tokens = ["Say", " hello", ".<|", "im_"]
    pieces = [("".join(tokens[i : i + split]), tokens[i : i + split]) for i in range(0, len(tokens), split)]
    assert _run(pieces, "length") == ("Say hello.", ["Say", " hello", ".<|"])


def test_a_whole_reply_cut_by_length_drops_the_markers_tokens() -> None:
    entries = [{"token": t, "logprob": -0.1} for t in ["Sure", ".<|", "im"]]
    completion = {"choices": [{"message": {"content": "Sure.<|im"}, "finish_reason": "length"}]}
    completion["choices"][0]["logprobs"] = {"content": entries, "refusal": None}
    assert strip_cut_marker(completion)
    choice = completion["choices"][0]
    assert choice["message"]["content"] == "Sure."
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["Sure", ".<|"]
    assert choice["logprobs"]["refusal"] is None


def test_a_token_that_ran_into_held_text_is_counted_once() -> None:
    # "a<" spells the held "<" already, so "<|" begins in held text, not in the "<" let out next.
    pieces = [("a<", ["a<"]), ("<|", ["<|"]), ("im", ["im"])]
    assert _run(pieces, "length") == ("a<", ["a<"])
    assert _run(pieces, "stop") == ("a<<|im", ["a<", "<|", "im"])
