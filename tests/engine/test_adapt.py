"""Each request adaptation rule on its own, then all of them together, per engine kind."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.engine.adapt import (
    RULES,
    adapt_chat_request,
    adapt_messages,
    fill_tool_parameters,
    json_schema_as_json_object,
    move_tool_images,
    narrow_allowed_tools,
    refuse_custom_tools,
    refuse_multiple_choices,
    refuse_unseen_media,
    rename_max_completion_tokens,
)
from proxy.engine.kinds import ENGINES, EngineKind, engine_profile
from proxy.errors import ClientInputError

LCP = engine_profile("llama-cpp-python")
LCP_VISION = engine_profile("llama-cpp-python", vision=True)
GENERIC = engine_profile("generic")
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
CALL = {"id": "call_a", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
TEXT_A = {"type": "text", "text": "a"}
CALL_B = {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": "{}"}}


def msgs(*messages: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


REWRITES = [
    (adapt_messages, msgs({"role": "assistant", "content": None, "tool_calls": [CALL]}),
     msgs({"role": "assistant", "content": "", "tool_calls": [CALL]})),
    (adapt_messages, msgs({"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}),
     msgs({"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}})),
    (adapt_messages, msgs({"role": "developer", "content": "Be brief."}),
     msgs({"role": "system", "content": "Be brief."})),
    (adapt_messages, msgs({"role": "developer", "content": [TEXT_A, {"type": "text", "text": "b"}]}),
     msgs({"role": "system", "content": "a\nb"})),
    (adapt_messages, msgs({"role": "system", "content": [{"type": "text", "text": "Be brief."}]}),
     msgs({"role": "system", "content": "Be brief."})),
    (adapt_messages, msgs({"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "18C"}]}),
     msgs({"role": "tool", "tool_call_id": "c", "content": "18C"})),
    (adapt_messages,
     msgs({"role": "assistant", "content": [{"type": "text", "text": "No."},
                                             {"type": "refusal", "refusal": "Can't."}]}),
     msgs({"role": "assistant", "content": "No.\nCan't."})),
    (adapt_messages, msgs({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
     msgs({"role": "user", "content": "hi"})),
    (fill_tool_parameters, msgs(tools=[{"type": "function", "function": {"name": "now"}}]),
     msgs(tools=[{"type": "function",
                  "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}])),
    (narrow_allowed_tools,
     msgs(tools=[{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}],
          tool_choice={"type": "allowed_tools", "allowed_tools": {
              "mode": "required", "tools": [{"type": "function", "function": {"name": "b"}}]}}),
     msgs(tools=[{"type": "function", "function": {"name": "b"}}], tool_choice="required")),
    (rename_max_completion_tokens, msgs(max_completion_tokens=64), msgs(max_tokens=64)),
    (rename_max_completion_tokens, msgs(max_completion_tokens=64, max_tokens=32), msgs(max_tokens=32)),
    (rename_max_completion_tokens, msgs(max_completion_tokens=None), msgs()),
    (json_schema_as_json_object,
     msgs(response_format={"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                                                  "schema": {"type": "object"}}}),
     msgs(response_format={"type": "json_object", "schema": {"type": "object"}})),
    (json_schema_as_json_object, msgs(response_format={"type": "json_schema", "json_schema": {"name": "p"}}),
     msgs(response_format={"type": "json_object"})),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "body", "expected"), REWRITES)
def test_rule_rewrites_what_llama_cpp_python_rejects(rule: Any, body: dict[str, Any], expected: Any) -> None:
    before = copy.deepcopy(body)
    assert rule(body, LCP) == expected
    assert body == before  # the caller's objects are never mutated


@pytest.mark.parametrize(("rule", "body", "expected"), REWRITES)
def test_rule_leaves_a_generic_engine_alone(rule: Any, body: dict[str, Any], expected: Any) -> None:
    assert rule(body, GENERIC) is body


KEPT = [
    msgs({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "tool_calls": [CALL]}),
    msgs({"role": "assistant", "tool_calls": [CALL]}),  # content absent, not null: accepted as is
    msgs({"role": "system", "content": None}, {"role": "tool", "tool_call_id": "c", "content": None}),
    msgs(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}], tool_choice="auto"),
    msgs(response_format={"type": "json_object"}, max_tokens=3, n=1),
]


@pytest.mark.parametrize("body", KEPT)
def test_bodies_the_engine_accepts_come_back_as_the_same_object(body: dict[str, Any]) -> None:
    adapted, fired = adapt_chat_request(body, LCP)
    assert adapted is body and fired == ()


REFUSALS = [
    (refuse_multiple_choices, msgs(n=2), "'n' = 2", "n"),
    (refuse_multiple_choices, msgs(n=0), "positive integer", "n"),
    (refuse_unseen_media, msgs({"role": "user", "content": [{"type": "text", "text": "?"}, IMAGE]}),
     "cannot see images", "messages[0].content[1]"),
    (refuse_unseen_media, msgs({"role": "tool", "tool_call_id": "c", "content": [IMAGE]}), "cannot see images",
     "messages[0].content[0]"),
    (refuse_unseen_media,
     msgs({"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}),
     "cannot read input_audio", "messages[0].content[0]"),
    (refuse_unseen_media, msgs({"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}),
     "cannot read file", "messages[0].content[0]"),
    (refuse_custom_tools, msgs(tools=[{"type": "custom", "custom": {"name": "sh"}}]), "only function tools",
     "tools[0]"),
    (refuse_custom_tools, msgs(tool_choice={"type": "custom", "custom": {"name": "sh"}}), "only function tools",
     "tool_choice"),
    (refuse_custom_tools,
     msgs({"role": "assistant",
           "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "sh", "input": "ls"}}]}),
     "only function tool calls", "messages[0].tool_calls[0]"),
    (adapt_messages, msgs({"role": "system", "content": [{"type": "text", "text": "a"}, IMAGE]}),
     "only text parts fit here", "messages[0]"),
    (narrow_allowed_tools, msgs(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "sometimes"}}),
     "needs a mode", "tool_choice"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "body", "message", "param"), REFUSALS)
def test_requests_the_engine_cannot_serve_are_clear_400s(rule: Any, body: Any, message: str, param: str) -> None:
    with pytest.raises(ClientInputError, match=message) as caught:
        rule(body, LCP)
    assert caught.value.status == 400 and caught.value.param == param


def test_images_pass_for_a_vision_model_and_leave_tool_messages() -> None:
    body = msgs(
        {"role": "user", "content": [{"type": "text", "text": "Compare."}, IMAGE]},
        {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_B]},
        {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "shot taken"}, IMAGE]},
        {"role": "tool", "tool_call_id": "call_b", "content": [IMAGE]},
        {"role": "user", "content": "Which is brighter?"},
    )
    before = copy.deepcopy(body)
    adapted, fired = adapt_chat_request(body, LCP_VISION)
    assert body == before
    assert fired == ("move_tool_images", "adapt_messages")
    messages = adapted["messages"]
    assert messages[0] is body["messages"][0]  # a vision handler renders the user's list itself
    assert messages[1]["content"] == ""
    assert messages[2] == {"role": "tool", "tool_call_id": "call_a", "content": "shot taken"}
    placeholder = "[image output follows in the next message]"
    assert messages[3] == {"role": "tool", "tool_call_id": "call_b", "content": placeholder}
    assert messages[4] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Image output of the call shot (call_a):"},
            IMAGE,
            {"type": "text", "text": "Image output of the call read (call_b):"},
            IMAGE,
        ],
    }
    assert messages[5] == {"role": "user", "content": "Which is brighter?"}


def test_images_at_the_end_of_the_conversation_move_too() -> None:
    body = msgs(
        {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_a", "content": [IMAGE]}
    )
    messages = move_tool_images(body, LCP_VISION)["messages"]
    assert [m["role"] for m in messages] == ["assistant", "tool", "user"]
    assert messages[2]["content"][1] is IMAGE


def test_every_rule_is_applied_in_one_call() -> None:
    body = msgs(
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "ok"}]},
        max_completion_tokens=10,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        tools=[{"type": "function", "function": {"name": "shot"}}],
    )
    adapted, fired = adapt_chat_request(body, LCP)
    assert set(fired) == {"adapt_messages", "fill_tool_parameters", "rename_max_completion_tokens",
                          "json_schema_as_json_object"}  # fmt: skip
    assert [m["content"] for m in adapted["messages"]] == ["Be brief.", "", "ok"]
    assert adapted["max_tokens"] == 10 and "max_completion_tokens" not in adapted
    assert adapted["response_format"] == {"type": "json_object", "schema": {"type": "object"}}


def test_the_table_has_every_kind_and_generic_trusts_the_engine() -> None:
    assert set(ENGINES) == set(EngineKind) - {EngineKind.AUTO}  # auto is resolved before a profile is read
    anything = msgs({"role": "developer", "content": None}, n=3, max_completion_tokens=1, tools=[{"type": "custom"}])
    assert all(rule(anything, GENERIC) is anything for rule in RULES)
    with pytest.raises(ValueError, match="unknown engine kind 'vllm'"):
        engine_profile("vllm")
    assert engine_profile("llama-server", vision=False).refuses_unseen_media
    assert "user" in LCP_VISION.list_content_roles and "user" not in LCP.list_content_roles


LCP_NO_LOGPROBS = engine_profile("llama-cpp-python", logprobs=False)


def test_logprobs_for_an_engine_without_them_are_refused_by_name() -> None:
    from proxy.engine.adapt import refuse_completion_logprobs, refuse_logprobs, refuse_responses_logprobs

    for extra, param in (({"logprobs": True}, "logprobs"), ({"top_logprobs": 0}, "top_logprobs")):
        with pytest.raises(ClientInputError, match="engine_logprobs") as refused:
            refuse_logprobs(msgs(**extra), LCP_NO_LOGPROBS)
        assert refused.value.param == param and refused.value.status == 400
    with pytest.raises(ClientInputError, match="--logprobs"):
        refuse_completion_logprobs(b'{"prompt": "x", "logprobs": 0}', LCP_NO_LOGPROBS)
    with pytest.raises(ClientInputError, match="include"):
        refuse_responses_logprobs({"include": ["message.output_text.logprobs"]}, LCP_NO_LOGPROBS)
    with pytest.raises(ClientInputError, match="top_logprobs"):
        refuse_responses_logprobs({"top_logprobs": 5}, LCP_NO_LOGPROBS)
    # Asking for none passes; so does everything where the engine serves them.
    for body in (msgs(logprobs=False), msgs(logprobs=None), msgs()):
        assert refuse_logprobs(body, LCP_NO_LOGPROBS) is body
    refuse_completion_logprobs(b'{"prompt": "logprobs", "logprobs": null}', LCP_NO_LOGPROBS)
    refuse_completion_logprobs(b"not json logprobs", LCP_NO_LOGPROBS)
    refuse_responses_logprobs({"top_logprobs": 0, "include": ["reasoning.encrypted_content"]}, LCP_NO_LOGPROBS)
    for profile in (LCP, GENERIC, engine_profile("generic", logprobs=False)):
        body = msgs(logprobs=True, top_logprobs=2)
        assert refuse_logprobs(body, profile) is body
        refuse_completion_logprobs(b'{"logprobs": 2}', profile)
        refuse_responses_logprobs({"top_logprobs": 2}, profile)
