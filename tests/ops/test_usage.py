"""Reading token usage off response bodies without holding them."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.ops.usage import Usage, UsageScanner, find_usage
from tests.mock_engine import chunk, completion


def stream(*frames: bytes) -> bytes:
    return b"".join(frames) + b"data: [DONE]\n\n"


OPENAI_STREAM = stream(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": 'text with "usage": {"prompt_tokens": 999} inside'}),
    chunk({}, "stop"),
    b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,'
    b'"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}\n\n',
)

ANTHROPIC_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","usage":'
    b'{"input_tokens":0,"output_tokens":1}}}\n\n'
    + b"".join(
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"%d"}}\n\n' % i
        for i in range(400)
    )
    + b'event: message_delta\ndata: {"type":"message_delta","usage":{"input_tokens":42,"output_tokens":9}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (orjson.dumps(completion()), Usage(5, 1)),
        (OPENAI_STREAM, Usage(12, 3)),
        (b'{"usage" :\n {"input_tokens": 7, "output_tokens": 2}}', Usage(7, 2)),
        (b'{"object":"list","data":[],"usage":{"prompt_tokens":4,"total_tokens":4}}', Usage(4, None)),
        (b'{"usage": null}', None),
        (b'{"usage": {"total_tokens": 3}}', None),
        (b'{"usage": {"prompt_tokens": "5", "completion_tokens": true}}', None),
        (b'{"usage": {"prompt_tokens": 5, "comp', None),  # cut off
        (b'{"content": "the \\"usage\\": {\\"prompt_tokens\\": 5} trick"}', None),
        (b"", None),
    ],
    ids=[
        "completion",
        "stream",
        "spaces-anthropic",
        "embeddings",
        "null",
        "no-counts",
        "wrong-types",
        "cut",
        "in-text",
        "empty",
    ],
)
def test_find_usage(body: bytes, expected: Usage | None) -> None:
    assert find_usage(body) == expected


def scan(body: bytes, cuts: list[int], window: int = 8192) -> Usage | None:
    scanner = UsageScanner(window)
    start = 0
    for cut in [*sorted(cuts), len(body)]:
        scanner.feed(body[start:cut])
        start = cut
    return scanner.result()


def test_anthropic_stream_takes_input_from_the_end_and_fills_in_from_the_start() -> None:
    assert len(ANTHROPIC_STREAM) > 2 * 1024  # the two windows do not overlap
    assert scan(ANTHROPIC_STREAM, [], window=1024) == Usage(42, 9)
    head_only = ANTHROPIC_STREAM.replace(b'"input_tokens":42,', b"")
    assert scan(head_only, [], window=1024) == Usage(0, 9)


def test_usage_in_the_middle_of_a_long_body_is_out_of_both_windows() -> None:
    body = b'{"a": "' + b"x" * 5000 + b'", "usage": {"prompt_tokens": 1}, "b": "' + b"y" * 5000 + b'"}'
    assert find_usage(body) == Usage(1, None)
    assert scan(body, [], window=1024) is None


@settings(max_examples=200, deadline=None)
@given(
    body=st.sampled_from([OPENAI_STREAM, ANTHROPIC_STREAM, orjson.dumps(completion())]),
    cuts=st.lists(st.integers(min_value=0, max_value=20000), max_size=30),
    window=st.sampled_from([64, 700, 1024, 8192]),
)
def test_any_split_gives_the_same_usage(body: bytes, cuts: list[int], window: int) -> None:
    cuts = [c for c in cuts if c <= len(body)]
    assert scan(body, cuts, window) == scan(body, [], window)


def test_every_single_byte_split_of_a_stream() -> None:
    whole = scan(OPENAI_STREAM, [], window=256)
    assert whole == Usage(12, 3)
    for cut in range(len(OPENAI_STREAM) + 1):
        assert scan(OPENAI_STREAM, [cut], window=256) == whole


def test_scanner_memory_is_bounded() -> None:
    scanner = UsageScanner(window=100)
    for _ in range(1000):
        scanner.feed(b"z" * 37)
    assert len(scanner._head) == 100 and len(scanner._tail) <= 200
