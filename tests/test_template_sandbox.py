"""The template sandbox: a template's own lists may change (Kimi K2 renders), nothing else may."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jinja2.exceptions import SecurityError

from engine_launcher.templates.chat_template import compiled, render_prompt
from engine_launcher.templates.template_check import TOOL, Pairing, TemplateSource, check_template, conversation, render
from tests.support.template_replies import template_text

KIMI_K2 = ("Kimi-K2-Instruct", "Kimi-K2-Thinking")  # both keep a queue with ids.append(...)


def prompt(text: str, messages: list[dict[str, Any]] | None = None) -> str:
    return render_prompt(text, messages or [{"role": "user", "content": "Hi"}], bos_token="", eos_token="")


@pytest.mark.parametrize("name", KIMI_K2)
def test_kimi_k2_renders_and_leaves_the_callers_messages_alone(name: str) -> None:
    messages = conversation((1, 0))
    sent = copy.deepcopy(messages)
    text = render(TemplateSource(template_text(name)), messages)
    assert "functions.get_weather:0" in text and "TEMP-PARIS-31C" in text
    assert messages == sent
    assert check_template(TemplateSource(template_text(name))).pairing is not Pairing.FAILS


@pytest.mark.parametrize("name", KIMI_K2)
def test_the_engines_formatter_renders_kimi_k2_as_the_check_does(name: str, engine_chat_format: Any) -> None:
    text = template_text(name)
    formatter = engine_chat_format.Jinja2ChatFormatter(template=text, eos_token="</s>", bos_token="<s>")
    messages = conversation((0, 1))
    assert formatter(messages=messages, tools=[TOOL]).prompt == render(TemplateSource(text), messages)
    assert messages == conversation((0, 1))


@pytest.mark.parametrize(
    "text",
    [
        "{% set _ = messages.append({'role': 'user'}) %}",  # the caller's list
        "{% set _ = messages[0].update({'role': 'x'}) %}",  # the caller's dict
        "{% set d = {} %}{% set _ = d.update({'a': 1}) %}{{ d }}",  # dicts stay immutable
        "{{ messages.__class__.__mro__ }}",  # unsafe attributes stay unsafe
    ],
)
def test_what_stays_refused(text: str) -> None:
    with pytest.raises(SecurityError):
        prompt(text)


def test_an_allowed_method_leads_nowhere_unsafe() -> None:
    assert prompt("{% set xs = [] %}{{ xs.append.__self__.__class__ }}|{{ xs.pop.__globals__ }}") == "|"


def test_a_templates_own_list_changes_only_inside_a_render_that_names_its_inputs() -> None:
    own = "{% set xs = [] %}{% set _ = xs.append(1) %}{% set _ = xs.extend([2, 3]) %}{{ xs.pop() }}{{ xs }}"
    assert prompt(own) == "3[1, 2]"
    with pytest.raises(SecurityError):
        compiled(own).render()  # no inputs named: as jinja2's immutable sandbox


def test_the_lists_of_functions_and_template_kwargs_stay_the_callers() -> None:
    """The engine's load-time ``chat_template_kwargs`` outlive a request: a template changing them would leak."""
    loaded: dict[str, Any] = {"names": ["a"]}
    functions = [{"name": "f"}]
    for text, inputs in [
        ("{% set _ = names.append('b') %}", {"template_kwargs": loaded}),
        ("{% set _ = functions.append({}) %}", {"functions": functions}),
    ]:
        with pytest.raises(SecurityError):
            render_prompt(text, [], bos_token="", eos_token="", **inputs)
    assert loaded == {"names": ["a"]} and functions == [{"name": "f"}]
