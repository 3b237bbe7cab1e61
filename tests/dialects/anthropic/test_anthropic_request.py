"""Anthropic request -> Chat Completions request: one test per mapping rule."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from proxy.dialects.anthropic.request import (
    assistant_message,
    chat_tools,
    normalize_billing_stamp,
    plan_native,
    plan_translation,
    sampling_fields,
    system_messages,
    thinking_fields,
    tool_choice_fields,
    tool_message,
    translate_request,
    user_turn,
)
from proxy.errors import ClientInputError

PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


HI = [{"role": "user", "content": "hi"}]


def translate(**body: Any) -> dict[str, Any]:
    return translate_request({"model": "claude", "max_tokens": 16, **body})


# --- system


def test_system_string_and_blocks_become_one_system_message() -> None:
    assert system_messages("Be brief.") == [{"role": "system", "content": "Be brief."}]
    blocks = [
        {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "two"},
    ]
    assert system_messages(blocks) == [{"role": "system", "content": "one\ntwo"}]
    assert system_messages(None) == system_messages("") == system_messages([]) == []


def test_system_message_comes_first_and_mid_conversation_system_messages_stay_in_place() -> None:
    chat = translate(
        system="S",
        messages=[
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "system", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"}]},
            {"role": "user", "content": "c"},
        ],
    )
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("system", "S"),
        ("user", "a"),
        ("assistant", "b"),
        ("system", "<system-reminder>r</system-reminder>"),
        ("user", "c"),
    ]


def test_bad_system_is_a_400() -> None:
    with pytest.raises(ClientInputError, match="system"):
        system_messages(42)


# --- user content


def test_user_text_blocks_become_one_string() -> None:
    turn = user_turn([{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {}}])
    assert turn == [{"role": "user", "content": "a\nb"}]


def test_user_images_base64_and_url_become_image_parts() -> None:
    turn = user_turn(
        [
            {"type": "text", "text": "look"},
            {"type": "image", "source": PNG},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        ]
    )
    assert turn == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            ],
        }
    ]


def test_documents_the_engine_cannot_read_become_a_visible_note() -> None:
    turn = user_turn(
        [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain doc"}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
            {"type": "image", "source": {"type": "file", "file_id": "file_1"}},
        ]
    )
    assert turn[0]["content"] == (
        "plain doc\n[application/pdf document: not readable by this engine]\n[image file: not readable by this engine]"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (42, "content must be a string or a list"),
        ([{"text": "no type"}], "must be an object with a type"),
        ([{"type": "text"}], "needs a string 'text'"),
        ([{"type": "image", "source": "x"}], "needs a source object"),
        ([{"type": "image", "source": {"type": "base64", "data": 1}}], "media_type and data"),
        ([{"type": "tool_result", "content": "x"}], "needs a string 'tool_use_id'"),
    ],
)
def test_bad_user_content_is_a_400(content: Any, message: str) -> None:
    with pytest.raises(ClientInputError, match=message):
        translate(messages=[{"role": "user", "content": content}])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hi", "messages must be a list"),
        (["hi"], "a message must be an object"),
        ([{"role": "tool", "content": "x"}], "role must be user, assistant or system"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}], "'name'"),
    ],
)
def test_bad_messages_are_400s(messages: Any, message: str) -> None:
    with pytest.raises(ClientInputError, match=message):
        translate(messages=messages)


# --- assistant content


def test_assistant_text_and_tool_use_become_content_and_tool_calls_with_ids_kept() -> None:
    message = assistant_message(
        [
            {"type": "thinking", "thinking": "need both", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "Grep", "input": {"pattern": "é", "n": [1, 2]}},
            {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}},
            {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
        ]
    )
    assert message == {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "need both",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "Grep", "arguments": '{"pattern": "é", "n": [1, 2]}'},
            },
            {"id": "toolu_2", "type": "function", "function": {"name": "Read", "arguments": "{}"}},
        ],
    }


def test_assistant_string_content_and_tool_only_turns() -> None:
    assert assistant_message([{"type": "text", "text": "hi"}]) == {"role": "assistant", "content": "hi"}
    only_calls = assistant_message([{"type": "tool_use", "id": "t", "name": "f", "input": None}])
    assert only_calls["content"] == "" and only_calls["tool_calls"][0]["function"]["arguments"] == "{}"


# --- tool results


def test_tool_result_content_string_list_and_empty() -> None:
    assert tool_message({"type": "tool_result", "tool_use_id": "a", "content": "out"})["content"] == "out"
    listed = {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}],
    }
    assert tool_message(listed) == {"role": "tool", "tool_call_id": "a", "content": "1\n2"}
    assert tool_message({"type": "tool_result", "tool_use_id": "a"})["content"] == ""


def test_is_error_is_kept_as_a_marker_in_the_text() -> None:
    failed = {"type": "tool_result", "tool_use_id": "a", "is_error": True, "content": "No such file"}
    assert tool_message(failed)["content"] == "Error: No such file"
    fine = {"type": "tool_result", "tool_use_id": "a", "is_error": False, "content": "ok"}
    assert tool_message(fine)["content"] == "ok"


def test_results_come_first_and_the_users_own_text_after_them() -> None:
    turn = user_turn(
        [
            {"type": "text", "text": "Here you go"},
            {"type": "tool_result", "tool_use_id": "a", "content": "A"},
            {"type": "tool_result", "tool_use_id": "b", "content": "B", "cache_control": {"type": "ephemeral"}},
        ]
    )
    assert turn == [
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "user", "content": "Here you go"},
    ]


def test_images_in_results_go_into_a_user_message_after_the_tool_messages() -> None:
    turn = user_turn(
        [
            {
                "type": "tool_result",
                "tool_use_id": "shot",
                "content": [{"type": "text", "text": "screenshot:"}, {"type": "image", "source": PNG}],
            },
            {"type": "tool_result", "tool_use_id": "ls", "content": "a.txt"},
            {"type": "text", "text": "what do you see?"},
        ]
    )
    assert turn[0] == {
        "role": "tool",
        "tool_call_id": "shot",
        "content": "screenshot:\n[image: shown in the next message]",
    }
    assert turn[1] == {"role": "tool", "tool_call_id": "ls", "content": "a.txt"}
    assert turn[2] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Image from the result of tool call shot:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "text", "text": "what do you see?"},
        ],
    }


def test_results_split_across_consecutive_user_messages_form_one_turn() -> None:
    chat = translate(
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in "ab"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "A"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hm"},
                    {"type": "tool_result", "tool_use_id": "b", "content": "B"},
                ],
            },
        ]
    )
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in chat["messages"][2:]] == [
        ("tool", "a", "A"),
        ("tool", "b", "B"),
        ("user", None, "hm"),
    ]


# --- tools and tool_choice


def test_tools_become_functions_and_server_tools_are_left_out() -> None:
    tools = [
        {
            "name": "Grep",
            "description": "search",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        },
        {"name": "Later", "input_schema": {"type": "object", "properties": {}}, "defer_loading": True, "strict": True},
        {"type": "custom", "name": "NoSchema"},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ]
    assert chat_tools(tools) == [
        {"type": "function", "function": {"name": "Grep", "description": "search", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "Later", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "NoSchema", "parameters": {"type": "object", "properties": {}}}},
    ]


@pytest.mark.parametrize(
    ("tools", "message"),
    [("x", "tools must be a list"), (["x"], "a tool must be an object"), ([{"input_schema": {}}], "needs a name"),
     ([{"name": "f", "input_schema": []}], "input_schema must be an object")],
)  # fmt: skip
def test_bad_tools_are_400s(tools: Any, message: str) -> None:
    with pytest.raises(ClientInputError, match=message):
        chat_tools(tools)


@pytest.mark.parametrize(
    ("choice", "fields"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "tool", "name": "Grep"}, {"tool_choice": {"type": "function", "function": {"name": "Grep"}}}),
        ({"type": "auto", "disable_parallel_tool_use": True}, {"tool_choice": "auto", "parallel_tool_calls": False}),
        ({"type": "auto", "disable_parallel_tool_use": False}, {"tool_choice": "auto"}),
        (None, {}),
    ],
)
def test_tool_choice_mapping(choice: Any, fields: dict[str, Any]) -> None:
    assert tool_choice_fields(choice) == fields


@pytest.mark.parametrize("choice", ["auto", {"type": "sometimes"}, {"type": "tool"}])
def test_bad_tool_choice_is_a_400(choice: Any) -> None:
    with pytest.raises(ClientInputError, match="tool_choice"):
        tool_choice_fields(choice)


def test_tool_choice_is_only_sent_with_tools() -> None:
    assert "tool_choice" not in translate(messages=[], tool_choice={"type": "any"})
    with_tools = translate(messages=[], tools=[{"name": "f", "input_schema": {}}], tool_choice={"type": "any"})
    assert with_tools["tool_choice"] == "required"


# --- sampling, metadata, thinking


def test_sampling_fields_map_to_their_chat_names() -> None:
    body = {"max_tokens": 100, "temperature": 0.2, "top_p": 0.9, "top_k": 40, "metadata": {"user_id": '{"device":"x"}'}}
    assert sampling_fields(body) == {
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "user": '{"device":"x"}',
    }
    assert sampling_fields({"metadata": {"user_id": 7}}) == {}


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": "8"},
        {"max_tokens": 0},
        {"max_tokens": 1.5},
        {"temperature": "hot"},
        {"top_k": 0.5},
        {"top_p": True},
    ],
)
def test_bad_sampling_fields_are_400s(body: dict[str, Any]) -> None:
    with pytest.raises(ClientInputError):
        sampling_fields(body)


def test_stop_sequences_are_not_sent_to_the_engine_but_kept_in_the_plan() -> None:
    plan = plan_translation(orjson.dumps({"model": "c", "messages": HI, "stop_sequences": ["END", ""]}))
    assert plan.stop_sequences == ("END",)
    assert "stop" not in plan.chat and "stop_sequences" not in plan.chat
    with pytest.raises(ClientInputError, match="stop_sequences"):
        plan_translation(b'{"messages": [], "stop_sequences": "END"}')


@pytest.mark.parametrize(
    ("thinking", "config", "fields"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, None,
         {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_budget_tokens": 2048}),
        ({"type": "adaptive"}, {"effort": "medium"},
         {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "medium"},
          "reasoning_effort": "medium"}),
        ({"type": "disabled"}, None, {"chat_template_kwargs": {"enable_thinking": False}}),
        (None, {"effort": "max"}, {"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "high"}}),
        (None, {"effort": "unheard-of"}, {}),
        (None, {"format": {"type": "json_schema", "schema": {"type": "object"}}},
         {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}}}),
        (None, None, {}),
    ],
)  # fmt: skip
def test_thinking_and_output_config(thinking: Any, config: Any, fields: dict[str, Any]) -> None:
    assert thinking_fields(thinking, config) == fields


def test_ignored_fields_leave_no_trace() -> None:
    chat = translate(
        messages=[{"role": "user", "content": "x"}],
        context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
        service_tier="auto",
        container="c",
        mcp_servers=[],
        stream=True,
    )
    assert chat == {"model": "claude", "messages": [{"role": "user", "content": "x"}], "max_tokens": 16}


def test_model_is_mapped_by_config_and_the_plan_keeps_the_requested_name() -> None:
    raw = orjson.dumps({"model": "claude-sonnet-4-5", "messages": HI})
    plan = plan_translation(raw, engine_model="gemma-270m")
    assert plan.chat["model"] == "gemma-270m" and plan.model == "claude-sonnet-4-5"
    assert plan_translation(raw).chat["model"] == "claude-sonnet-4-5"
    with pytest.raises(ClientInputError, match="model must be a string"):
        plan_translation(b'{"model": 5, "messages": []}')


# --- ordering and the billing stamp


CALLS = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": i, "name": "Grep", "input": {}} for i in ("slow", "fast")],
}
REVERSED = {
    "role": "user",
    "content": [{"type": "tool_result", "tool_use_id": i, "content": i} for i in ("fast", "slow")],
}


def test_translation_orders_results_first_without_touching_the_input() -> None:
    body = {"model": "c", "messages": [{"role": "user", "content": "go"}, CALLS, REVERSED]}
    snapshot = copy.deepcopy(body)
    plan = plan_translation(orjson.dumps(body))
    assert [m.get("tool_call_id") for m in plan.chat["messages"]] == [None, None, "slow", "fast"]
    assert plan.report.reordered == 1 and body == snapshot


def test_native_plan_forwards_the_same_bytes_unless_something_moved() -> None:
    ordered = orjson.dumps({"model": "c", "messages": [CALLS, {**REVERSED, "content": REVERSED["content"][::-1]}]})
    assert plan_native(ordered).body is ordered
    moved = plan_native(orjson.dumps({"model": "c", "messages": [CALLS, REVERSED]}))
    assert [b["tool_use_id"] for b in orjson.loads(moved.body)["messages"][1]["content"]] == ["slow", "fast"]
    renamed = orjson.loads(plan_native(ordered, engine_model="local").body)
    assert renamed["model"] == "local"


STAMP = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;"


def test_billing_stamp_is_normalized_in_string_and_block_systems() -> None:
    fixed = STAMP.replace("fa690", "00000")
    assert normalize_billing_stamp({"system": STAMP + "\nYou are"})["system"] == fixed + "\nYou are"
    blocks = {
        "system": [
            {"type": "text", "text": STAMP},
            {"type": "text", "text": "You are Claude Code", "cache_control": {}},
        ]
    }
    out = normalize_billing_stamp(blocks)
    assert out["system"][0] == {"type": "text", "text": fixed}
    assert out["system"][1] is blocks["system"][1]
    assert blocks["system"][0]["text"] == STAMP  # not mutated
    plain = {"system": "cch=12345 outside a stamp is left alone"}
    assert normalize_billing_stamp(plain) is plain


def test_billing_stamp_setting_decides_what_reaches_the_engine() -> None:
    raw = orjson.dumps({"model": "c", "system": STAMP, "messages": HI})
    assert "cch=00000" in plan_translation(raw).chat["messages"][0]["content"]
    assert "cch=fa690" in plan_translation(raw, normalize_stamp=False).chat["messages"][0]["content"]
    assert plan_native(raw, normalize_stamp=False).body is raw
    assert b"cch=00000" in plan_native(raw).body
