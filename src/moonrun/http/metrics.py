"""Prometheus metrics of one platform instance: aggregate figures only, no ids or names (but
the process's own, which says which process of several answered)."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from moonrun import __version__
from moonrun.errors import JobRejected, MoonrunError
from moonrun.scheduling.jobs import JobState


class _JobsByState(Collector):
    """Reads the store's counts at scrape time, so every replica reports the same truth."""

    def __init__(self, job_counts: Callable[[], Mapping[JobState, int]]) -> None:
        self._job_counts = job_counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("moonrun_jobs", "Jobs by scheduling state", labels=["state"])
        counts = self._job_counts()
        for state in JobState:
            family.add_metric([state.value], counts.get(state, 0))
        yield family


class _Waiting(Collector):
    """Waiting claims and blocking reads right now (each bounded: docs/operations.md)."""

    def __init__(self, held: Callable[[str], int]) -> None:
        self._held = held

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "moonrun_waiting_requests", "Requests waiting right now", labels=["kind"]
        )
        for kind in ("claims", "reads"):
            family.add_metric([kind], self._held(kind))
        yield family


class _Load(Collector):
    """The event loop's lag and the Runs that heartbeat to this platform process."""

    def __init__(
        self,
        lag_s: Callable[[], float],
        connected: Callable[[], int],
        heartbeat_interval_s: Callable[[], float],
    ) -> None:
        self._lag_s = lag_s
        self._connected = connected
        self._heartbeat_interval_s = heartbeat_interval_s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "moonrun_loop_lag_seconds",
            "How late the platform's event loop runs its work",
            value=self._lag_s(),
        )
        yield GaugeMetricFamily(
            "moonrun_connected_runs",
            "Runs whose sessions heartbeat to this platform process within the session TTL",
            value=self._connected(),
        )
        yield GaugeMetricFamily(
            "moonrun_heartbeat_interval_seconds",
            "The heartbeat interval this platform process tells its Runs (stretched with them "
            "past --max-heartbeats-per-s)",
            value=self._heartbeat_interval_s(),
        )


def process_id() -> str:
    """This platform process among several: its host, its pid and a random tag (a restarted
    process, or one in a container where every pid is 1, is another)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _Process(Collector):
    """`moonrun_process_info{process, version} 1`: which process answered the scrape."""

    def __init__(self, process: str, version: str) -> None:
        self._labels = [process, version]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "moonrun_process_info",
            "The platform process that answered (host:pid:tag) and its version",
            labels=["process", "version"],
        )
        family.add_metric(self._labels, 1)
        yield family


class Metrics:
    """The counters and histograms the HTTP service updates, in a registry of its own."""

    def __init__(
        self,
        job_counts: Callable[[], Mapping[JobState, int]],
        waiting: Callable[[str], int] = lambda _: 0,
        *,
        lag_s: Callable[[], float] = lambda: 0.0,
        connected: Callable[[], int] = lambda: 0,
        heartbeat_interval_s: Callable[[], float] = lambda: 0.0,
        process: str | None = None,
    ) -> None:
        self.process = process or process_id()
        """Names this platform process (`/metrics`' `moonrun_process_info`)."""
        self.registry = CollectorRegistry()
        self.claims = Counter(
            "moonrun_claims", "Attempts granted to Run by claims", registry=self.registry
        )
        self.rejected = Counter(
            "moonrun_rejected_messages",
            "Run messages rejected, by error code",
            ["code"],
            registry=self.registry,
        )
        self.fenced = Counter(
            "fenced_writes_rejected",
            "Job messages refused by fencing or state checks (nothing was written)",
            registry=self.registry,
        )
        self.pruned = Counter(
            "moonrun_jobs_pruned",
            "Finished jobs deleted by retention (--retain-finished), with their data",
            registry=self.registry,
        )
        self.latency = Histogram(
            "moonrun_request_seconds",
            "Request latency by channel",
            ["channel"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.registry.register(_JobsByState(job_counts))
        self.registry.register(_Waiting(waiting))
        self.registry.register(_Load(lag_s, connected, heartbeat_interval_s))
        self.registry.register(_Process(self.process, __version__))
        self._latency: dict[str, Any] = {}

    def latency_of(self, channel: str) -> Any:
        """The latency histogram of one channel (looked up once, not per request)."""
        found = self._latency.get(channel)
        if found is None:
            found = self._latency[channel] = self.latency.labels(channel=channel)
        return found

    def count_rejection(self, error: MoonrunError) -> None:
        """A Run message refused with `error` (job messages also count as fenced writes)."""
        self.rejected.labels(code=error.code).inc()
        if isinstance(error, JobRejected):
            self.fenced.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
