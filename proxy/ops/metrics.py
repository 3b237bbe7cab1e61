"""Prometheus metrics, one registry per application, served at ``GET /metrics``.

A registry per app (not prometheus-client's global one) keeps two apps in one
process, such as tests, from counting into each other. Request metrics are
recorded once per request from its :class:`~proxy.ops.trace.Trace` by the access
middleware; engine state, restarts and queue depth are read from the engine
probe at scrape time (:mod:`proxy.ops.engine_probe`).

Exported (all prefixed ``toolpair_``)::

    requests_total{route,status}            requests answered
    requests_in_flight                      requests being served now
    request_duration_seconds{route}         request start to last byte sent
    upstream_ttfb_seconds{route}            upstream request sent to first body byte back
    runs_reordered_total{api}               tool-result runs put back into call order
    runs_in_order_total{api}                runs that already were in call order
    runs_kept_total{api,reason}             runs left in received order, by reason
    tool_calls_extracted_total              tool calls parsed out of model text
    tool_call_extraction_failures_total     call texts that could not be parsed
    queue_wait_seconds                      time spent waiting for admission
    queue_depth                             requests waiting now (managed engine only)
    engine_state{state}                     1 for the engine's current state (managed only)
    engine_restarts_total                   engine restarts (managed only)
    engine_instance_state{engine,state}     1 for each engine's state (serve --parallel N)
    engine_instance_restarts_total{engine}  restarts of each engine (serve --parallel N)
    engine_instance_active{engine}          requests each engine works on (serve --parallel N)
    engine_instance_requests_total{engine}  requests given to each engine (serve --parallel N)
    prompt_tokens_total{route}              prompt tokens reported in usage
    completion_tokens_total{route}          completion tokens reported in usage
    api_routes_total{api,route,reason}      Messages/Responses requests by the route taken (proxy.engine.route)
    build_info{version}                     always 1

No ``*_created`` series, and reading (``/metrics``, ``/toolpair/metrics``,
``/health``, ``/ready``, ``/toolpair/status``, and a ``GET`` or ``HEAD`` of the
engine's ``/props``, ``/slots``, ``/models``, ``/v1/models``, ``/v1/health`` or
``/lora-adapters`` forwarded to it) counts nowhere: two scrapes with only reads
between them are the same bytes (:mod:`proxy.ops.access`).

``route`` is the matched route's path (``/v1/chat/completions``), or
``passthrough`` for everything forwarded as is: never the raw path, which
would let clients create unbounded series.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import accumulate

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString

from proxy import __version__
from proxy.ops.engine_probe import ENGINE_STATES, EngineReading, EngineSnapshot
from proxy.ops.trace import Trace
from proxy.ops.usage import Usage

__all__ = ["APIS", "METRICS", "Metrics", "append_exposition", "metrics_handler"]

APIS = ("chat", "anthropic", "responses")
"""Values of the ``api`` label, created up front so rates start at zero."""

# Agent turns are long: a prompt of many thousand tokens can take minutes on a CPU.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _EngineCollector:
    """Reads the engine probe at scrape time; exports nothing when there is no managed engine."""

    def __init__(self, probe: Callable[[], EngineSnapshot | None]) -> None:
        self._probe = probe

    def collect(self) -> Iterable[Metric]:
        snapshot = self._probe()
        if snapshot is None:
            return
        state = GaugeMetricFamily("toolpair_engine_state", "1 for the managed engine's current state", labels=["state"])
        for name in dict.fromkeys((*ENGINE_STATES, snapshot.state)):
            state.add_metric([name], 1.0 if name == snapshot.state else 0.0)
        yield state
        yield CounterMetricFamily("toolpair_engine_restarts", "Managed engine restarts", value=snapshot.restarts)
        if snapshot.queue_depth is not None:
            yield GaugeMetricFamily(
                "toolpair_queue_depth", "Requests waiting for admission", value=snapshot.queue_depth
            )
        if snapshot.engines:
            yield from _each_engine(snapshot.engines)


def _each_engine(readings: tuple[EngineReading, ...]) -> Iterable[Metric]:
    """Per-engine series, labelled ``engine``, when serve runs several engines."""
    state = GaugeMetricFamily(
        "toolpair_engine_instance_state", "1 for each engine's current state", labels=["engine", "state"]
    )
    restarts = CounterMetricFamily("toolpair_engine_instance_restarts", "Restarts of each engine", labels=["engine"])
    active = GaugeMetricFamily("toolpair_engine_instance_active", "Requests each engine works on", labels=["engine"])
    served = CounterMetricFamily(
        "toolpair_engine_instance_requests", "Requests given to each engine", labels=["engine"]
    )
    for reading in readings:
        for name in dict.fromkeys((*ENGINE_STATES, reading.state)):
            state.add_metric([reading.name, name], 1.0 if name == reading.state else 0.0)
        restarts.add_metric([reading.name], reading.restarts)
        active.add_metric([reading.name], reading.active)
        served.add_metric([reading.name], reading.served)
    yield from (state, restarts, active, served)


class _Histogram:
    """One histogram's state: a count per bucket (not cumulative) and the sum of what was observed."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(_BOUNDS)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # The first bound at or above the value: prometheus_client's ``amount <= bound`` rule.
        self.counts[bisect_left(_BOUNDS, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        return list(zip(_BOUND_NAMES, map(float, accumulate(self.counts)), strict=True))


_BOUNDS = (*_SECONDS, math.inf)
_BOUND_NAMES: tuple[str, ...] = tuple(floatToGoString(bound) for bound in _BOUNDS)  # type: ignore[no-untyped-call]


class Metrics:
    """The counts of one app, and the one place a finished request is counted.

    Counted in plain integers, floats and bucket lists, on the event loop that serves the requests
    (no locks: nothing else writes them), and handed to prometheus_client at scrape time by
    :meth:`collect`, the app registry's collector: a request costs a few dict and list updates
    instead of nine locked prometheus_client increments. The exposition is what prometheus_client's
    own Counter, Gauge and Histogram would give for the same observations, family for family and
    sample for sample, in the order they were first counted (``tests/ops/test_metrics_exposition.py``).
    """

    def __init__(self, engine_probe: Callable[[], EngineSnapshot | None] = lambda: None) -> None:
        # No ``*_created`` series: a timestamp per labelled series that no dashboard reads, and that
        # makes a new series look like a change between two scrapes. prometheus_client's switch is
        # process-wide, read at each scrape; every registry in toolpair's process is toolpair's.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.in_flight = 0
        """Requests being served now."""
        self.requests: dict[tuple[str, str], int] = {}
        """By (route, status)."""
        self.timers: dict[str, tuple[_Histogram, _Histogram]] = {}
        """By route: request duration and upstream time to first byte."""
        self.runs: dict[str, list[int]] = {api: [0, 0] for api in APIS}
        """By api: runs reordered, runs already in order."""
        self.runs_kept: dict[tuple[str, str], int] = {}
        """By (api, reason)."""
        self.toolcalls_extracted = 0
        self.toolcall_failures = 0
        self.queue_wait = _Histogram()
        self.tokens: dict[str, list[int]] = {}
        """By route: prompt tokens, completion tokens."""
        self.api_routes: dict[tuple[str, str, str], int] = {}
        """By (api, route, reason)."""
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.registry.register(_EngineCollector(engine_probe))

    def record(self, trace: Trace, route: str, status: int, duration: float, usage: Usage | None) -> None:
        """Count one finished request; ``usage`` is ``trace.usage()``, read once by the caller."""
        key = (route, str(status))
        requests = self.requests
        requests[key] = requests.get(key, 0) + 1
        timers = self.timers.get(route)
        if timers is None:
            timers = self.timers[route] = (_Histogram(), _Histogram())
        timers[0].observe(duration)
        ttfb = trace.upstream_ttfb
        if ttfb is not None:
            timers[1].observe(ttfb)
        for api, report in trace.orders:
            runs = self.runs.get(api)
            if runs is None:
                runs = self.runs[api] = [0, 0]
            runs[0] += report.reordered
            runs[1] += report.in_order
            for reason, count in report.kept.items():
                kept = (api, reason)
                self.runs_kept[kept] = self.runs_kept.get(kept, 0) + count
        self.toolcalls_extracted += trace.toolcalls_extracted
        self.toolcall_failures += trace.toolcalls_failed
        if trace.queue_wait is not None:
            self.queue_wait.observe(trace.queue_wait)
        if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
            tokens = self.tokens.get(route)
            if tokens is None:
                tokens = self.tokens[route] = [0, 0]
            tokens[0] += usage.prompt_tokens or 0
            tokens[1] += usage.completion_tokens or 0

    def route_taken(self, api: str, route: str, reason: str) -> None:
        """Count one Messages or Responses request by the route it took (:mod:`proxy.engine.route`)."""
        key = (api, route, reason)
        self.api_routes[key] = self.api_routes.get(key, 0) + 1

    def totals(self) -> dict[str, int]:
        """Counter totals over all labels, for ``/toolpair/status``."""
        return {
            "requests": sum(self.requests.values()),
            "runs_reordered": sum(runs[0] for runs in self.runs.values()),
            "runs_in_order": sum(runs[1] for runs in self.runs.values()),
            "runs_kept": sum(self.runs_kept.values()),
            "tool_calls_extracted": self.toolcalls_extracted,
            "tool_call_extraction_failures": self.toolcall_failures,
            "prompt_tokens": sum(tokens[0] for tokens in self.tokens.values()),
            "completion_tokens": sum(tokens[1] for tokens in self.tokens.values()),
        }

    def collect(self) -> Iterable[Metric]:
        """The request families, for the registry at scrape time (in the order they were declared before)."""
        requests = CounterMetricFamily("toolpair_requests", "Requests answered", labels=["route", "status"])
        for labels, count in self.requests.items():
            requests.add_metric(labels, count)
        yield requests
        yield GaugeMetricFamily("toolpair_requests_in_flight", "Requests being served now", value=self.in_flight)
        duration = HistogramMetricFamily(
            "toolpair_request_duration_seconds", "Request start to last byte sent", labels=["route"]
        )
        ttfb = HistogramMetricFamily(
            "toolpair_upstream_ttfb_seconds", "Upstream request sent to first body byte received", labels=["route"]
        )
        for route, (total, first_byte) in self.timers.items():
            duration.add_metric([route], total.buckets(), total.total)
            ttfb.add_metric([route], first_byte.buckets(), first_byte.total)
        yield duration
        yield ttfb
        reordered = CounterMetricFamily(
            "toolpair_runs_reordered", "Tool-result runs put into call order", labels=["api"]
        )
        in_order = CounterMetricFamily("toolpair_runs_in_order", "Runs already in call order", labels=["api"])
        for api, (moved, kept_order) in self.runs.items():
            reordered.add_metric([api], moved)
            in_order.add_metric([api], kept_order)
        yield reordered
        yield in_order
        kept = CounterMetricFamily(
            "toolpair_runs_kept", "Runs left in received order, by reason", labels=["api", "reason"]
        )
        for labels, count in self.runs_kept.items():
            kept.add_metric(labels, count)
        yield kept
        yield CounterMetricFamily(
            "toolpair_tool_calls_extracted", "Tool calls parsed out of model text", value=self.toolcalls_extracted
        )
        yield CounterMetricFamily(
            "toolpair_tool_call_extraction_failures",
            "Tool-call texts that could not be parsed",
            value=self.toolcall_failures,
        )
        queue_wait = HistogramMetricFamily("toolpair_queue_wait_seconds", "Time spent waiting for admission")
        queue_wait.add_metric([], self.queue_wait.buckets(), self.queue_wait.total)
        yield queue_wait
        prompt = CounterMetricFamily("toolpair_prompt_tokens", "Prompt tokens reported in usage", labels=["route"])
        completion = CounterMetricFamily(
            "toolpair_completion_tokens", "Completion tokens reported in usage", labels=["route"]
        )
        for route, (prompt_count, completion_count) in self.tokens.items():
            prompt.add_metric([route], prompt_count)
            completion.add_metric([route], completion_count)
        yield prompt
        yield completion
        routes = CounterMetricFamily(
            "toolpair_api_routes",
            "Messages and Responses requests by the route they took (native or translate) and why",
            labels=["api", "route", "reason"],
        )
        for route_labels, count in self.api_routes.items():
            routes.add_metric(route_labels, count)
        yield routes
        build = GaugeMetricFamily("toolpair_build_info", "toolpair version", labels=["version"])
        build.add_metric([__version__], 1)
        yield build


METRICS = web.AppKey("metrics", Metrics)


def metrics_handler(metrics: Metrics) -> Handler:
    """``GET /metrics``: prometheus-client's own exposition, with its content negotiation."""
    return make_aiohttp_handler(metrics.registry)


_EOF = b"# EOF"


def append_exposition(engine: bytes, content_type: str, registry: CollectorRegistry) -> bytes | None:
    """The engine's exposition with this registry's families after its own, in the engine's format.

    None when the engine's body is in neither Prometheus text format, so it goes out as it is.
    The engine's lines are never touched: toolpair's families are all ``toolpair_*``, so names
    cannot meet. OpenMetrics keeps its one ``# EOF`` at the very end.

    >>> from prometheus_client import Gauge
    >>> r = CollectorRegistry()
    >>> _ = Gauge("toolpair_x", "x", registry=r)
    >>> print(append_exposition(b"llamacpp:a 1", "text/plain; version=0.0.4", r).decode())
    llamacpp:a 1
    # HELP toolpair_x x
    # TYPE toolpair_x gauge
    toolpair_x 0.0
    <BLANKLINE>
    >>> append_exposition(b"a 1\\n# EOF\\n", "application/openmetrics-text", r).decode().splitlines()[-1]
    '# EOF'
    >>> append_exposition(b"{}", "application/json", r) is None
    True
    """
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "text/plain":
        head = engine if not engine or engine.endswith(b"\n") else engine + b"\n"
        return head + generate_latest(registry)
    if kind == "application/openmetrics-text":
        ours: bytes = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
        ours = ours[: ours.rfind(_EOF)] if _EOF in ours else ours
        cut = engine.rfind(_EOF)
        if cut < 0:
            head = engine if not engine or engine.endswith(b"\n") else engine + b"\n"
            return head + ours + _EOF + b"\n"
        return engine[:cut] + ours + engine[cut:]
    return None
