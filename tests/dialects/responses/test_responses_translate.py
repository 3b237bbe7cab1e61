"""Responses <-> Chat translation as pure functions: requests, whole responses, stream events.

Every event list is replayed through the openai SDK's own stream state machine, the strict
one behind ``client.responses.stream(...)``, with no sockets.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai._models import construct_type
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from proxy.dialects.responses.request import ResponsesPlan, plan_native_request, translate_request
from proxy.dialects.responses.stream import ResponsesStream, StreamStateError, chat_to_response, encode
from proxy.errors import ClientInputError, UpstreamError
from proxy.sse import EventDecoder
from tests.support.responses_events import failed_response

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def codex_request() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "codex_0_169_request.json").read_text())
    return data


def fc(call_id: str, name: str = "get_weather", arguments: str = "{}", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, **extra}


def out(call_id: str, output: Any = "x", kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": output}


def user(content: Any, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": content}


def tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}, **extra}


# --- requests --------------------------------------------------------------------------------


def test_instructions_and_leading_developer_messages_become_one_system_message() -> None:
    plan = translate_request(
        {
            "instructions": "Base.",
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "Dev one."}]},
                {"type": "message", "role": "system", "content": "Sys two."},
                {"role": "user", "content": "Hi"},
                {"role": "developer", "content": "Later note."},
            ],
        }
    )
    assert plan.chat["messages"] == [
        {"role": "system", "content": "Base.\n\nDev one.\n\nSys two."},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Later note."},
    ]


def test_content_parts_text_joined_and_images_kept_as_chat_parts() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    plan = translate_request(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "seen"}, {"type": "refusal", "refusal": "no"}],
                },
                {"role": "user", "content": [{"type": "input_text", "text": "look"}, image]},
            ]
        }
    )
    assert plan.chat["messages"] == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "seen\nno"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
            ],
        },
    ]


def test_one_assistant_turn_from_reasoning_text_and_calls_with_outputs_in_call_order() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]}
    items = [
        {"role": "user", "content": "Weather?"},
        reasoning,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        fc("a", arguments='{"city":"Paris"}', id="fc_1", status="completed"),
        fc("b", arguments='{"city":"Oslo"}'),
        out("b", "-3C"),
        out("a", [{"type": "input_text", "text": "18C"}]),
    ]
    snapshot = copy.deepcopy(items)
    plan = translate_request({"input": items})
    assert plan.chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "t",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "18C"},
        {"role": "tool", "tool_call_id": "b", "content": "-3C"},
    ]
    assert plan.report.reordered == 1
    assert items == snapshot  # nothing the client sent was mutated
    assert [i.get("call_id") for i in plan.items] == [None, None, None, "a", "b", "a", "b"]


def test_encrypted_only_reasoning_is_dropped_and_summary_text_kept() -> None:
    encrypted = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}
    summarized = {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "plan"}]}
    plan = translate_request(
        {"input": [{"role": "user", "content": "go"}, encrypted, fc("a"), out("a"), summarized, fc("b"), out("b")]}
    )
    first, second = plan.chat["messages"][1], plan.chat["messages"][3]
    assert "reasoning_content" not in first and second["reasoning_content"] == "plan"


def test_a_reasoning_item_alone_renders_no_turn() -> None:
    plan = translate_request(
        {"input": [{"role": "user", "content": "go"}, {"type": "reasoning", "summary": [], "encrypted_content": "x"}]}
    )
    assert plan.chat["messages"] == [{"role": "user", "content": "go"}]


def test_custom_tools_become_one_string_functions_and_their_history_round_trips() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}
    plan = translate_request(
        {
            "tools": [{"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": grammar}],
            "input": [
                {"role": "user", "content": "fix it"},
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
            ],
        }
    )
    (function,) = [t["function"] for t in plan.chat["tools"]]
    assert function["name"] == "apply_patch" and function["description"] == "Edit files."
    assert function["parameters"]["required"] == ["input"]
    assert "start: /.+/" in function["parameters"]["properties"]["input"]["description"]
    call = plan.chat["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"input": "*** Begin Patch"}
    assert plan.chat["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "Done"}
    assert plan.tools.ref("apply_patch").kind == "custom"


def test_namespace_tools_are_flattened_and_mapped_back() -> None:
    namespace = {"type": "namespace", "name": "agents", "description": "d", "tools": [tool("spawn"), tool("close")]}
    plan = translate_request(
        {
            "tools": [tool("exec"), namespace],
            "input": [{"role": "user", "content": "x"}, fc("a", "close", namespace="agents"), out("a")],
        }
    )
    assert [t["function"]["name"] for t in plan.chat["tools"]] == ["exec", "agents__spawn", "agents__close"]
    assert plan.chat["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__close"
    ref = plan.tools.ref("agents__close")
    assert (ref.kind, ref.name, ref.namespace) == ("function", "close", "agents")
    assert plan.tools.ref("made_up").name == "made_up"


def test_hosted_tools_are_dropped_and_reported_and_no_tool_fields_when_none_is_left() -> None:
    plan = translate_request(
        {
            "input": "hi",
            "tools": [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": []}, {"type": "web_search"}],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }
    )
    assert plan.dropped_tools == ("web_search", "file_search")
    assert set(plan.chat) == {"messages"}


def test_sampling_and_tool_choice_and_json_schema_map_to_chat_fields() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    plan = translate_request(
        {
            "model": "m",
            "input": "hi",
            "tools": [tool("f"), tool("g")],
            "tool_choice": {"type": "function", "name": "g"},
            "parallel_tool_calls": False,
            "max_output_tokens": 50,
            "temperature": 0.2,
            "top_p": 0.9,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
            "stream": True,
        }
    )
    chat = plan.chat
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    assert chat["parallel_tool_calls"] is False
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"]) == (50, 0.2, 0.9)
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert chat["stream_options"] == {"include_usage": True} and plan.stream
    assert translate_request({"input": "x", "text": {"format": {"type": "json_object"}}}).chat["response_format"] == {
        "type": "json_object"
    }


def test_allowed_tools_choice_keeps_only_the_listed_tools() -> None:
    plan = translate_request(
        {
            "input": "hi",
            "tools": [tool("f"), tool("g"), tool("h")],
            "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "g"}]},
        }
    )
    assert plan.chat["tool_choice"] == "required"
    assert [t["function"]["name"] for t in plan.chat["tools"]] == ["g"]


def test_codex_request_translates_whole() -> None:
    data = codex_request()
    plan = translate_request(data)
    chat = plan.chat
    names = [t["function"]["name"] for t in chat["tools"]]
    assert len(names) == 4 + 8 + 2 and "multi_agent_v1__close_agent" in names
    assert all(t["function"]["strict"] is False for t in chat["tools"])
    assert plan.dropped_tools == ("web_search",)
    assert chat["messages"][0]["role"] == "system" and "coding agent" in chat["messages"][0]["content"]
    assert "skills_instructions" in chat["messages"][0]["content"]
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in chat["messages"][3]["tool_calls"]] == ["call_date", "call_uname"]
    assert "reasoning_content" not in chat["messages"][3]
    assert chat["parallel_tool_calls"] is True and plan.stream and not plan.store
    for ignored in ("prompt_cache_key", "client_metadata", "include", "reasoning", "store"):
        assert ignored not in chat


def test_additional_tools_items_are_offered_and_not_rendered() -> None:
    extra = {"type": "additional_tools", "role": "developer", "tools": [tool("late")]}
    plan = translate_request({"input": [extra, {"role": "user", "content": "x"}]})
    assert [t["function"]["name"] for t in plan.chat["tools"]] == ["late"]
    assert plan.chat["messages"] == [{"role": "user", "content": "x"}]


def test_history_is_continued_and_ordered_across_it() -> None:
    history = [{"type": "message", "role": "user", "content": "q"}, fc("a"), fc("b")]
    plan = translate_request({"input": [out("b"), out("a")]}, history)
    assert [m.get("tool_call_id") for m in plan.chat["messages"]] == [None, None, "a", "b"]
    assert plan.items[:3] == history


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"input": 5}, "input", "must be a string or a list"),
    ({}, "input", "nothing to respond to"),
    ({"input": [{"role": "developer", "content": "only"}]}, "input", "nothing to respond to"),
    ({"input": [7]}, "input[0]", "must be an object"),
    ({"input": [{"content": "no role or type"}]}, "input[0].type", "must name the item type"),
    ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type", "'web_search_call' is not supported"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "'item_reference' is not supported"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "must be user, assistant"),
    ({"input": [{"role": "user", "content": 3}]}, "input[0].content", "string or a list of content parts"),
    ({"input": [user([{"type": "input_file", "file_id": "f"}])]}, "input[0].content[0].type", "not supported"),
    ({"input": [user([{"type": "input_image", "file_id": "f"}])]}, "image_url", "file_id is not supported"),
    ({"input": [user([{"type": "input_text"}])]}, "input[0].content[0].text", "must be a string"),
    ({"input": [user([{"type": "input_image", "image_url": "u"}], "system")]}, "input[0].content", "only hold text"),
    ({"input": [fc("", "f")]}, "input[0].call_id", "nonempty string"),
    ({"input": [fc("a", arguments={})]}, "input[0].arguments", "JSON"),
    ({"input": [{"type": "custom_tool_call", "call_id": "a", "name": "f"}]}, "input[0].input", "must be a string"),
    ({"input": [user("x"), out("a", 5)]}, "input[1].output", "string or a list"),
    ({"input": [user("x"), {"type": "function_call_output", "output": "x"}]}, "input[1].call_id", "nonempty"),
    ({"input": "x", "tools": {"type": "function"}}, "tools", "must be a list"),
    ({"input": "x", "tools": [{"name": "f"}]}, "tools[0]", "string 'type'"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "nonempty string"),
    ({"input": "x", "tools": [tool("f"), tool("f")]}, "tools[1].name", "share the name"),
    ({"input": "x", "tools": [{"type": "namespace", "name": "n", "tools": 1}]}, "tools[0].tools", "must be a list"),
    ({"input": "x", "tools": [tool("f", parameters=[])]}, "tools[0].parameters", "JSON schema"),
    ({"input": "x", "tools": [tool("f")], "tool_choice": "sometimes"}, "tool_choice", "must be 'auto'"),
    ({"input": "x", "tools": [tool("f")], "tool_choice": {"type": "custom", "name": "g"}}, "tool_choice.name", "tool"),
    ({"input": "x", "tools": [tool("f")], "tool_choice": {"type": "web_search"}}, "tool_choice", "hosted tool"),
    ({"input": "x", "tool_choice": {"type": "allowed_tools", "mode": "none", "tools": []}}, "tool_choice", "allowed"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "positive integer"),
    ({"input": "x", "max_output_tokens": True}, "max_output_tokens", "positive integer"),
    ({"input": "x", "temperature": "hot"}, "temperature", "must be a number"),
    ({"input": "x", "stream": "yes"}, "stream", "true or false"),
    ({"input": "x", "store": 1}, "store", "true or false"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema", "JSON schema"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type", "must be 'text'"),
    ({"input": "x", "text": "plain"}, "text", "must be an object"),
    ({"input": "x", "instructions": ["a"]}, "body.instructions", "must be a string"),
    ({"input": "x", "model": 3}, "body.model", "must be a string"),
    ({"input": "x", "previous_response_id": 3}, "body.previous_response_id", "must be a string"),
    ({"input": "x", "background": True}, "background", "not supported"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "not supported"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt", "not supported"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "param", "message"), BAD, ids=[b[2] + "/" + b[1] for b in BAD])
def test_bad_requests_are_client_errors_naming_the_parameter(data: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(ClientInputError) as caught:
        translate_request(data)
    assert caught.value.status == 400
    assert message in caught.value.message and param in (caught.value.param or "")


def test_native_plan_keeps_client_bytes_unless_outputs_move() -> None:
    ordered = orjson.dumps({"model": "m", "input": [fc("a"), fc("b"), out("a"), out("b")], "x": 1})
    assert plan_native_request(ordered).body is ordered
    reversed_ = orjson.dumps({"model": "m", "input": [fc("a"), fc("b"), out("b"), out("a")], "x": 1})
    plan = plan_native_request(reversed_)
    assert [i["call_id"] for i in orjson.loads(plan.body)["input"]] == ["a", "b", "a", "b"]
    assert orjson.loads(plan.body)["x"] == 1 and plan.report.reordered == 1
    with pytest.raises(ClientInputError):
        plan_native_request(b"[]")


# --- the stream transducer -------------------------------------------------------------------


def sdk_replay(events: list[dict[str, Any]]) -> Any:
    """Feed events through the openai SDK's strict stream state; returns its final response."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=omit)
    for event in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=event))  # type: ignore[arg-type]
    return state._completed_response


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call_delta(index: int, call_id: str | None = None, name: str | None = None, args: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if call_id is not None:
        call["id"] = call_id
    return chunk({"tool_calls": [call]})


def plan_with_tools() -> ResponsesPlan:
    namespace = {"type": "namespace", "name": "agents", "description": "d", "tools": [tool("close")]}
    return translate_request(
        {
            "model": "m",
            "input": "go",
            "tools": [tool("get_weather"), {"type": "custom", "name": "apply_patch"}, namespace],
        }
    )


def run(
    chunks: list[dict[str, Any]], plan: ResponsesPlan | None = None
) -> tuple[list[dict[str, Any]], ResponsesStream]:
    stream = ResponsesStream(plan or plan_with_tools(), "resp_t", 7)
    events = stream.start()
    for item in chunks:
        events += stream.feed(item)
    events += stream.finish()
    return events, stream


MIXED = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "Think"}),
    chunk({"reasoning_content": "ing."}),
    chunk({"content": "Let me "}),
    chunk({"content": "check."}),
    call_delta(0, "call_a", "get_weather", '{"city":'),
    call_delta(0, args='"Paris"}'),
    call_delta(1, "call_b", "apply_patch", '{"input": "*** Begin'),
    call_delta(1, args=' Patch"}'),
    call_delta(2, "call_c", "agents__close", '{"target": "x"}'),
    chunk({}, "tool_calls"),
    {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}},
]


