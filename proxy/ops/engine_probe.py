"""What the managed engine reports about itself, for ``/metrics`` and ``/toolpair/status``.

The serve path sets ``app[ENGINE_PROBE]`` to a function that returns an
:class:`EngineSnapshot`; scrapes and status requests call it, so state and
restart counts are read when asked, never pushed. In sidecar mode nothing sets
it: the engine fields are ``null`` and no engine metrics are exported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

__all__ = ["ENGINE_PROBE", "ENGINE_STATES", "EngineProbe", "EngineReading", "EngineSnapshot", "overall_state"]

ENGINE_STATES = ("stopped", "starting", "ready", "stopping", "shutdown")
"""States always exported (0 or 1) so a dashboard sees each series; others are added as reported."""


@dataclass(frozen=True)
class EngineReading:
    """One engine of several (``toolpair serve --parallel N``)."""

    name: str
    state: str
    restarts: int = 0
    active: int = 0
    """Requests it works on now."""
    served: int = 0
    """Requests it has been given since toolpair started."""
    port: int | None = None
    reason: str | None = None
    """Why it failed, in one line; None while it has not."""

    def shown(self) -> dict[str, Any]:
        """This reading as ``/ready`` and ``/toolpair/status`` show it: ``reason`` only when there is one.

        >>> EngineReading("engine-0", "ready", port=41001).shown()
        {'name': 'engine-0', 'state': 'ready', 'restarts': 0, 'active': 0, 'served': 0, 'port': 41001}
        """
        fields = dataclasses.asdict(self)
        if self.reason is None:
            del fields["reason"]
        return fields


_BEST_FIRST = ("ready", "starting", "stopping", "stopped", "failed", "shutdown")


def overall_state(states: tuple[str, ...]) -> str:
    """The state of a group of engines: the best any of them is in (ready when one can serve).

    >>> overall_state(("starting", "ready")), overall_state(("failed", "starting"))
    ('ready', 'starting')
    """
    known = [s for s in _BEST_FIRST if s in states]
    return known[0] if known else states[0]


@dataclass(frozen=True)
class EngineSnapshot:
    """One reading of the managed engine (of all of them, with ``engines`` telling each apart)."""

    state: str
    restarts: int = 0
    backend: str | None = None
    model: str | None = None
    queue_depth: int | None = None
    """Requests waiting for admission right now; None where there is no queue."""
    engines: tuple[EngineReading, ...] = ()
    """Each engine on its own, when serve runs several; empty for one."""


EngineProbe = Callable[[], EngineSnapshot]
ENGINE_PROBE: web.AppKey[EngineProbe] = web.AppKey("engine_probe")
