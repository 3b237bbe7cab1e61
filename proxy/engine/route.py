"""Which way one Messages or Responses request reaches the engine: its native route, or toolpair's translation.

"Native" is transparent only when the engine takes the request whole. llama-server's own
``/v1/responses`` skips tools it does not know (Codex's ``namespace`` tools, ``web_search``) and
answers 200 without them, and refuses shapes real clients send; toolpair's translation keeps them.
So with ``auto`` modes each request is checked against the engine's profile
(:class:`~proxy.engine.kinds.EngineProfile`) and goes native when nothing would be lost, translated
when something would: one decision, here, with its reason.

Pure: :func:`plan_route` reads the decoded body; the handler acts on the :class:`RoutePlan`, logs it
at debug, counts it in ``/toolpair/metrics`` (``toolpair_api_routes_total{api,route,reason}``) and
names it in the ``X-Toolpair-Route`` response header.

What is checked, and where each goes (llama-server's profile):

- ``/v1/responses``: a tool whose ``type`` is not ``function`` (``namespace``, ``custom``,
  ``web_search`` and other hosted tools), ``previous_response_id``, an assistant item without
  ``type``, a ``reasoning`` item without ``content`` (``summary`` or ``encrypted_content`` only),
  a tool output given as a list of parts: translated. (Call ``arguments`` given as an object are
  refused by both routes today, toolpair's in the API's shape.)
- ``/v1/messages``: nothing yet (the thinking controls llama-server's route ignores are added to
  the native body, :mod:`proxy.engine.thinking`; Anthropic's server tools the translation drops too).
- anything else: native.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from proxy._types import Body
from proxy.config import ApiMode
from proxy.engine.kinds import EngineProfile

__all__ = ["ROUTE_HEADER", "ROUTE_REASONS", "RoutePlan", "plan_route"]

ROUTE_HEADER = "X-Toolpair-Route"

ROUTE_REASONS = (
    "whole",
    "setting",
    "engine_kind",
    "tool_type",
    "previous_response_id",
    "assistant_item_without_type",
    "reasoning_without_content",
    "tool_output_parts",
)
"""Every reason a plan can give: the metric's label values, so they stay few."""


class RoutePlan(NamedTuple):
    """The route one request takes, and why (a named tuple: one is made per request)."""

    mode: ApiMode
    reason: str
    """One of :data:`ROUTE_REASONS`."""
    detail: str = ""
    """What in the request decided it, for the log and the header (short, safe text)."""

    @property
    def header(self) -> str:
        """The ``X-Toolpair-Route`` value: ``native; reason=whole``, ``translate; reason=tool_type``."""
        return f"{self.mode.value}; reason={self.reason}"


def plan_route(api_path: str, data: Any, setting: ApiMode, kind_mode: ApiMode, profile: EngineProfile) -> RoutePlan:
    """The route for this request: the setting when it names one, else native unless something would be lost.

    ``setting`` is the API's ``*_mode`` setting; ``kind_mode`` what ``auto`` means for this engine
    kind (native for llama-server, translate for any other).

    >>> from proxy.engine.kinds import engine_profile
    >>> llama = engine_profile("llama-server")
    >>> auto, native = ApiMode.AUTO, ApiMode.NATIVE
    >>> plan_route("/v1/responses", {"input": "hi"}, auto, native, llama).header
    'native; reason=whole'
    >>> tools = [{"type": "function", "name": "f"}, {"type": "namespace", "name": "multi_agent_v1"}]
    >>> plan_route("/v1/responses", {"tools": tools}, auto, native, llama)
    RoutePlan(mode=<ApiMode.TRANSLATE: 'translate'>, reason='tool_type', detail='namespace')
    """
    if setting is not ApiMode.AUTO:
        return RoutePlan(setting, "setting")
    if kind_mode is not ApiMode.NATIVE:
        return RoutePlan(ApiMode.TRANSLATE, "engine_kind")
    if not isinstance(data, dict):
        return RoutePlan(ApiMode.NATIVE, "whole")  # the engine answers a malformed body itself
    loss = _responses_loss(data, profile) if api_path == "/v1/responses" else None
    if loss is None:
        return RoutePlan(ApiMode.NATIVE, "whole")
    return RoutePlan(ApiMode.TRANSLATE, *loss)


def _types(tools: Any, default: str | None) -> Iterable[str]:
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            kind = tool.get("type", default)
            yield kind if isinstance(kind, str) else "(not a string)"


def _unknown_tool(tools: Any, known: frozenset[str], default: str | None) -> tuple[str, str] | None:
    unknown = sorted({kind for kind in _types(tools, default) if kind not in known})
    return ("tool_type", ",".join(_short(kind) for kind in unknown)) if unknown else None


def _short(text: str) -> str:
    """Client text as a header and a log may show it."""
    kept = "".join(c for c in text if c.isalnum() or c in "_.:-")[:64]
    return kept or "(invalid)"


def _responses_loss(data: Body, profile: EngineProfile) -> tuple[str, str] | None:
    unknown = _unknown_tool(data.get("tools"), profile.native_responses_tools, None)
    if unknown is not None:
        return unknown
    if profile.native_responses_strict:
        if data.get("previous_response_id") is not None:
            return "previous_response_id", ""
        items = data.get("input")
        for index, item in enumerate(items if isinstance(items, list) else ()):
            found = _refused_item(item)
            if found is not None:
                return found, f"input[{index}]"
    return None


def _refused_item(item: Any) -> str | None:
    """What in one ``input`` item llama-server's converter refuses, or None."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind is None and item.get("role") == "assistant":
        return "assistant_item_without_type"
    if kind == "reasoning" and not item.get("content"):
        return "reasoning_without_content"
    if kind in ("function_call_output", "custom_tool_call_output") and isinstance(item.get("output"), list):
        return "tool_output_parts"
    return None