def test_stream_of_every_item_kind_satisfies_the_sdk_and_numbers_every_event() -> None:
    events, stream = run(MIXED)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = sdk_replay(events)
    assert final is not None and final.id == "resp_t" and final.status == "completed"
    reasoning, message, weather, patch, close = final.output
    assert reasoning.content[0].text == "Thinking."
    assert message.content[0].text == "Let me check."
    assert (weather.type, weather.call_id, weather.name, weather.arguments) == (
        "function_call",
        "call_a",
        "get_weather",
        '{"city":"Paris"}',
    )
    assert (patch.type, patch.call_id, patch.name, patch.input) == (
        "custom_tool_call",
        "call_b",
        "apply_patch",
        "*** Begin Patch",
    )
    assert (close.name, close.namespace, close.call_id) == ("close", "agents", "call_c")
    assert final.usage.input_tokens == 11 and final.usage.output_tokens == 5
    assert stream.response["output"] == events[-1]["response"]["output"] and stream.completed
    assert len({e["item"]["id"] for e in events if e["type"] == "response.output_item.added"}) == 5


def test_any_split_of_the_text_gives_the_same_response() -> None:
    text = "Hello, wörld."
    args = '{"city": "Paris"}'
    whole, _ = run([chunk({"content": text}), call_delta(0, "c", "get_weather", args), chunk({}, "tool_calls")])
    for cut in range(1, len(text)):
        for arg_cut in (1, len(args) // 2, len(args) - 1):
            parts = [
                chunk({"content": text[:cut]}),
                chunk({"content": text[cut:]}),
                call_delta(0, "c", "get_weather", args[:arg_cut]),
                call_delta(0, args=args[arg_cut:]),
                chunk({}, "tool_calls"),
            ]
            events, _ = run(parts)
            assert events[-1]["response"] == whole[-1]["response"]
            assert sdk_replay(events) is not None


def test_a_call_whose_name_arrives_late_is_announced_with_its_held_arguments() -> None:
    events, _ = run([call_delta(0, "c", None, '{"a"'), call_delta(0, None, "get_weather", ": 1}"), chunk({}, "stop")])
    added = [e for e in events if e["type"] == "response.output_item.added"]
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(added) == 1 and added[0]["item"]["name"] == "get_weather"
    assert deltas == ['{"a": 1}']
    assert sdk_replay(events).output[0].arguments == '{"a": 1}'


def test_missing_call_id_is_generated_and_unique() -> None:
    events, _ = run([call_delta(0, None, "get_weather"), call_delta(1, None, "get_weather"), chunk({}, "stop")])
    ids = [item["call_id"] for item in events[-1]["response"]["output"]]
    assert len(set(ids)) == 2 and all(ids)


def test_token_limit_ends_incomplete_with_the_open_item_incomplete() -> None:
    events, stream = run([chunk({"content": "Half a sen"}, "length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    assert stream.completed
    sdk_replay(events)  # accepted, though (as with the real API) there is no completed response


def test_content_filter_ends_incomplete_too() -> None:
    events, _ = run([chunk({"content": "no"}), chunk({}, "content_filter")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}


def test_empty_answer_completes_with_an_empty_output() -> None:
    events, _ = run([chunk({"role": "assistant"}), chunk({}, "stop")])
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.completed"]
    assert sdk_replay(events).output == []


def test_failure_finishes_the_open_item_then_reports_failed() -> None:
    stream = ResponsesStream(plan_with_tools(), "resp_f", 0)
    events = stream.start() + stream.feed(chunk({"content": "par"}))
    events += stream.fail(UpstreamError("upstream http://e broke off"))
    failed = failed_response(events)
    assert "broke off" in failed["error"]["message"] and failed["output"][0]["status"] == "incomplete"
    assert not stream.completed
    sdk_replay(events)


def test_failure_before_start_still_opens_with_created() -> None:
    stream = ResponsesStream(plan_with_tools(), "resp_f", 0)
    events = stream.fail(UpstreamError("gone"))
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]


def test_failure_while_a_call_waits_for_its_name_drops_it() -> None:
    stream = ResponsesStream(plan_with_tools(), "resp_f", 0)
    events = stream.start() + stream.feed(call_delta(0, "c", None, "{"))
    events += stream.fail(UpstreamError("gone"))
    assert events[-1]["response"]["output"] == []
    sdk_replay(events)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([call_delta(0, "a", "get_weather"), chunk({"content": "x"}), call_delta(0, args="{}")], "resumed tool call 0"),
        ([call_delta(0, "a", None, "{}")], "without a function name"),
        ([{"choices": {"index": 0}}], "not a list"),
        ([{"choices": [{"index": 1, "delta": {}}]}], "more than one choice"),
        ([{"choices": [{"index": 0, "delta": "text"}]}], "malformed delta"),
        ([chunk({"tool_calls": ["x"]})], "malformed tool call"),
        ([chunk({"tool_calls": [{"index": "0"}]})], "malformed tool call"),
    ],
)
def test_impossible_engine_streams_raise_upstream_errors(chunks: list[dict[str, Any]], message: str) -> None:
    stream = ResponsesStream(plan_with_tools(), "resp_x", 0)
    stream.start()
    with pytest.raises(UpstreamError, match=message):
        for item in chunks:
            stream.feed(item)
        stream.finish()


def test_driving_the_transducer_out_of_order_is_a_state_error() -> None:
    stream = ResponsesStream(plan_with_tools(), "resp_x", 0)
    with pytest.raises(StreamStateError):
        stream.feed(chunk({"content": "x"}))
    with pytest.raises(StreamStateError):
        stream.finish()
    stream.start()
    with pytest.raises(StreamStateError):
        stream.start()
    stream.finish()
    for step in (stream.finish, lambda: stream.fail(UpstreamError("x")), lambda: stream.feed({})):
        with pytest.raises(StreamStateError):
            step()


def test_encoded_events_are_named_sse_frames() -> None:
    events, _ = run([chunk({"content": "hi"}, "stop")])
    decoder = EventDecoder()
    decoded = decoder.feed(encode(events))
    assert [e.event for e in decoded] == [e["type"] for e in events]
    assert [json.loads(e.data) for e in decoded] == events


# --- whole completions -----------------------------------------------------------------------


def test_completion_with_every_kind_of_output() -> None:
    completion = {
        "model": "engine-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "On it.",
                    "reasoning": "Need tools.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "apply_patch", "arguments": '{"input":"p"}'},
                        },
                        {"id": "call_3", "type": "function", "function": {"name": "agents__close", "arguments": "{}"}},
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}},
    }
    response = chat_to_response(completion, plan_with_tools(), "resp_c", 5)
    assert (response["id"], response["object"], response["created_at"], response["status"]) == (
        "resp_c",
        "response",
        5,
        "completed",
    )
    assert response["model"] == "m"
    kinds = [(o["type"], o.get("call_id"), o.get("name"), o.get("namespace")) for o in response["output"]]
    assert kinds == [
        ("reasoning", None, None, None),
        ("message", None, None, None),
        ("function_call", "call_1", "get_weather", None),
        ("custom_tool_call", "call_2", "apply_patch", None),
        ("function_call", "call_3", "close", "agents"),
    ]
    assert response["output"][3]["input"] == "p"
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Need tools."}]
    assert response["usage"] == {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 13,
    }


