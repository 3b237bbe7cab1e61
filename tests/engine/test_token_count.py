"""Rendering a chat body the way serve's engine does, checked against llama-cpp-python in the engine's process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.dialects.anthropic.request import plan_translation
from proxy.engine.token_count import ChatTemplate, TemplateError, estimate_tokens
from tests.real_engine import TEMPLATE
from tests.support.conversations import anthropic_calls, tool_use

server_types = pytest.importorskip("llama_cpp.server.types")


def engine_prompt(chat_format: Any, body: dict[str, Any]) -> str:
    """What the engine's server renders: its request model, then its template-file formatter."""
    request = server_types.CreateChatCompletionRequest(**body).model_dump()
    formatter = chat_format.hf_tokenizer_config_to_chat_formatter(orjson.loads(TEMPLATE.read_bytes()))
    result = formatter(
        messages=request["messages"],
        functions=request["functions"],
        function_call=request["function_call"],
        tools=request["tools"],
        tool_choice=request["tool_choice"],
    )
    return str(result.prompt)


def anthropic(**body: Any) -> dict[str, Any]:
    return plan_translation(orjson.dumps({"model": "claude", "max_tokens": 8, **body})).chat


GREP = {
    "name": "Grep",
    "description": "Search <files> & 'dirs'",
    "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
    "cache_control": {"type": "ephemeral"},
}
TURNS = [
    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                 {"type": "text", "text": "find é"}]},
    anthropic_calls(
        tool_use("toolu_a", "Grep", {"pattern": "slow"}),
        tool_use("toolu_b", "Grep", {"pattern": "fast"}),
        thinking="two searches",
        text="Searching.",
    ),
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "b.py:1"},
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": [{"type": "text", "text": "a.py:9"}],
             "is_error": True},
        ],
    },
    {"role": "system", "content": "reminder"},
]  # fmt: skip


@pytest.mark.parametrize(
    "body",
    [
        anthropic(messages=[{"role": "user", "content": "Hi"}]),
        anthropic(system="Be brief.", messages=[{"role": "user", "content": "Hi"}]),
        anthropic(system="S", messages=TURNS, tools=[GREP], tool_choice={"type": "auto"}),
        anthropic(messages=TURNS, tools=[GREP, {**GREP, "name": "Other", "strict": True}], tool_choice={"type": "any"}),
    ],
    ids=["plain", "system", "tools-history", "tools-no-system"],
)
def test_render_matches_the_engine_exactly(body: dict[str, Any], engine_chat_format: Any) -> None:
    assert ChatTemplate.from_file(TEMPLATE).render(body) == engine_prompt(engine_chat_format, body)


def test_extra_keys_never_reach_the_template() -> None:
    template = ChatTemplate("{{ messages | tojson }}|{{ tools | tojson }}", "<s>", "</s>")
    body = {
        "messages": [
            {"role": "assistant", "content": "", "reasoning_content": "hidden", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}, "extra": 1}]},
            {"role": "tool", "tool_call_id": "c", "content": "r", "name": "f"},
            {"role": "user", "content": [{"type": "text", "text": "t", "cache_control": {}}]},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}],
    }  # fmt: skip
    rendered = template.render(body)
    assert "hidden" not in rendered and "strict" not in rendered and "cache_control" not in rendered
    assert '"extra"' not in rendered and '"name": "f"' in rendered


def test_template_files_are_checked(tmp_path: Path) -> None:
    for text, problem in [
        ("{", "not JSON"),
        ('{"chat_template": 3}', "has no string chat_template"),
        ('{"chat_template": "x", "eos_token": 1}', "eos_token is neither a string"),
        ('{"chat_template": "{% if %}", "bos_token": "", "eos_token": ""}', "does not compile"),
    ]:
        path = tmp_path / "t.json"
        path.write_text(text)
        with pytest.raises(TemplateError, match=problem):
            ChatTemplate.from_file(path)
    with pytest.raises(TemplateError, match="cannot read"):
        ChatTemplate.from_file(tmp_path / "missing.json")
    # As transformers saves them: tokens as AddedToken objects, or none where the template needs none.
    path = tmp_path / "t.json"
    path.write_text('{"chat_template": "{{ bos_token }}{{ eos_token }}", "bos_token": {"content": "<s>"}}')
    assert ChatTemplate.from_file(path).render({"messages": []}) == "<s>"


def test_a_template_that_fails_on_a_request_raises_a_template_error() -> None:
    template = ChatTemplate("{{ raise_me() }}", "", "")
    with pytest.raises(TemplateError, match="failed on this request"):
        template.render({"messages": []})


def test_estimate_is_a_quarter_of_the_bytes_rounded_up() -> None:
    assert estimate_tokens(4000) == 1000
    assert estimate_tokens(4001) == 1001
