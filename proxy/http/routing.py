"""Acting on a route plan (:mod:`proxy.engine.route`): the log line, the metric, the response header.

One place, so that both APIs that choose a route say the same things about it; and the log line of
a model plan (:mod:`proxy.engine.model_names`), which every API makes.
"""

from __future__ import annotations

import logging

from aiohttp import web

from proxy.engine.model_names import ModelPlan
from proxy.engine.route import ROUTE_HEADER, RoutePlan
from proxy.ops.metrics import METRICS

__all__ = ["note_model", "note_route", "stamp_route"]

log = logging.getLogger("toolpair")

_PLAN = "toolpair_route_plan"
"""Where the request keeps its plan until its response is prepared."""


def note_route(request: web.Request, api: str, plan: RoutePlan) -> None:
    """Log the plan at debug, count it, and keep it for the response header."""
    log.debug("%s: %s (%s%s)", api, plan.mode.value, plan.reason, f": {plan.detail}" if plan.detail else "")
    request.app[METRICS].route_taken(api, plan.mode.value, plan.reason)
    request[_PLAN] = plan


def note_model(api: str, plan: ModelPlan) -> None:
    """Log at debug a model name the engine gets in place of the client's, and why."""
    if plan.changed:
        why = f"model_map {plan.entry}" if plan.entry is not None else "the engine's only model"
        log.debug("%s: model %r sent as %r (%s)", api, plan.asked, plan.send, why)


async def stamp_route(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: name the route in the answer, errors and streams included."""
    plan = request.get(_PLAN)
    if isinstance(plan, RoutePlan):
        response.headers[ROUTE_HEADER] = plan.header
