"""Tool-call IDs mapped for a template that demands its own (proxy/engine/call_ids.py), on the real templates.

Mistral Nemo's and Mistral Small 3.2's templates refuse any ID that is not nine characters, so a
Claude Code history (``toolu_...``) failed the render. Through ``toolpair serve``:
tests/test_serve_templates.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.templates.chat_template import render_prompt
from proxy.config import ConfigError, Settings
from proxy.engine.adapt import adapt_chat_request
from proxy.engine.call_ids import ANY, NINE_ALNUM, fits_form, rendered_ids, template_call_id_form
from proxy.engine.kinds import engine_profile
from proxy.engine.plan import engine_setup
from tests.support.conversations import WEATHER_QUESTION, assistant_calls, tool_result
from tests.support.survey import survey

NEMO = "mistralai-Mistral-Nemo-Instruct-2407"
SMALL = "Mistral-Small-3.2-24B-Instruct-2506"


@pytest.fixture(scope="module")
def templates() -> Path:
    return Path(survey.fetch_templates())


def _call(call_id: Any, city: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


def history(first: Any = "toolu_paris", second: Any = "toolu_oslo") -> list[Any]:
    """Two calls of one tool, results in finish order (already ordered by the time ids are mapped)."""
    return [
        WEATHER_QUESTION,
        assistant_calls(_call(first, "Paris"), _call(second, "Oslo")),
        tool_result(first, "Paris: 18C"),
        tool_result(second, "Oslo: -3C"),
    ]


def test_exactly_the_templates_that_check_for_nine_characters_demand_them(templates: Path) -> None:
    demanding = {p.stem for p in templates.glob("*.jinja") if template_call_id_form(p.read_text()) == NINE_ALNUM}
    assert demanding == {NEMO, SMALL}


@pytest.mark.parametrize("name", [NEMO, SMALL])
def test_a_claude_code_history_renders_once_mapped_and_pairs_by_the_mapped_ids(templates: Path, name: str) -> None:
    source = (templates / f"{name}.jinja").read_text()
    sent = history()
    before = copy.deepcopy(sent)
    with pytest.raises(Exception, match="alphanumeric strings with length 9"):
        render_prompt(source, sent, bos_token="<s>", eos_token="</s>")
    mapped = rendered_ids(sent, NINE_ALNUM)
    prompt = render_prompt(source, mapped, bos_token="<s>", eos_token="</s>")
    assert sent == before  # the caller's objects are untouched
    paris, oslo = (c["id"] for c in mapped[1]["tool_calls"])
    assert [mapped[2]["tool_call_id"], mapped[3]["tool_call_id"]] == [paris, oslo]
    assert paris != oslo and all(fits_form(i, NINE_ALNUM) for i in (paris, oslo))
    assert "toolu_" not in prompt and prompt.count(paris) == 2 and prompt.count(oslo) == 2
    assert mapped[0] is sent[0]  # a message without IDs is the same object


def test_the_mapping_is_stable_keeps_fitting_ids_and_leaves_what_it_cannot_map() -> None:
    assert rendered_ids(history(), NINE_ALNUM) == rendered_ids(history(), NINE_ALNUM)  # the prompt cache matches
    fitting = history("abcDEF123", "toolu_oslo")
    mapped = rendered_ids(fitting, NINE_ALNUM)
    assert mapped[1]["tool_calls"][0] is fitting[1]["tool_calls"][0] and mapped[2] is fitting[2]
    odd = history(7, None)  # not strings: nothing to map, the engine's own error stays
    assert rendered_ids(odd, NINE_ALNUM) is odd
    assert rendered_ids(history(), ANY) == history()


def test_a_mapped_id_never_takes_an_id_the_client_already_uses() -> None:
    taken = rendered_ids(history("toolu_paris", "toolu_oslo"), NINE_ALNUM)[1]["tool_calls"][0]["id"]
    both = history("toolu_paris", taken)  # the client's second ID is what the first would have mapped to
    mapped = rendered_ids(both, NINE_ALNUM)
    ids = [c["id"] for c in mapped[1]["tool_calls"]]
    assert ids[1] == taken and ids[0] != taken and fits_form(ids[0], NINE_ALNUM)


def test_the_adapt_rule_follows_the_setting_and_a_bad_setting_is_refused() -> None:
    body = {"messages": history()}
    demanding = engine_setup(Settings(engine_kind="llama-cpp-python", tool_call_ids=NINE_ALNUM)).profile
    adapted, fired = adapt_chat_request(body, demanding)
    assert "map_call_ids_for_template" in fired and adapted["messages"][1]["tool_calls"][0]["id"] != "toolu_paris"
    plain, fired = adapt_chat_request(body, engine_profile("llama-cpp-python"))
    assert "map_call_ids_for_template" not in fired and plain["messages"][2] is body["messages"][2]
    with pytest.raises(ConfigError, match="tool_call_ids: unknown form 'nine'"):
        engine_setup(Settings(tool_call_ids="nine"))
