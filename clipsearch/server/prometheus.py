"""Prometheus metrics of ``clipsearch serve`` (``GET /metrics``, the text exposition format).

What is counted: requests by route, method and status; their latency by route and query kind;
the time of each query's model call by index and kind; the images and generation of each served
index; the reloads of new generations (counted when a scrape finds one). One :class:`ServerMetrics` per app (own registry), so
several apps live in one process.

With ``--workers N`` the CLI sets ``PROMETHEUS_MULTIPROC_DIR`` before the workers start: the
counters and histograms are then written by every worker to files there and summed at each
scrape (prometheus-client's multiprocess mode). The index gauges are read at scrape time by the
worker that answers it (every worker serves the same directories and reloads them alike).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval.errors import ClipSearchError

from .indexes import IndexSet

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A request no route matched (a 404, or a 413 refused before routing): one label, not its path,
# so that scanning clients cannot grow the label set.
UNMATCHED = "unmatched"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def multiprocess_dir() -> str | None:
    """The directory of prometheus-client's multiprocess mode, when this process is a worker."""
    return os.environ.get(MULTIPROC_ENV) or None


class ServerMetrics:
    """The metrics of one app over ``indexes``.

    Args:
        indexes: the served indexes (their gauges are read at scrape time; their model calls
            are timed once :meth:`connect` is called).
    """

    def __init__(self, indexes: IndexSet) -> None:
        self.indexes = indexes
        self.multiprocess = multiprocess_dir() is not None
        # In multiprocess mode values live in the shared files; a scrape reads them all.
        self.registry: CollectorRegistry | None = None if self.multiprocess else CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "clipsearch_http_requests", "HTTP requests answered, by route, method and status",
            ["route", "method", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "clipsearch_http_request_duration_seconds", "Time to answer a request, by route and query kind",
            ["route", "kind"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.model_calls = Histogram(
            "clipsearch_query_model_seconds",
            "Time of a query's model call: a text query's encoding (the text tower, or a query-cache hit); an image query's "
            "decoding, encoding and FAISS search",
            ["index", "kind"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.reloads = Counter(
            "clipsearch_index_reloads", "New generations of an index picked up without a restart", ["index"], registry=self.registry
        )
        self._seen: dict[str, str] = {}
        self._seen_lock = threading.Lock()
        self._index_collector = _IndexCollector(self)
        if self.registry is not None:
            self.registry.register(self._index_collector)

    def connect(self) -> None:
        """Time the model calls of every served index from now on."""
        for served in self.indexes:
            served.on_model_call = self._observer(served.name)

    def _observer(self, name: str) -> Callable[[str, float], None]:
        def observe(kind: str, seconds: float) -> None:
            self.model_calls.labels(name, kind).observe(seconds)

        return observe

    def record(self, route: str, method: str, status: int, kind: str, seconds: float) -> None:
        """Count one answered request."""
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, kind).observe(seconds)

    def note_generation(self, name: str, generation: str) -> None:
        """Count a reload when ``name`` now answers from another generation than when last seen."""
        with self._seen_lock:
            last = self._seen.get(name)
            self._seen[name] = generation
        if last is not None and last != generation:
            self.reloads.labels(name).inc()

    def exposition(self) -> bytes:
        """The scrape's body (blocking: index gauges may stat and reopen directories)."""
        # Before collecting, so that a reload seen now is in this scrape's counter.
        for served in self.indexes:
            try:
                self.note_generation(served.name, str(served.current().manifest.generation))
            except ClipSearchError:
                continue  # a generation that cannot be opened: /api answers the error
        if self.registry is not None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        registry.register(self._index_collector)
        return generate_latest(registry)


class _IndexCollector:
    """The served indexes' gauges, read when scraped (a new generation is picked up then)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # collected fresh at each scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        images = GaugeMetricFamily("clipsearch_index_images", "Images in the served generation of an index", labels=["index"])
        generation = GaugeMetricFamily(
            "clipsearch_index_generation", "The served generation of an index (its id as a label; value: its creation time)",
            labels=["index", "generation"],
        )
        cache = GaugeMetricFamily("clipsearch_query_cache_lookups", "Query-vector cache lookups of an index", labels=["index", "result"])
        for served in self.metrics.indexes:
            try:
                index = served.current()
            except ClipSearchError:
                continue  # a generation that cannot be opened: /api answers the error
            m = index.manifest
            images.add_metric([served.name], m.count)
            generation.add_metric([served.name, str(m.generation)], _timestamp(m.created))
            info: dict[str, Any] = index.encoders.cache_info()
            cache.add_metric([served.name, "hit"], info.get("hits", 0))
            cache.add_metric([served.name, "miss"], info.get("misses", 0))
        yield from (images, generation, cache)


def _timestamp(created: str) -> float:
    try:
        return datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class MetricsMiddleware:
    """Times and counts every HTTP request (outermost, so the last-resort 500 is counted too).

    The route label is the matched route's path template (``/api/images/{image_id}``), never
    the request's path; the kind label is what a search handler put in ``request.state.query_kind``.

    Args:
        app: the wrapped application.
        metrics: where to count.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Shared by every copy of the scope down to the handler (request.state lives in it).
        state = scope.setdefault("state", {})
        status = 500
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED
            kind = str(state.get("query_kind", "none"))
            self.metrics.record(route, scope.get("method", ""), status, kind, time.perf_counter() - started)


__all__ = ["CONTENT_TYPE", "MULTIPROC_ENV", "MetricsMiddleware", "ServerMetrics", "multiprocess_dir"]
