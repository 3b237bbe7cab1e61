"""The route plan per request (proxy/engine/route.py): pure, no network."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import ApiMode
from proxy.engine.kinds import engine_profile
from proxy.engine.route import ROUTE_REASONS, RoutePlan, plan_route

LLAMA = engine_profile("llama-server")
GENERIC = engine_profile("generic")
AUTO, NATIVE, TRANSLATE = ApiMode.AUTO, ApiMode.NATIVE, ApiMode.TRANSLATE
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


@pytest.mark.parametrize(
    ("body", "reason", "detail"),
    [
        ({"input": "hi", "tools": [TOOL]}, "whole", ""),
        ({"input": [{"role": "user", "content": "hi"}, CALL, OUTPUT]}, "whole", ""),
        ({"input": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "t"}], "summary": []}]},
         "whole", ""),
        ({"tools": [TOOL, {"type": "namespace", "name": "multi_agent_v1"}, {"type": "web_search"}]},
         "tool_type", "namespace,web_search"),
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tool_type", "custom"),
        ({"tools": [{"type": "x\r\nSet-Cookie: a"}]}, "tool_type", "xSet-Cookie:a"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", ""),
        ({"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
         "assistant_item_without_type", "input[1]"),
        ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}]},
         "reasoning_without_content", "input[0]"),
        ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "xyz"}]},
         "reasoning_without_content", "input[0]"),
        ({"input": [CALL, {**OUTPUT, "output": [{"type": "output_text", "text": "ok"}]}]},
         "tool_output_parts", "input[1]"),
    ],
)  # fmt: skip
def test_a_responses_request_goes_native_only_when_llama_server_takes_it_whole(
    body: Any, reason: str, detail: str
) -> None:
    plan = plan_route("/v1/responses", body, AUTO, NATIVE, LLAMA)
    assert plan == RoutePlan(NATIVE if reason == "whole" else TRANSLATE, reason, detail)
    assert plan.reason in ROUTE_REASONS


def test_a_named_mode_always_wins_and_a_generic_engine_is_always_translated() -> None:
    lossy = {"tools": [{"type": "namespace"}]}
    assert plan_route("/v1/responses", lossy, NATIVE, NATIVE, LLAMA) == RoutePlan(NATIVE, "setting")
    assert plan_route("/v1/responses", {}, TRANSLATE, NATIVE, LLAMA) == RoutePlan(TRANSLATE, "setting")
    assert plan_route("/v1/responses", {}, AUTO, TRANSLATE, GENERIC) == RoutePlan(TRANSLATE, "engine_kind")
    assert plan_route("/v1/messages", None, AUTO, NATIVE, LLAMA).header == "native; reason=whole"


def test_a_body_that_is_not_an_object_is_left_to_the_native_route_to_refuse() -> None:
    assert plan_route("/v1/responses", [1, 2], AUTO, NATIVE, LLAMA).mode is NATIVE
