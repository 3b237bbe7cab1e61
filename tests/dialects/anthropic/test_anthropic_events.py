"""Chat chunks -> Anthropic stream events -> message: the transducer and the accumulator, no sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.anthropic.accumulate import MessageAccumulator, accumulate, message_from_completion
from proxy.dialects.anthropic.events import MessageEvents, MessageFrames
from proxy.dialects.anthropic.request import Event
from proxy.errors import UpstreamError
from proxy.sse import EventDecoder

NO_CACHE = {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
"""Anthropic usage always carries the cache counts; 0 where the engine reports none."""


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def call(index: int, id: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    out: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if id is not None:
        out["id"] = id
    return out


def run(chunks: list[dict[str, Any]], **options: Any) -> list[Event]:
    events = MessageEvents(model="claude-x", message_id="msg_test", **options)
    out: list[Event] = []
    for chunk in chunks:
        out += events.feed(chunk)
        if events.done:
            return out
    return out + events.finish()


def types(events: list[Event]) -> list[str]:
    return [e["type"] if e["type"] != "content_block_delta" else e["delta"]["type"] for e in events]


def test_a_text_answer_follows_the_documented_sequence_exactly() -> None:
    events = run([delta(role="assistant", content=""), delta(content="Hel"), delta(content="lo"), delta("stop")])
    assert events == [
        {
            "type": "message_start",
            "message": {
                "id": "msg_test",
                "type": "message",
                "role": "assistant",
                "model": "claude-x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0, **NO_CACHE},
            },
        },
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": 0, "output_tokens": 2, **NO_CACHE},
        },
        {"type": "message_stop"},
    ]


THINK_TEXT_TOOLS = [
    delta(role="assistant", reasoning_content="Two"),
    delta(reasoning_content=" greps."),
    delta(content="Searching."),
    delta(tool_calls=[call(0, "call_a", "Grep", "")]),
    delta(tool_calls=[call(0, arguments='{"pattern":')]),
    delta(tool_calls=[call(0, arguments=' "slow"}')]),
    delta(tool_calls=[call(1, "call_b", "Grep", '{"pattern": "fast"}')]),
    delta("tool_calls"),
]


def test_thinking_text_and_two_tool_calls_are_blocks_in_order() -> None:
    events = run(THINK_TEXT_TOOLS)
    assert types(events) == [
        "message_start", "ping",
        "content_block_start", "thinking_delta", "thinking_delta", "content_block_stop",
        "content_block_start", "text_delta", "content_block_stop",
        "content_block_start", "input_json_delta", "input_json_delta", "content_block_stop",
        "content_block_start", "input_json_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == [0, 1, 2, 3]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[2]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "Grep", "input": {}}
    message = accumulate(events)
    assert message["content"] == [
        {"type": "thinking", "thinking": "Two greps.", "signature": ""},
        {"type": "text", "text": "Searching."},
        {"type": "tool_use", "id": "call_a", "name": "Grep", "input": {"pattern": "slow"}},
        {"type": "tool_use", "id": "call_b", "name": "Grep", "input": {"pattern": "fast"}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 7, **NO_CACHE}  # one per chunk with output


def test_the_anthropic_sdks_own_accumulator_accepts_the_events() -> None:
    snapshot = None
    buffers: dict[int, bytes] = {}
    for event in run(THINK_TEXT_TOOLS, input_tokens=31):
        if event["type"] != "ping":
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)  # type: ignore[arg-type]
    assert snapshot is not None
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert snapshot.content[3].input == {"pattern": "fast"}  # type: ignore[union-attr]
    assert snapshot.usage.input_tokens == 31 and snapshot.usage.output_tokens == 7
    assert snapshot.stop_reason == "tool_use"


def test_frames_are_named_sse_events_that_decode_back() -> None:
    frames = MessageFrames(MessageEvents(model="m", message_id="msg_1"))
    raw = frames.feed(delta("stop", content="a\nb")) + frames.finish()
    assert raw.startswith(b"event: message_start\ndata: {")
    decoded = EventDecoder().feed(raw)
    assert [e.event for e in decoded] == [orjson.loads(e.data)["type"] for e in decoded]
    assert orjson.loads(decoded[3].data)["delta"]["text"] == "a\nb"
    assert frames.done and frames.finish() == b"" and frames.ping() == b""


@given(
    thinking=st.text(max_size=12),
    text=st.text(max_size=20),
    arguments=st.sampled_from(['{"a": 1}', '{"path": "x/é.py", "n": [1, 2]}', "{}"]),
    cuts=st.lists(st.integers(min_value=1, max_value=19), max_size=5),
)
def test_any_chunking_of_the_same_output_gives_the_same_message(
    thinking: str, text: str, arguments: str, cuts: list[int]
) -> None:
    def pieces(value: str) -> list[str]:
        points = sorted({c for c in cuts if c < len(value)})
        return [value[a:b] for a, b in zip([0, *points], [*points, len(value)], strict=True)]

    def message(chunked: bool) -> dict[str, Any]:
        split = pieces if chunked else (lambda v: [v])
        chunks = [delta(reasoning_content=p) for p in split(thinking)]
        chunks += [delta(content=p) for p in split(text)]
        chunks.append(delta(tool_calls=[call(0, "call_1", "Edit")]))
        chunks += [delta(tool_calls=[call(0, arguments=p)]) for p in split(arguments)]
        chunks.append(delta("tool_calls"))
        out = accumulate(run(chunks, stop_sequences=["\x00never"]))
        out["usage"] = None  # chunk counts differ by design
        return out

    assert message(chunked=True) == message(chunked=False)


# --- stop sequences


def test_a_stop_sequence_across_chunks_cuts_the_text_and_ends_the_message() -> None:
    events = MessageEvents(model="m", message_id="msg_1", stop_sequences=["\nUser:", "###"])
    out = events.feed(delta(content="The answer is 4."))
    out += events.feed(delta(content="\nUs"))
    assert not events.done
    out += events.feed(delta(content="er: next question"))
    assert events.done
    message = accumulate(out)
    assert message["content"] == [{"type": "text", "text": "The answer is 4."}]
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "\nUser:"
    assert message["usage"]["output_tokens"] == 1  # the two chunks that spelled the stop sequence are not output
    assert events.finish() == []
    with pytest.raises(UpstreamError, match="after the message ended"):
        events.feed(delta(content="more"))


def test_a_stop_sequence_as_the_first_text_gives_no_text_block() -> None:
    message = accumulate(run([delta(content="###"), delta(content="never seen")], stop_sequences=["###"]))
    assert message["content"] == [] and message["stop_sequence"] == "###"


def test_held_back_text_is_let_through_when_no_stop_follows() -> None:
    message = accumulate(run([delta(content="a #"), delta(content="#"), delta("stop")], stop_sequences=["###"]))
    assert message["content"] == [{"type": "text", "text": "a ##"}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None


def test_held_back_text_goes_out_before_a_tool_call() -> None:
    chunks = [delta(content="#"), delta(tool_calls=[call(0, "c", "f", "{}")]), delta("tool_calls")]
    message = accumulate(run(chunks, stop_sequences=["##"]))
    assert message["content"][0] == {"type": "text", "text": "#"}
    assert message["content"][1]["type"] == "tool_use"


def test_stop_sequences_do_not_apply_to_thinking_or_tool_arguments() -> None:
    chunks = [delta(reasoning_content="STOP"), delta(tool_calls=[call(0, "c", "f", '{"a": "STOP"}')]), delta("stop")]
    message = accumulate(run(chunks, stop_sequences=["STOP"]))
    assert message["stop_reason"] == "tool_use" and message["content"][1]["input"] == {"a": "STOP"}


# --- usage, finish reasons, pings


def test_engine_usage_wins_over_the_chunk_count() -> None:
    chunks = [
        delta(content="hi"),
        delta("stop"),
        {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 7}},
    ]
    events = run(chunks, input_tokens=39)
    assert events[0]["message"]["usage"] == {"input_tokens": 39, "output_tokens": 0, **NO_CACHE}
    assert events[-2]["usage"] == {"input_tokens": 40, "output_tokens": 7, **NO_CACHE}


@pytest.mark.parametrize(
    ("finish", "tools", "reason"),
    [("stop", False, "end_turn"), ("eos", False, "end_turn"), ("length", False, "max_tokens"),
     ("length", True, "max_tokens"), ("tool_calls", True, "tool_use"), ("stop", True, "tool_use"),
     ("function_call", False, "tool_use"), ("content_filter", False, "refusal")],
)  # fmt: skip
def test_finish_reasons(finish: str, tools: bool, reason: str) -> None:
    chunks = [delta(tool_calls=[call(0, "c", "f")])] if tools else [delta(content="x")]
    assert accumulate(run([*chunks, delta(finish)]))["stop_reason"] == reason


def test_pings_before_and_after_message_start() -> None:
    events = MessageEvents(model="m", message_id="msg_1", input_tokens=12)
    first = events.ping()
    assert types(first) == ["message_start", "ping", "ping"]
    assert first[0]["message"]["usage"]["input_tokens"] == 12
    assert events.ping() == [{"type": "ping"}]
    assert types(events.feed(delta(content="x"))) == ["content_block_start", "text_delta"]


def test_tool_call_ids_are_kept_or_made() -> None:
    message = accumulate(run([delta(tool_calls=[call(0, None, "f", "{}"), call(1, "", "g", "{}")]), delta("stop")]))
    ids = [block["id"] for block in message["content"]]
    assert all(i.startswith("toolu_") and len(i) == 30 for i in ids) and ids[0] != ids[1]


# --- orders the grammar cannot express


def test_stream_without_a_finish_reason_is_an_upstream_error() -> None:
    events = MessageEvents(model="m")
    events.feed(delta(content="partial"))
    with pytest.raises(UpstreamError, match="before it finished"):
        events.finish()


def test_tool_call_without_a_name_is_an_upstream_error() -> None:
    with pytest.raises(UpstreamError, match="without a name"):
        MessageEvents(model="m").feed(delta(tool_calls=[call(0, "c", None, "{}")]))


def test_a_tool_call_resuming_after_the_next_began_is_an_upstream_error() -> None:
    events = MessageEvents(model="m")
    events.feed(delta(tool_calls=[call(0, "a", "f"), call(1, "b", "g")]))
    with pytest.raises(UpstreamError, match="resumed a tool call"):
        events.feed(delta(tool_calls=[call(0, arguments="{}")]))


START = {"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 0, "output_tokens": 0}}}
TEXT = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
STOP0 = {"type": "content_block_stop", "index": 0}
TEXT_DELTA = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}
END = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
    "usage": {"output_tokens": 1},
}


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([TEXT], "before message_start"),
        ([START, START], "second message_start"),
        ([START, TEXT, TEXT], "while a block is open"),
        ([START, {**TEXT, "index": 1}], "expected 0"),
        ([START, TEXT_DELTA], "not open"),
        ([START, TEXT, {**TEXT_DELTA, "delta": {"type": "thinking_delta", "thinking": "x"}}],
         "thinking_delta in a text block"),
        ([START, STOP0], "not open"),
        ([START, TEXT, END], "while a block is open"),
        ([START, {"type": "message_stop"}], "before message_delta"),
        ([START, END, TEXT], "after message_delta"),
        ([START, END, {"type": "message_stop"}, {"type": "ping"}], "after message_stop"),
        ([START, {"type": "error", "error": {"type": "api_error"}}], "error event"),
        ([START, {"type": "surprise"}], "unknown event type"),
    ],
)  # fmt: skip
def test_the_accumulator_refuses_impossible_orders(events: list[Event], problem: str) -> None:
    accumulator = MessageAccumulator()
    with pytest.raises(ValueError, match=problem):
        for event in events:
            accumulator.feed(event)


def test_accumulate_needs_a_whole_message() -> None:
    with pytest.raises(ValueError, match="did not end"):
        accumulate([START, END])


# --- non-stream completions


def completion(message: dict[str, Any], finish: str | None = "stop", usage: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


def test_completion_with_reasoning_text_and_tool_calls() -> None:
    message = message_from_completion(
        completion(
            {
                "role": "assistant",
                "reasoning_content": "hm",
                "content": "Let me look.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a"}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "Read", "arguments": '{"path": "b"}'}},
                ],
            },
            "tool_calls",
            {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
        ),
        model="claude-sonnet-4-5",
        message_id="msg_x",
    )
    assert message == {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "call_1", "name": "Read", "input": {"path": "a"}},
            {"type": "tool_use", "id": "call_2", "name": "Read", "input": {"path": "b"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 50, "output_tokens": 20, **NO_CACHE},
    }


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"text"', ""])
def test_tool_arguments_that_are_not_an_object_become_an_empty_input(arguments: str) -> None:
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]
    message = message_from_completion(completion({"content": None, "tool_calls": calls}), model="m")
    assert message["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]


def test_completion_without_finish_reason_or_usage_or_choices() -> None:
    message = message_from_completion(completion({"content": "hi"}, None), model="m")
    assert message["stop_reason"] == "end_turn" and message["id"].startswith("msg_")
    empty = message_from_completion({"object": "chat.completion"}, model="m")
    assert empty["content"] == [] and empty["stop_reason"] == "end_turn"
