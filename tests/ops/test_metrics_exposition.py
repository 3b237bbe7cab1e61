"""The metrics' exposition is what prometheus_client's own Counter, Gauge and Histogram give for the same counts.

:class:`~proxy.ops.metrics.Metrics` counts in plain integers and hands its families to prometheus_client at
scrape time. Here the same requests are counted both ways, toolpair's way and into a registry of
prometheus_client's metric classes declared as the families are documented, and the two scrapes must
be the same bytes, in both the text format and OpenMetrics: names, labels, values, sample order.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

import proxy
from proxy.ops.metrics import APIS, Metrics
from proxy.ops.trace import Trace
from proxy.ops.usage import Usage
from proxy.order import OrderReport

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Reference:
    """The families declared with prometheus_client's classes, counted the plain way."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("toolpair_requests", "Requests answered", ["route", "status"], registry=r)
        self.in_flight = Gauge("toolpair_requests_in_flight", "Requests being served now", registry=r)
        self.duration = Histogram(
            "toolpair_request_duration_seconds",
            "Request start to last byte sent",
            ["route"],
            buckets=SECONDS,
            registry=r,
        )
        self.ttfb = Histogram(
            "toolpair_upstream_ttfb_seconds",
            "Upstream request sent to first body byte received",
            ["route"],
            buckets=SECONDS,
            registry=r,
        )
        self.reordered = Counter("toolpair_runs_reordered", "Tool-result runs put into call order", ["api"], registry=r)
        self.in_order = Counter("toolpair_runs_in_order", "Runs already in call order", ["api"], registry=r)
        self.kept = Counter(
            "toolpair_runs_kept", "Runs left in received order, by reason", ["api", "reason"], registry=r
        )
        self.extracted = Counter("toolpair_tool_calls_extracted", "Tool calls parsed out of model text", registry=r)
        self.failed = Counter(
            "toolpair_tool_call_extraction_failures", "Tool-call texts that could not be parsed", registry=r
        )
        self.queue_wait = Histogram(
            "toolpair_queue_wait_seconds", "Time spent waiting for admission", buckets=SECONDS, registry=r
        )
        self.prompt = Counter("toolpair_prompt_tokens", "Prompt tokens reported in usage", ["route"], registry=r)
        self.completion = Counter(
            "toolpair_completion_tokens", "Completion tokens reported in usage", ["route"], registry=r
        )
        self.api_routes = Counter(
            "toolpair_api_routes",
            "Messages and Responses requests by the route they took (native or translate) and why",
            ["api", "route", "reason"],
            registry=r,
        )
        Gauge("toolpair_build_info", "toolpair version", ["version"], registry=r).labels(proxy.__version__).set(1)
        for api in APIS:
            self.reordered.labels(api)
            self.in_order.labels(api)

    def record(self, trace: Trace, route: str, status: int, duration: float, usage: Usage | None) -> None:
        self.requests.labels(route, str(status)).inc()
        self.duration.labels(route).observe(duration)
        ttfb = self.ttfb.labels(route)
        if trace.upstream_ttfb is not None:
            ttfb.observe(trace.upstream_ttfb)
        for api, report in trace.orders:
            self.reordered.labels(api).inc(report.reordered)
            self.in_order.labels(api).inc(report.in_order)
            for reason, count in report.kept.items():
                self.kept.labels(api, reason).inc(count)
        self.extracted.inc(trace.toolcalls_extracted)
        self.failed.inc(trace.toolcalls_failed)
        if trace.queue_wait is not None:
            self.queue_wait.observe(trace.queue_wait)
        if usage is not None and (usage.prompt_tokens or usage.completion_tokens):
            self.prompt.labels(route).inc(usage.prompt_tokens or 0)
            self.completion.labels(route).inc(usage.completion_tokens or 0)


def finished(
    started: float,
    *,
    ttfb: float | None = None,
    orders: Iterable[tuple[str, OrderReport]] = (),
    queue_wait: float | None = None,
    toolcalls: tuple[int, int] = (0, 0),
) -> Trace:
    trace = Trace("r", started=started)
    for api, report in orders:
        trace.order(api, report)
    if ttfb is not None:
        trace.upstream_sent_at, trace.first_byte_at = started, started + ttfb
    if queue_wait is not None:
        trace.queued(queue_wait)
    trace.toolcalls(*toolcalls)
    return trace


REQUESTS: list[tuple[Trace, str, int, float, Usage | None]] = [
    (finished(1.0, ttfb=0.003, orders=[("chat", OrderReport(reordered=1))]), "/v1/chat/completions", 200, 0.004, None),
    (finished(2.0, ttfb=0.02), "/v1/chat/completions", 200, 0.5, Usage(5, 1)),
    (finished(3.0), "/v1/chat/completions", 400, 0.0001, None),
    (finished(4.0, ttfb=700.0), "passthrough", 200, 701.25, Usage(4, None)),
    (
        finished(
            5.0,
            ttfb=1.0,
            orders=[("anthropic", OrderReport(in_order=2, kept={"duplicate_id": 1, "incomplete_run": 3}))],
            queue_wait=0.05,
            toolcalls=(2, 1),
        ),
        "/v1/messages",
        503,
        2.5,
        Usage(None, 7),
    ),
    (
        finished(6.0, orders=[("chat", OrderReport(kept={"duplicate_id": 2}))], queue_wait=0.0),
        "passthrough",
        499,
        5,
        None,
    ),
    (finished(7.0, ttfb=0.1), "/v1/chat/completions", 200, 0.1, Usage(0, 0)),
]


@pytest.mark.parametrize("counted", [0, 1, 3, len(REQUESTS)])
def test_the_scrape_is_prometheus_clients_own(counted: int) -> None:
    ours, reference = Metrics(), Reference()
    for trace, route, status, duration, usage in REQUESTS[:counted]:
        ours.record(trace, route, status, duration, usage)
        reference.record(trace, route, status, duration, usage)
    for api, route, reason in [
        ("anthropic", "native", "tools"),
        ("responses", "translate", "store"),
        ("anthropic", "native", "tools"),
    ][:counted]:
        ours.route_taken(api, route, reason)
        reference.api_routes.labels(api, route, reason).inc()
    ours.in_flight += counted
    reference.in_flight.inc(counted)
    assert generate_latest(ours.registry).decode() == generate_latest(reference.registry).decode()
    ours_om: bytes = openmetrics.generate_latest(ours.registry)  # type: ignore[no-untyped-call]
    reference_om: bytes = openmetrics.generate_latest(reference.registry)  # type: ignore[no-untyped-call]
    assert ours_om.decode() == reference_om.decode()
    if counted == len(REQUESTS):
        assert ours.totals() == {
            "requests": 7,
            "runs_reordered": 1,
            "runs_in_order": 2,
            "runs_kept": 6,
            "tool_calls_extracted": 2,
            "tool_call_extraction_failures": 1,
            "prompt_tokens": 9,
            "completion_tokens": 8,
        }
