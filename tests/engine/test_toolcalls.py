"""Tool-call and reasoning extraction: the corpus per format, split-anywhere, stream against non-stream."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects.chat.stream import ChatStream
from proxy.engine.client import ChunkDecoder
from proxy.engine.plan import ReplyPlan
from proxy.engine.toolcalls import (
    ChunkExtractor,
    Content,
    Event,
    ExtractOptions,
    Reasoning,
    TextExtractor,
    ToolCall,
    detect_tool_call_format,
    extract_completion,
    template_opens_think,
)
from tests.support.template_replies import counting_ids, merged
from tests.toolcall_corpus import CASES, TOOLS, Case

OPENAI_ID = re.compile(r"call_[A-Za-z0-9]{24}")
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


def options(case: Case) -> ExtractOptions:
    return ExtractOptions(**case.options)


def run(case: Case, pieces: list[str], ids: Any = None) -> tuple[list[Event], TextExtractor]:
    extractor = TextExtractor(options(case), ids or counting_ids())
    events: list[Event] = []
    for piece in pieces:
        events += extractor.feed(piece)
    events += extractor.finish()
    return merged(events), extractor


def case_ids(case: Case) -> str:
    return case.id


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_corpus(case: Case) -> None:
    extractor = TextExtractor(options(case))
    events = extractor.feed(case.text) + extractor.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert content == case.content
    assert reasoning == case.reasoning
    assert [(c.name, json.loads(c.arguments)) for c in calls] == case.calls
    assert [c.index for c in calls] == list(range(len(calls)))
    assert extractor.malformed == case.malformed
    mistral = case.options.get("calls") == "mistral" or "[TOOL_CALLS]" in case.text
    for i, call in enumerate(calls):
        fixed = case.ids[i] if case.ids else "*"
        if fixed != "*":
            assert call.id == fixed
        else:
            assert (MISTRAL_ID if mistral else OPENAI_ID).fullmatch(call.id), call.id
    assert len({c.id for c in calls}) == len(calls)


def test_parallel_off_counts_what_it_drops() -> None:
    case = next(c for c in CASES if c.id == "hermes-parallel-off")
    events, extractor = run(case, [case.text])
    assert [e.index for e in events if isinstance(e, ToolCall)] == [0]
    assert extractor.dropped == 1


def test_each_reply_reports_its_counts_stream_and_not() -> None:
    heard: list[tuple[int, int]] = []
    for case_id in ("hermes-two-with-text", "hermes-malformed-json", "hermes-parallel-off"):
        case = next(c for c in CASES if c.id == case_id)
        extract_completion(completion_of(case, raw=True), options(case), note=lambda *n: heard.append(n))
        extractor = ChunkExtractor(options(case), note=lambda *n: heard.append(n))
        for chunk in engine_chunks(case.text, 5):
            extractor.feed(chunk)
    assert heard == [(2, 0), (2, 0), (0, 1), (0, 1), (1, 0), (1, 0)]


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_every_split_gives_the_same_events(case: Case) -> None:
    whole = run(case, [case.text])
    for cut in range(len(case.text) + 1):
        assert run(case, [case.text[:cut], case.text[cut:]])[0] == whole[0], cut
    one_by_one = run(case, list(case.text))
    assert one_by_one[0] == whole[0]
    assert one_by_one[1].malformed == whole[1].malformed


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CASES), st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_partition_gives_the_same_events(case: Case, cuts: list[int]) -> None:
    points = sorted({c % (len(case.text) + 1) for c in cuts})
    pieces = [case.text[a:b] for a, b in itertools.pairwise([0, *points, len(case.text)])]
    assert run(case, pieces)[0] == run(case, [case.text])[0]


def test_text_streams_at_once_and_only_a_possible_marker_is_held() -> None:
    extractor = TextExtractor(ExtractOptions(calls="hermes", tools=TOOLS), counting_ids())
    assert extractor.feed("Hello wor") == [Content("Hello wor")]
    assert extractor.feed("ld. <tool") == [Content("ld.")]  # " <tool" may start a call
    assert extractor.feed("s are fun") == [Content(" <tools are fun")]
    assert extractor.feed("\n<tool_call>\n{") == []
    assert extractor.feed('"name": "get_time", "arguments": {}') == []
    first = extractor.feed("}\n</tool_")  # complete as soon as its object closes
    assert first == [ToolCall(0, "openai-0", "get_time", "{}")]
    assert extractor.feed("call>\n<tool_call>") == []
    assert extractor.feed('{"name": "get_time", "arguments": {"tz": "UTC"}}') == [
        ToolCall(1, "openai-1", "get_time", '{"tz":"UTC"}')
    ]
    assert extractor.finish() == []


def test_reasoning_streams_at_once() -> None:
    extractor = TextExtractor(ExtractOptions(reasoning=True), counting_ids())
    assert extractor.feed("<thi") == []
    assert extractor.feed("nk>Let me") == [Reasoning("Let me")]
    assert extractor.feed(" think</th") == [Reasoning(" think")]
    assert extractor.feed("ink>Yes") == [Content("Yes")]


def accumulate(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a client (the openai SDK's accumulator) builds from a stream."""
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": {}}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or ():
                slot = message["tool_calls"].setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return {"message": message, "finish_reason": finish}


