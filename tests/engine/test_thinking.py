"""Each API's thinking controls as the engine's switch (proxy/engine/thinking.py): pure, no network."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.engine.thinking import (
    NO_SWITCH,
    ThinkingSwitch,
    anthropic_switch,
    chat_switch,
    responses_switch,
    with_switch,
)
from proxy.errors import ClientInputError


@pytest.mark.parametrize(
    ("thinking", "config", "switch"),
    [
        ({"type": "enabled", "budget_tokens": 4096}, None, ThinkingSwitch(True, None, 4096)),
        ({"type": "enabled"}, None, ThinkingSwitch(True)),
        ({"type": "enabled", "budget_tokens": "lots"}, None, ThinkingSwitch(True)),
        ({"type": "enabled", "budget_tokens": True}, None, ThinkingSwitch(True)),
        ({"type": "adaptive"}, {"effort": "medium"}, ThinkingSwitch(True, "medium")),
        ({"type": "adaptive", "budget_tokens": 9}, None, ThinkingSwitch(True)),  # only enabled carries a budget
        ({"type": "between_tools"}, None, ThinkingSwitch(True)),
        ({"type": "disabled"}, None, ThinkingSwitch(False)),
        ({"type": "disabled"}, {"effort": "low"}, ThinkingSwitch(False, "low")),
        (None, {"effort": "xhigh"}, ThinkingSwitch(None, "high")),
        (None, {"effort": "max"}, ThinkingSwitch(None, "high")),
        (None, {"effort": "unheard-of"}, NO_SWITCH),
        ({"type": "sometimes"}, None, NO_SWITCH),
        (None, None, NO_SWITCH),
    ],
)
def test_anthropic_thinking_and_effort(thinking: Any, config: Any, switch: ThinkingSwitch) -> None:
    assert anthropic_switch(thinking, config) == switch


def test_anthropic_thinking_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ClientInputError, match="thinking must be an object"):
        anthropic_switch("on")


@pytest.mark.parametrize(
    ("effort", "switch"),
    [
        ("none", ThinkingSwitch(False)),
        ("minimal", ThinkingSwitch(True, "low")),
        ("low", ThinkingSwitch(True, "low")),
        ("medium", ThinkingSwitch(True, "medium")),
        ("high", ThinkingSwitch(True, "high")),
        ("xhigh", ThinkingSwitch(True, "high")),
        ("extreme", NO_SWITCH),
        (None, NO_SWITCH),
        (3, NO_SWITCH),
    ],
)
def test_openai_efforts_on_responses_and_chat(effort: Any, switch: ThinkingSwitch) -> None:
    assert responses_switch({"effort": effort}) == switch
    assert chat_switch({"reasoning_effort": effort}) == switch


def test_responses_without_a_reasoning_object_asks_nothing() -> None:
    assert responses_switch(None) == NO_SWITCH and responses_switch("high") == NO_SWITCH


@pytest.mark.parametrize(
    ("body", "switch", "expected"),
    [
        ({}, ThinkingSwitch(False), {"chat_template_kwargs": {"enable_thinking": False}}),
        ({}, ThinkingSwitch(True, "high", 512),
         {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"},
          "reasoning_budget_tokens": 512}),
        # the client's own kwargs win key by key, and keep their other keys
        ({"chat_template_kwargs": {"enable_thinking": True, "x": 1}}, ThinkingSwitch(False, "low"),
         {"chat_template_kwargs": {"enable_thinking": True, "x": 1, "reasoning_effort": "low"}}),
        # a budget for thinking the client turned off is not sent; nor over the client's own budget
        ({"chat_template_kwargs": {"enable_thinking": False}}, ThinkingSwitch(True, None, 64),
         {"chat_template_kwargs": {"enable_thinking": False}}),
        ({"reasoning_budget_tokens": 8}, ThinkingSwitch(True, None, 64),
         {"reasoning_budget_tokens": 8, "chat_template_kwargs": {"enable_thinking": True}}),
    ],
)  # fmt: skip
def test_the_switch_as_the_engine_reads_it(body: Any, switch: ThinkingSwitch, expected: Any) -> None:
    before = copy.deepcopy(body)
    assert with_switch(body, switch) == expected
    assert body == before  # the caller's body is never changed


def test_nothing_to_add_gives_the_same_body_back() -> None:
    asked = {"chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"}}
    assert with_switch(asked, ThinkingSwitch(True, "high")) is asked
    plain = {"model": "m"}
    assert with_switch(plain, NO_SWITCH) is plain


def test_a_route_that_takes_no_budget_gets_none() -> None:
    assert with_switch({}, ThinkingSwitch(True, None, 64), budget=False) == {
        "chat_template_kwargs": {"enable_thinking": True}
    }


def test_template_kwargs_that_are_not_an_object_are_refused() -> None:
    with pytest.raises(ClientInputError, match="chat_template_kwargs must be an object"):
        with_switch({"chat_template_kwargs": "think"}, ThinkingSwitch(True))
