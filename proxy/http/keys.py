"""What the application holds for its handlers, by key: settings, the upstream, the engine.

A module of its own so that route modules, probes and the app builder read the same keys without
importing each other.
"""

from __future__ import annotations

from aiohttp import web

from proxy.config import Settings
from proxy.engine.client import Admission, EngineClient
from proxy.engine.upstream import Upstream
from proxy.engine.watch import EngineWatch

__all__ = ["ADMISSION", "ENGINE_CLIENT", "ENGINE_WATCH", "SETTINGS", "UPSTREAM"]

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", Upstream)
ADMISSION: web.AppKey[Admission] = web.AppKey("admission")
ENGINE_CLIENT = web.AppKey("engine_client", EngineClient)
"""The one way to the engine: admission, then engine requests (see :mod:`proxy.engine.client`)."""
ENGINE_WATCH = web.AppKey("engine_watch", EngineWatch)
"""What engine is behind the upstream now, and whether it answers (see :mod:`proxy.engine.watch`)."""