def from_completion(completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    message = choice["message"]
    calls = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or ()
    ]
    return {
        "message": {
            "content": message["content"] or "",
            "reasoning_content": message.get("reasoning_content") or "",
            "tool_calls": calls,
        },
        "finish_reason": choice["finish_reason"],
    }


def engine_chunks(text: str, size: int) -> list[dict[str, Any]]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    deltas = [{"role": "assistant"}] + [{"content": p} for p in pieces]
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}]})
    return chunks


def completion_of(case: Case, raw: bool = False) -> dict[str, Any]:
    """The non-stream reply the engine gives, after extraction unless ``raw``."""
    completion = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": case.text}, "finish_reason": "stop"}],
    }
    return completion if raw else extract_completion(completion, options(case), counting_ids())


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_stream_accumulates_to_the_non_stream_reply(case: Case) -> None:
    whole = from_completion(completion_of(case))
    for size in (1, 3, 1000):
        extractor = ChunkExtractor(options(case), counting_ids())
        out = [c for chunk in engine_chunks(case.text, size) for c in extractor.feed(chunk)] + extractor.finish()
        assert accumulate(out) == whole
    assert whole["finish_reason"] == ("tool_calls" if case.calls else "stop")


def test_each_call_streams_as_openai_deltas_id_and_name_first() -> None:
    case = next(c for c in CASES if c.id == "hermes-two-with-text")
    extractor = ChunkExtractor(options(case), counting_ids())
    out = [c for chunk in engine_chunks(case.text, 4) for c in extractor.feed(chunk)]
    deltas = [c["choices"][0]["delta"] for c in out if "tool_calls" in c["choices"][0]["delta"]]
    named = {"name": "get_weather", "arguments": ""}
    assert deltas == [
        {"tool_calls": [{"index": 0, "id": "openai-0", "type": "function", "function": named}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "openai-1", "type": "function", "function": named}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"city":"Oslo"}'}}]},
    ]
    assert out[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert out[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    assert all(c["id"] == "chatcmpl-1" and c["model"] == "m" for c in out)


def test_structured_calls_from_the_engine_pass_untouched() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function"}]},
            }
        ]
    }
    assert extract_completion(completion, ExtractOptions(calls="hermes", reasoning=True)) is completion
    plain = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
    assert extract_completion(plain, ExtractOptions(calls="hermes", reasoning=True)) is plain


def test_length_stays_length_when_a_reply_was_cut() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_'
    completion = {"choices": [{"index": 0, "finish_reason": "length", "message": {"content": text}}]}
    choice = extract_completion(completion, ExtractOptions(calls="hermes"))["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["message"]["tool_calls"]) == 1
    assert choice["message"]["content"] == '<tool_call>{"name": "get_'


def sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def rewrite(pieces: list[bytes], plan: ReplyPlan) -> list[dict[str, Any]]:
    decoder = ChunkDecoder(plan, "http://engine", counting_ids())
    encoder = ChatStream()
    raw = b"".join(encoder.feed(chunk) for piece in pieces for chunk in decoder.feed(piece))
    decoder.finish()
    raw += encoder.finish()
    assert raw.endswith(b"\n\n") and decoder.done
    return [orjson.loads(line[6:]) for line in raw.split(b"\n\n") if line.startswith(b"data: {")]


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_engine_bytes_split_at_every_byte_give_the_same_stream(case: Case) -> None:
    raw = sse(engine_chunks(case.text, max(1, len(case.text) // 3)))
    plan = ReplyPlan(options(case), usage=False)
    whole = accumulate(rewrite([raw], plan))
    assert whole == from_completion(completion_of(case))
    for cut in range(len(raw) + 1):
        assert accumulate(rewrite([raw[:cut], raw[cut:]], plan)) == whole, cut


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ('{%- for tool in tools %}<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}', "hermes"),
        ("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>", "qwen3-coder"),
        ("{%- if message.tool_calls %}{{- '[TOOL_CALLS][' }}", "mistral"),
        ("{{- '<|python_tag|>' + tool_call.name + '.call(' }}", "llama3"),
        ('{%- if message.role == "ipython" %}{"name": function name, "parameters": dictionary}', "llama3"),
        ("{% for message in messages %}{{ message.content }}{% endfor %}", "none"),
    ],
)
def test_format_detection_from_the_chat_template(template: str, expected: str) -> None:
    assert detect_tool_call_format(template) == expected


def test_bundled_template_is_hermes() -> None:
    from tests.real_engine import TEMPLATE

    template = json.loads(TEMPLATE.read_text())["chat_template"]
    assert detect_tool_call_format(template) == "hermes"
    assert not template_opens_think(template)


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool-call format"):
        TextExtractor(ExtractOptions(calls="xml"))


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="<>[]|_/tolcaTOLCSinkhpy ", max_size=20))
def test_held_suffix_is_the_longest_end_that_could_grow_into_a_marker(text: str) -> None:
    from proxy.engine.toolcalls._scan import held_suffix

    markers = ["<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "</think>"]
    expected = max(
        [n for m in markers for n in range(1, min(len(m), len(text) + 1)) if text.endswith(m[:n])], default=0
    )
    assert held_suffix(text, markers) == expected
