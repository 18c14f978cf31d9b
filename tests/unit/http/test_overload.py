"""Overload says so (docs/protocol.md, "Overload"): while the event loop lags, the Run routes
that bring new work answer 503 `overloaded` with Retry-After and claims an empty grant, while
heartbeats, acks and results are served; /metrics shows the lag, the connected Runs and the
waiting claims; Run waits at least the Retry-After before it tries again.

The lag is injected (`platform.lag.lag_s`, or a manual clock and sleep for `LoopLag`): nothing
here reads the wall clock.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from moonrun.errors import Overloaded
from moonrun.http.load import LoopLag
from moonrun.run.client import TRANSIENT, error_from, pause_after
from tests.support.http_harness import Cast, http_world
from tests.support.stores import memory_factory

BEHIND_S = 3.0
"""A lag well past the platform's limit (`HttpSettings.overload_lag_s`)."""


@pytest.fixture
def cast(tmp_path: Path) -> Iterator[Cast]:
    with http_world(memory_factory(), tmp_path) as cast:
        yield cast


def test_an_overloaded_platform_refuses_new_work_with_retry_after(cast: Cast) -> None:
    world, run = cast.world, cast.run
    run.start()
    job = world.submit(cast.server_id, cast.owner[1])
    world.platform.lag.lag_s = BEHIND_S

    refused = cast.other_run.register()
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "overloaded"
    assert refused.headers["Retry-After"] == str(world.platform.http.overload_retry_after_s)
    assert run.reconcile([]).status_code == 503

    # What keeps held work alive is served; a claim is an empty grant at once.
    assert run.heartbeat().status_code == 200
    assert run.claim(4) == []
    assert world.stored(job["id"]).state.value == "queued"

    world.platform.lag.lag_s = 0.0
    assert cast.other_run.register().status_code == 201
    (granted,) = run.claim(4)
    assert granted["job_id"] == job["id"]


def test_metrics_show_loop_lag_connected_runs_and_waiting_claims(cast: Cast) -> None:
    world = cast.world
    cast.run.start()
    cast.other_run.start()
    assert cast.run.heartbeat().status_code == 200
    assert cast.other_run.heartbeat().status_code == 200
    world.platform.lag.lag_s = 0.25
    text = world.client.get("/metrics").text
    assert "moonrun_loop_lag_seconds 0.25" in text
    assert "moonrun_connected_runs 2.0" in text
    told = world.platform.service.settings.heartbeat_interval_s  # two Runs: not stretched
    assert f"moonrun_heartbeat_interval_seconds {told}" in text
    assert 'moonrun_waiting_requests{kind="claims"} 0.0' in text


def test_loop_lag_is_how_late_a_tick_wakes_and_a_stall_is_remembered() -> None:
    now = [0.0]
    oversleep = iter([0.0, 0.4, 0.0, 0.0])

    async def sleep(seconds: float) -> None:
        now[0] += seconds + next(oversleep)

    lag = LoopLag(0.1, clock=lambda: now[0], sleep=sleep)
    seen: list[float] = []
    ticks = itertools.count()

    def stop() -> bool:
        seen.append(lag.lag_s)
        return next(ticks) == 4

    asyncio.run(lag.run(stop))
    assert seen == pytest.approx([0.0, 0.0, 0.4, 0.2, 0.1])


def test_run_waits_at_least_the_retry_after_of_an_overloaded_platform() -> None:
    body = {"error": {"code": "overloaded", "message": "behind"}}
    error = error_from(503, body, "7")
    assert isinstance(error, Overloaded)
    assert isinstance(error, TRANSIENT)
    assert error.retry_after_s == 7
    assert pause_after(error, iter([0.5])) == 7.0
    assert pause_after(error_from(503, body, None), iter([3.0])) == 3.0


def test_registrations_never_take_the_places_heartbeats_need(cast: Cast) -> None:
    """A fleet registering at once fills the sessions channel, not the control channel."""
    channels = cast.world.platform.channels
    channels.sessions.in_flight = channels.sessions.limit  # registrations in flight
    refused = cast.run.register()
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "channel_busy"
    channels.sessions.in_flight = 0
    cast.run.start()
    channels.sessions.in_flight = channels.sessions.limit
    assert cast.run.heartbeat().status_code == 200
    channels.control.in_flight = channels.control.limit  # and the other way round
    assert cast.other_run.register().status_code == 429
    channels.sessions.in_flight = 0
    assert cast.other_run.register().status_code == 201
    assert cast.run.heartbeat().status_code == 429
