"""The paths toolpair answers itself for operators, named once.

Probes, deployment manifests and the authentication middleware all read these
names from here, so a manifest cannot point a probe at a path that does not
exist, and a probe is never asked for an API key.
"""

from __future__ import annotations

__all__ = ["HEALTH_PATH", "METRICS_PATH", "PROBE_PATHS", "READY_PATH", "STATUS_PATH", "TOOLPAIR_METRICS_PATH"]

HEALTH_PATH = "/health"
"""Liveness: 200 while the toolpair process serves requests."""

READY_PATH = "/ready"
"""Readiness: 200 only while requests can be served (the engine or upstream is ready)."""

METRICS_PATH = "/metrics"
"""Prometheus exposition. In front of an engine that serves its own (a sidecar): the engine's,
status and headers included, with toolpair's families appended (:mod:`proxy.ops.metrics`)."""

TOOLPAIR_METRICS_PATH = "/toolpair/metrics"
"""toolpair's own families alone, whatever the engine serves."""

STATUS_PATH = "/toolpair/status"
"""Version, mode, engine state and counters, as JSON."""

PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH})
"""Paths that never ask for an API key: orchestrators probe them without one."""
