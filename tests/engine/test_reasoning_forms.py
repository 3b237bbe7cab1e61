"""Reasoning markers and an opened reasoning block, known by rendering the real templates.

proxy/engine/toolcalls/_reasoning.py. A text search of the template took Qwen3.5's prompt, whose
block holds both an opened and a closed ``<think>``, for "not opened", so its reasoning and
``</think>`` arrived as content. Through ``toolpair serve``: tests/test_serve_templates.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config import Settings
from proxy.engine.plan import engine_setup, follow_template, reply_plan
from proxy.engine.toolcalls import (
    Content,
    ExtractOptions,
    Reasoning,
    TextExtractor,
    template_opens_think,
    template_reasoning,
)
from tests.real_engine import TEMPLATE
from tests.support.survey import survey


@pytest.fixture(scope="module")
def templates() -> Path:
    return Path(survey.fetch_templates())


@pytest.mark.parametrize(
    ("name", "opening", "default", "on", "off"),
    [
        ("Qwen3.5-4B", "<think>", True, True, False),  # both branches in one prompt block
        ("Qwen-QwQ-32B", "<think>", False, True, False),  # opened, then closed unless thinking is on
        ("GLM-4.7-Flash", "<think>", True, True, False),
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "<think>", True, True, False),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "<think>", True, True, True),
        ("Qwen-Qwen3-0.6B", "<think>", False, False, False),  # the model opens it itself
        ("ByteDance-Seed-OSS", "<seed:think>", False, False, False),
        ("MiniMax-M3", "<mm:think>", False, False, False),
        ("Kimi-K3", "<|open|>think<|sep|>", True, True, True),
        ("Cohere2MoE", "<|START_THINKING|>", True, True, True),
        ("tencent-Hy3", "<think:opensource>", False, False, False),
    ],
)
def test_each_familys_markers_and_whether_its_prompt_opens_them(
    templates: Path, name: str, opening: str, default: bool, on: bool, off: bool
) -> None:
    source = (templates / f"{name}.jinja").read_text()
    form = template_reasoning(source)
    assert form is not None and form.open == opening
    assert [form.opens_in_prompt, template_opens_think(source, {"enable_thinking": True})] == [default, on]
    assert template_opens_think(source, {"enable_thinking": False}) is off


def test_templates_without_reasoning_have_no_form(templates: Path) -> None:
    chatml = json.loads(TEMPLATE.read_text())["chat_template"]
    assert template_reasoning(chatml) is None
    for name in (
        "Qwen-Qwen2.5-7B-Instruct",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "meta-llama-Llama-3.1-8B-Instruct",
    ):
        assert template_reasoning((templates / f"{name}.jinja").read_text()) is None, name


def _events(options: ExtractOptions, pieces: list[str]) -> list[object]:
    extractor = TextExtractor(options)
    events = [e for piece in pieces for e in extractor.feed(piece)] + extractor.finish()
    merged: list[object] = []
    for event in events:  # adjacent text events of one kind read as one
        if merged and type(merged[-1]) is type(event) and isinstance(event, Content | Reasoning):
            merged[-1] = type(event)(merged[-1].text + event.text)  # type: ignore[attr-defined]
        else:
            merged.append(event)
    return merged


@pytest.mark.parametrize(
    ("markers", "opened"),
    [
        (("<mm:think>", "</mm:think>"), False),
        (("<|open|>think<|sep|>", "<|close|>think<|sep|>"), True),
        (("<seed:think>", "</seed:think>"), False),
    ],
)
def test_any_split_of_a_familys_reasoning_gives_the_same_events(markers: tuple[str, str], opened: bool) -> None:
    text = ("" if opened else markers[0]) + "Paris first, then Oslo." + markers[1] + "\n\nBoth are sunny."
    options = ExtractOptions(reasoning=True, think_open=opened, think_markers=markers)
    whole = _events(options, [text])
    assert whole == [Reasoning("Paris first, then Oslo."), Content("Both are sunny.")]
    for cut in range(1, len(text)):
        assert _events(options, [text[:cut], text[cut:]]) == whole, cut
    assert _events(options, list(text)) == whole


@pytest.mark.parametrize(
    ("name", "default", "follows"),
    [
        ("Qwen3.5-4B", True, True),
        ("Qwen-QwQ-32B", False, True),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", True, False),
    ],
)
def test_a_requests_thinking_switch_decides_whether_its_reply_starts_in_reasoning(
    templates: Path, name: str, default: bool, follows: bool
) -> None:
    """Qwen3.5 closes the prompt's block for ``enable_thinking: false``, QwQ opens it for true; R1 always opens it."""
    settings = follow_template(Settings(engine_kind="llama-cpp-python"), (templates / f"{name}.jinja").read_text())
    setup = engine_setup(settings)
    assert [settings.think_in_prompt, settings.think_follows_switch] == [default, follows]
    opened = {}
    for switch in (None, True, False):
        body: dict[str, object] = {"messages": [{"role": "user", "content": "Hi"}]}
        if switch is not None:
            body["chat_template_kwargs"] = {"enable_thinking": switch}
        plan = reply_plan(body, setup)
        assert plan is not None
        opened[switch] = plan.extract.think_open
    assert opened == {None: default, True: default or follows, False: default and not follows}
