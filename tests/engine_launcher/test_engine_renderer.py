"""One renderer: the engine's Jinja formatter answers with :func:`render_prompt`'s prompt, in llama-cpp-python's shape.

check-template and count_tokens render with ``render_prompt``; the engine's formatter
(``engine_main.render_chat_templates_as_models_expect``) must read the very same prompt, with the
request's ``chat_template_kwargs`` (``engine_main.take_template_kwargs_per_request``) over the
load-time ones, and hand the server what llama-cpp-python's own formatter hands it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_launcher.inside import engine_main
from engine_launcher.templates.chat_template import compiled, render_prompt
from engine_launcher.templates.template_check import TOOL, conversation

np = pytest.importorskip("numpy")  # the engine's dependency: its stopping criteria take token arrays

NAMES = ("deepseek-ai-DeepSeek-V3.1", "Kimi-K2-Instruct", "Qwen3-Coder")
STOP_ID = 7


def formatter(chat_format: Any, text: str) -> Any:
    return chat_format.Jinja2ChatFormatter(template=text, eos_token="</s>", bos_token="<s>", stop_token_ids=[STOP_ID])


@pytest.mark.parametrize("name", NAMES)
def test_the_engines_formatter_reads_render_prompts_prompt(templates: Path, name: str, engine_chat_format: Any) -> None:
    text = (templates / f"{name}.jinja").read_text()
    messages = conversation((0, 1))  # a question, then an assistant turn with two calls and their results
    response = formatter(engine_chat_format, text)(messages=messages, tools=[TOOL], thinking=True)
    expected = render_prompt(
        text, messages, bos_token="<s>", eos_token="</s>", tools=[TOOL], template_kwargs={"thinking": True}
    )
    assert response.prompt == expected
    assert messages == conversation((0, 1))
    assert response.stop == ["</s>"] and response.added_special is True
    assert response.stopping_criteria(np.array([1, STOP_ID], dtype=np.intc), None)
    assert not response.stopping_criteria(np.array([STOP_ID, 1], dtype=np.intc), None)


def test_a_requests_template_kwargs_reach_render_prompt_over_the_load_time_ones(
    templates: Path, engine_chat_format: Any
) -> None:
    text = (templates / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()
    messages = [{"role": "user", "content": "Hi"}]

    def expected(thinking: bool) -> str:
        return render_prompt(text, messages, bos_token="<s>", eos_token="</s>", template_kwargs={"thinking": thinking})

    assert expected(True) != expected(False)  # the switch shows in the prompt
    loaded = formatter(engine_chat_format, text)
    token = engine_main._REQUEST_TEMPLATE_KWARGS.set({"thinking": False, "messages": []})
    try:
        assert loaded(messages=messages, thinking=True).prompt == expected(False)
    finally:
        engine_main._REQUEST_TEMPLATE_KWARGS.reset(token)
    assert loaded(messages=messages, thinking=True).prompt == expected(True)


def test_the_engines_formatter_compiles_once_in_render_prompts_cache(engine_chat_format: Any) -> None:
    text = "{% for m in messages %}[{{ m.content }}]{% endfor %}{# one renderer #}"
    compiled.cache_clear()
    loaded = formatter(engine_chat_format, text)
    assert loaded(messages=[{"role": "user", "content": "a"}]).prompt == "[a]"
    assert loaded(messages=[{"role": "user", "content": "b"}]).prompt == "[b]"
    assert compiled.cache_info().misses == 1 and compiled.cache_info().hits == 1


def test_the_response_has_llama_cpp_pythons_own_shape(templates: Path, engine_chat_format: Any) -> None:
    text = (templates / "deepseek-ai-DeepSeek-V3.1.jinja").read_text()
    messages = [{"role": "user", "content": "Hi"}]  # what llama-cpp-python alone renders too
    loaded = formatter(engine_chat_format, text)
    ours, theirs = loaded(messages=messages), engine_chat_format.unpatched_format(loaded, messages=messages)
    assert type(ours) is type(theirs)
    assert (ours.prompt, ours.stop, ours.added_special) == (theirs.prompt, theirs.stop, theirs.added_special)
    assert type(ours.stopping_criteria) is type(theirs.stopping_criteria)
    no_stop_ids = engine_chat_format.Jinja2ChatFormatter(template=text, eos_token="</s>", bos_token="<s>")
    assert no_stop_ids(messages=messages).stopping_criteria is None
