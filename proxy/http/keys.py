"""What the application holds for its handlers, by key: settings, the upstream, the engine.

A module of its own so that route modules, probes and the app builder read the same keys without
importing each other.
"""

from __future__ import annotations

from aiohttp import web

from proxy.config import Settings
from proxy.engine.client import Admission, EngineClient
from proxy.engine.plan import EngineSetup
from proxy.engine.upstream import Upstream

__all__ = ["ADMISSION", "ENGINE", "ENGINE_CLIENT", "SETTINGS", "UPSTREAM"]

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
ENGINE = web.AppKey("engine", EngineSetup)
ADMISSION: web.AppKey[Admission] = web.AppKey("admission")
ENGINE_CLIENT = web.AppKey("engine_client", EngineClient)
"""The one way to the engine: admission, then engine requests (see :mod:`proxy.engine.client`)."""