def test_custom_call_with_arguments_that_are_not_the_wrapper_keeps_them_raw() -> None:
    completion = {
        "choices": [
            {
                "message": {"tool_calls": [{"id": "c", "function": {"name": "apply_patch", "arguments": "raw text"}}]},
                "finish_reason": "tool_calls",
            }
        ]
    }
    response = chat_to_response(completion, plan_with_tools(), "resp_c", 5)
    assert response["output"][0]["input"] == "raw text" and response["usage"] is None


@pytest.mark.parametrize(
    "completion",
    [
        {},
        {"choices": []},
        {"choices": [1]},
        {"choices": [{"message": "x"}]},
        {"choices": [{"message": {"tool_calls": [3]}}]},
    ],
)
def test_completions_without_a_message_are_upstream_errors(completion: dict[str, Any]) -> None:
    with pytest.raises(UpstreamError):
        chat_to_response(completion, plan_with_tools(), "resp_c", 5)


def test_the_sdk_replay_is_strict_enough_to_catch_broken_streams() -> None:
    events, _ = run(MIXED)
    with pytest.raises(RuntimeError, match=r"response\.created"):
        sdk_replay(events[1:])
    no_added = [e for e in events if not (e["type"] == "response.output_item.added" and e["output_index"] == 1)]
    with pytest.raises(RuntimeError, match="before receiving its output item"):
        sdk_replay(no_added)
    duplicate = copy.deepcopy(events)
    for event in duplicate:
        if event.get("output_index") == 2:
            event["output_index"] = 1
    with pytest.raises(RuntimeError):
        sdk_replay(duplicate)


