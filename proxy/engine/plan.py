"""How the engine is set up, and what to do with its reply to one chat request.

Pure: the handler and :mod:`proxy.engine.client` ask for a plan, then carry it
out; the request side (validate, order, adapt) is
:func:`proxy.dialects.chat.request.plan_engine_request`. A reply plan of None
means "relay the engine's answer as it is"; that is always the case for the
``generic`` kind, whose requests also go out as the client's own bytes whenever
ordering moved nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from proxy._types import Body
from proxy.config import ConfigError, Settings
from proxy.engine.call_ids import ANY, CALL_ID_FORMS, template_call_id_form
from proxy.engine.kinds import EngineKind, EngineProfile, engine_profile
from proxy.engine.toolcalls import (
    CONTENT_WRAPPERS,
    DEFAULT_REASONING_MARKERS,
    FORMATS,
    MESSAGE_DIALECTS,
    OPENED_BY_PROMPT,
    ExtractOptions,
    detect_tool_call_format,
    template_reasoning,
)

__all__ = ["GENERIC", "EngineSetup", "ReplyPlan", "engine_setup", "follow_template", "reply_plan"]

TOOL_CALL_FORMATS = (*FORMATS, "none")


@dataclass(frozen=True)
class EngineSetup:
    """The engine-related settings, checked once at startup."""

    profile: EngineProfile
    tool_call_format: str
    """A key of :data:`~proxy.engine.toolcalls.FORMATS`, or ``none``."""
    reasoning: bool
    think_in_prompt: bool
    think_markers: tuple[str, str] = ("<think>", "</think>")
    """The model's reasoning markers, opening and closing (``reasoning_markers``)."""
    think_follows_switch: bool = False
    """The prompt opens the block exactly when ``enable_thinking`` is on: Qwen3.5 (open by default) closes
    it for ``false``, QwQ (closed by default) opens it for ``true``."""

    def think_open(self, template_kwargs: object) -> bool:
        """Whether this request's prompt ends inside the reasoning block, given its ``chat_template_kwargs``.

        >>> setup = EngineSetup(GENERIC.profile, "auto", True, True, think_follows_switch=True)
        >>> setup.think_open({"enable_thinking": False}), setup.think_open(None)
        (False, True)
        """
        switch = template_kwargs.get("enable_thinking") if isinstance(template_kwargs, dict) else None
        if self.think_follows_switch and isinstance(switch, bool):
            return switch
        return self.think_in_prompt

    @property
    def sees_images(self) -> bool:
        """Whether an image may go to the engine: the model sees, or the engine refuses unseen media itself."""
        return self.profile.vision or self.profile.refuses_unseen_media


def engine_setup(settings: Settings) -> EngineSetup:
    """Resolve and check the engine settings; a bad value is a :class:`~proxy.config.ConfigError`.

    ``engine_kind: auto`` that nobody resolved (``toolpair proxy`` detects the engine before the
    app is made) is ``generic``: nothing is adapted.

    >>> engine_setup(Settings(engine_kind="llama-cpp-python")).profile.parses_tool_calls
    False
    """
    try:
        logprobs = settings.engine_logprobs is not False
        kind = EngineKind.GENERIC if settings.engine_kind is EngineKind.AUTO else settings.engine_kind
        profile = engine_profile(kind, vision=settings.vision, logprobs=logprobs)
    except ValueError as exc:
        raise ConfigError(f"engine_kind: {exc}") from None
    if settings.tool_call_ids not in CALL_ID_FORMS:
        known = ", ".join(CALL_ID_FORMS)
        raise ConfigError(f"tool_call_ids: unknown form {settings.tool_call_ids!r} (known: {known})")
    profile = replace(profile, call_id_form=settings.tool_call_ids)
    if settings.tool_call_format not in TOOL_CALL_FORMATS:
        known = ", ".join(TOOL_CALL_FORMATS)
        raise ConfigError(f"tool_call_format: unknown format {settings.tool_call_format!r} (known: {known})")
    markers = settings.reasoning_markers
    if len(markers) != 2 or not all(isinstance(m, str) and m for m in markers):
        raise ConfigError(f"reasoning_markers: two nonempty strings (opening, closing), got {markers!r}")
    return EngineSetup(
        profile,
        settings.tool_call_format,
        settings.reasoning,
        settings.think_in_prompt,
        (markers[0], markers[1]),
        settings.think_follows_switch,
    )


