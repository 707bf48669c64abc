"""Prometheus metrics (one registry per process, served at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

APPENDS = Counter("yoke_stream_appends_total", "Events appended to streams", ["tenant"])
APPEND_LATENCY = Histogram(
    "yoke_append_latency_seconds",
    "Time from an append call to its durable commit",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
OPEN_TAILS = Gauge("yoke_open_tails", "Live tails served over HTTP (SSE)")
HTTP_REQUESTS = Counter(
    "yoke_http_requests_total", "HTTP requests by route template, method and status", ["route", "method", "status"]
)
HTTP_LATENCY = Histogram(
    "yoke_http_request_seconds", "HTTP request duration by route template", ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
