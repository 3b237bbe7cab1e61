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
``/health``, ``/ready``, ``/toolpair/status``) counts nowhere: two scrapes with
nothing between them are the same bytes.

``route`` is the matched route's path (``/v1/chat/completions``), or
``passthrough`` for everything forwarded as is: never the raw path, which
would let clients create unbounded series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics

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


class Metrics:
    """The metric objects of one app, and the one place a finished request is counted."""

    def __init__(self, engine_probe: Callable[[], EngineSnapshot | None] = lambda: None) -> None:
        # No ``*_created`` series: a timestamp per labelled child that no dashboard reads, and that
        # makes a new child look like a change between two scrapes. prometheus_client's switch is
        # process-wide, read at each scrape; every registry in toolpair's process is toolpair's.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        # Labelled children by label values: labels() takes a lock and validates on every call.
        self._children: dict[tuple[str, ...], Any] = {}
        r = self.registry
        self.requests = Counter("toolpair_requests", "Requests answered", ["route", "status"], registry=r)
        self.in_flight = Gauge("toolpair_requests_in_flight", "Requests being served now", registry=r)
        self.duration = Histogram(
            "toolpair_request_duration_seconds",
            "Request start to last byte sent",
            ["route"],
            buckets=_SECONDS,
            registry=r,
        )
        self.upstream_ttfb = Histogram(
            "toolpair_upstream_ttfb_seconds",
            "Upstream request sent to first body byte received",
            ["route"],
            buckets=_SECONDS,
            registry=r,
        )
        self.runs_reordered = Counter(
            "toolpair_runs_reordered", "Tool-result runs put into call order", ["api"], registry=r
        )
        self.runs_in_order = Counter("toolpair_runs_in_order", "Runs already in call order", ["api"], registry=r)
        self.runs_kept = Counter(
            "toolpair_runs_kept", "Runs left in received order, by reason", ["api", "reason"], registry=r
        )
        self.toolcalls_extracted = Counter(
            "toolpair_tool_calls_extracted", "Tool calls parsed out of model text", registry=r
        )
        self.toolcall_failures = Counter(
            "toolpair_tool_call_extraction_failures", "Tool-call texts that could not be parsed", registry=r
        )
        self.queue_wait = Histogram(
            "toolpair_queue_wait_seconds", "Time spent waiting for admission", buckets=_SECONDS, registry=r
        )
        self.prompt_tokens = Counter("toolpair_prompt_tokens", "Prompt tokens reported in usage", ["route"], registry=r)
        self.completion_tokens = Counter(
            "toolpair_completion_tokens", "Completion tokens reported in usage", ["route"], registry=r
        )
        self.api_routes = Counter(
            "toolpair_api_routes",
            "Messages and Responses requests by the route they took (native or translate) and why",
            ["api", "route", "reason"],
            registry=r,
        )
        Gauge("toolpair_build_info", "toolpair version", ["version"], registry=r).labels(__version__).set(1)
        for api in APIS:
            self.runs_reordered.labels(api)
            self.runs_in_order.labels(api)
        r.register(_EngineCollector(engine_probe))

    def record(self, trace: Trace, route: str, status: int, duration: float, usage: Usage | None) -> None:
        """Count one finished request; ``usage`` is ``trace.usage()``, read once by the caller."""
        children = self._children
        key = (route, str(status))
        count = children.get(key)
        if count is None:
            count = children[key] = self.requests.labels(*key)
        count.inc()
        timers = children.get((route,))
        if timers is None:
            timers = children[(route,)] = (self.duration.labels(route), self.upstream_ttfb.labels(route))
        timers[0].observe(duration)
        ttfb = trace.upstream_ttfb
        if ttfb is not None:
            timers[1].observe(ttfb)
        for api, report in trace.orders:
            runs = children.get(("runs", api))
            if runs is None:
                runs = children[("runs", api)] = (self.runs_reordered.labels(api), self.runs_in_order.labels(api))
            if report.reordered:
                runs[0].inc(report.reordered)
            if report.in_order:
                runs[1].inc(report.in_order)
            for reason, count in report.kept.items():
                self.runs_kept.labels(api, reason).inc(count)
        if trace.toolcalls_extracted:
            self.toolcalls_extracted.inc(trace.toolcalls_extracted)
        if trace.toolcalls_failed:
            self.toolcall_failures.inc(trace.toolcalls_failed)
        if trace.queue_wait is not None:
            self.queue_wait.observe(trace.queue_wait)
        if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
            tokens = children.get(("tokens", route))
            if tokens is None:
                tokens = children[("tokens", route)] = (
                    self.prompt_tokens.labels(route),
                    self.completion_tokens.labels(route),
                )
            if usage.prompt_tokens:
                tokens[0].inc(usage.prompt_tokens)
            if usage.completion_tokens:
                tokens[1].inc(usage.completion_tokens)

    def totals(self) -> dict[str, int]:
        """Counter totals over all labels, for ``/toolpair/status``."""
        counters = {
            "requests": self.requests,
            "runs_reordered": self.runs_reordered,
            "runs_in_order": self.runs_in_order,
            "runs_kept": self.runs_kept,
            "tool_calls_extracted": self.toolcalls_extracted,
            "tool_call_extraction_failures": self.toolcall_failures,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        return {name: int(_total(counter)) for name, counter in counters.items()}


def _total(counter: Counter) -> float:
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))


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