def settings_for_engine(settings: Settings, template: str | None) -> Settings:
    """``settings`` for the engine they name, with ``template`` (the model's chat template) followed where it counts.

    Only an engine that leaves tool calls in its text needs the template's teaching
    (:func:`follow_template`); one that parses them itself (llama-server, vLLM) keeps its own reading.
    """
    if template is None or engine_setup(settings).profile.parses_tool_calls:
        return settings
    return follow_template(settings, template)


def follow_template(settings: Settings, template: str) -> Settings:
    """``settings`` with what the model's chat template teaches: call format, reasoning, call IDs.

    Only ``auto`` or unset values are filled in; explicit settings win. A template whose format is
    not known keeps ``auto``, which reads every marked form. ``toolpair serve`` passes the template
    it hands its engine, ``toolpair proxy`` the one its ``--chat-template-file`` names.

    >>> follow_template(Settings(), '{{ "<tool_call>" }}').tool_call_format
    'hermes'
    >>> follow_template(Settings(tool_call_format="none"), '{{ "<tool_call>" }}').tool_call_format
    'none'
    """
    if not template:
        return settings
    changes: dict[str, Any] = {}
    if settings.tool_call_format == "auto":
        detected = detect_tool_call_format(template)
        changes["tool_call_format"] = "auto" if detected == "none" else detected
    reasoning = template_reasoning(template)  # rendered as the engine renders it
    if not settings.think_in_prompt and reasoning is not None:
        changes["think_in_prompt"] = reasoning.opens_in_prompt
    if not settings.think_follows_switch and reasoning is not None:
        on, off = (template_reasoning(template, {"enable_thinking": switch}) for switch in (True, False))
        changes["think_follows_switch"] = bool(on and on.opens_in_prompt) and not (off and off.opens_in_prompt)
    if reasoning is not None and settings.reasoning_markers == list(DEFAULT_REASONING_MARKERS):
        changes["reasoning_markers"] = [reasoning.open, reasoning.close]
    if settings.tool_call_ids == ANY:
        changes["tool_call_ids"] = template_call_id_form(template)
    return dataclasses.replace(settings, **changes)


GENERIC = engine_setup(Settings())
"""An engine trusted with the whole API: nothing is adapted, nothing extracted."""


class ReplyPlan(NamedTuple):
    """How to treat the engine's reply (a named tuple: one is made per request)."""

    extract: ExtractOptions
    usage: bool
    """End the stream with a usage chunk that toolpair counts, since the engine sends none."""


def _function_tools(body: Body) -> dict[str, Any]:
    tools: dict[str, Any] = {}
    listed = body.get("tools")
    for tool in listed if isinstance(listed, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools[function["name"]] = function.get("parameters") or {}
    return tools


def reply_plan(body: Body, setup: EngineSetup) -> ReplyPlan | None:
    """Extraction and usage for this (adapted) request; None when the reply can be relayed untouched.

    Calls are looked for only when the request offers tools and does not say
    ``tool_choice: "none"``. ``auto`` leaves an engine that parses calls itself
    alone; a named format applies whatever the engine.

    >>> reply_plan({"messages": []}, GENERIC) is None
    True
    """
    profile = setup.profile
    fmt = setup.tool_call_format
    reads_calls = fmt != "none" and not (fmt == "auto" and profile.parses_tool_calls)
    reasoning = setup.reasoning and not profile.splits_reasoning
    stream_options = body.get("stream_options")
    usage = (
        not profile.stream_usage
        and body.get("stream") is True
        and isinstance(stream_options, dict)
        and stream_options.get("include_usage") is True
    )
    if not (reads_calls or reasoning or usage):
        return None  # the generic kind's path: no look at the tools
    tools = _function_tools(body) if reads_calls and body.get("tool_choice") != "none" else {}
    options = ExtractOptions(
        calls=fmt if tools or (reads_calls and fmt in OPENED_BY_PROMPT) else None,
        reasoning=reasoning,
        think_open=setup.think_open(body.get("chat_template_kwargs")),
        think_markers=setup.think_markers,
        parallel=body.get("parallel_tool_calls") is not False,
        tools=tools,
        harmony=fmt in MESSAGE_DIALECTS,
        dialect=fmt if fmt in MESSAGE_DIALECTS else "harmony",
        wrappers=CONTENT_WRAPPERS.get(fmt, ()) if reads_calls else (),
    )
    if not options.active and not usage:
        return None
    return ReplyPlan(options, usage)
