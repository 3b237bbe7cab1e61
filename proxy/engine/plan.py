"""How the engine is set up, and what to do with its reply to one chat request.

Pure: the handler and :mod:`proxy.engine.client` ask for a plan, then carry it
out; the request side (validate, order, adapt) is
:func:`proxy.dialects.chat.request.plan_engine_request`. A reply plan of None
means "relay the engine's answer as it is"; that is always the case for the
``generic`` kind, whose requests also go out as the client's own bytes whenever
ordering moved nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy._types import Body
from proxy.config import ConfigError, Settings
from proxy.engine.kinds import EngineKind, EngineProfile, engine_profile
from proxy.engine.toolcalls import FORMATS, ExtractOptions

__all__ = ["GENERIC", "EngineSetup", "ReplyPlan", "engine_setup", "reply_plan"]

TOOL_CALL_FORMATS = (*FORMATS, "none")


@dataclass(frozen=True)
class EngineSetup:
    """The engine-related settings, checked once at startup."""

    profile: EngineProfile
    tool_call_format: str
    """A key of :data:`~proxy.engine.toolcalls.FORMATS`, or ``none``."""
    reasoning: bool
    think_in_prompt: bool

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
    if settings.tool_call_format not in TOOL_CALL_FORMATS:
        known = ", ".join(TOOL_CALL_FORMATS)
        raise ConfigError(f"tool_call_format: unknown format {settings.tool_call_format!r} (known: {known})")
    return EngineSetup(profile, settings.tool_call_format, settings.reasoning, settings.think_in_prompt)


GENERIC = engine_setup(Settings())
"""An engine trusted with the whole API: nothing is adapted, nothing extracted."""


@dataclass(frozen=True)
class ReplyPlan:
    """How to treat the engine's reply."""

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
        calls=fmt if tools else None,
        reasoning=reasoning,
        think_open=setup.think_in_prompt,
        parallel=body.get("parallel_tool_calls") is not False,
        tools=tools,
        harmony=fmt == "harmony",
    )
    if not options.active and not usage:
        return None
    return ReplyPlan(options, usage)