def _with_logprobs(content: str, tokens: list[str], finish: str | None = None) -> dict[str, Any]:
    entries = [{"token": t, "logprob": -0.25, "top_logprobs": [{"token": t, "logprob": -0.25}]} for t in tokens]
    return {
        "choices": [
            {"index": 0, "delta": {"content": content}, "logprobs": {"content": entries}, "finish_reason": finish}
        ]
    }


def test_token_logprobs_ride_on_the_text_they_spell_and_held_back_ones_on_done() -> None:
    plan = translate_request({"model": "m", "input": "hi", "top_logprobs": 1})
    assert (plan.chat["logprobs"], plan.chat["top_logprobs"]) == (True, 1)
    # The engine client holds back "<" (it may begin an end marker) and lets it out with "b"; the
    # last "<|" is held when the token limit cuts the reply, so its text never comes.
    chunks = [_with_logprobs("Hi", ["Hi"]), _with_logprobs("", ["<"]), _with_logprobs("<b", ["b"])]
    events, stream = run([*chunks, _with_logprobs("", ["<|"]), _with_logprobs("", [], "length")], plan)
    deltas = [[x["token"] for x in e["logprobs"]] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == [["Hi"], ["<", "b"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert [x["token"] for x in done["logprobs"]] == ["Hi", "<", "b", "<|"] and done["text"] == "Hi<b"
    part = stream.response["output"][0]["content"][0]
    assert part["logprobs"] == done["logprobs"] and part["logprobs"][0] == {
        "token": "Hi",
        "logprob": -0.25,
        "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]}],
    }
    sdk_replay(events)  # the SDK's strict stream state takes every event


@pytest.mark.parametrize(
    ("asked", "chat"),
    [
        ({"top_logprobs": 3}, (True, 3)),
        ({"include": ["message.output_text.logprobs"]}, (True, 0)),
        ({"include": ["reasoning.encrypted_content"]}, (None, None)),
        ({"top_logprobs": 0}, (None, None)),  # as the refusal reads it: no alternatives asks for nothing
        ({"top_logprobs": 0, "include": ["message.output_text.logprobs"]}, (True, 0)),
        ({}, (None, None)),
    ],
)
def test_logprobs_are_asked_of_the_engine_only_when_the_client_asks(
    asked: dict[str, Any], chat: tuple[Any, Any]
) -> None:
    plan = translate_request({"model": "m", "input": "hi", **asked})
    assert (plan.chat.get("logprobs"), plan.chat.get("top_logprobs")) == chat


@pytest.mark.parametrize("bad", [21, -1, True, "3", 2.5])
def test_top_logprobs_outside_0_to_20_is_a_400_naming_it(bad: Any) -> None:
    with pytest.raises(ClientInputError) as caught:
        translate_request({"model": "m", "input": "hi", "top_logprobs": bad})
    assert caught.value.param == "top_logprobs"
