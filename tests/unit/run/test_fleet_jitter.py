"""Heartbeats and claims stay cheap as the fleet grows (docs/protocol.md, "Run's own choices",
"Edge"): Run's heartbeat phases and claim waits carry jitter within their bounds (a seeded
draw), and a heartbeat finds the connection the previous one opened still open (the
platform's keep-alive outlives the heartbeat interval, and the edge's head deadline lets a
kept connection stay idle that long).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from moonrun.backoff import jittered
from moonrun.http.edge import ServeSettings, server_config
from moonrun.http.platform import HttpSettings
from moonrun.run.agent import Agent, RunConfig
from moonrun.service.config import SchedulingSettings
from tests.unit.http.test_http_edge import Edge


def draws(seed: int) -> RunConfig:
    return RunConfig(
        platform_url="http://127.0.0.1:9",
        data_dir=Path("/nonexistent"),
        capacity=1,
        draw=random.Random(seed).random,
    )


class Jitter(Agent):
    """An agent with nothing but its config: its jitter needs no more."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config


def test_heartbeat_pauses_and_claim_waits_are_jittered_within_bounds() -> None:
    run = Jitter(draws(7))
    interval = SchedulingSettings().heartbeat_interval_s
    phases = [Jitter(draws(seed)).heartbeat_pause(interval, first=True) for seed in range(200)]
    assert all(0 <= phase < interval for phase in phases)
    assert max(phases) - min(phases) > interval / 2, "first phases spread over the interval"
    pauses = [run.heartbeat_pause(interval, first=False) for _ in range(500)]
    assert all(0.9 * interval <= pause <= 1.1 * interval for pause in pauses)
    assert len({round(pause, 6) for pause in pauses}) > 400
    waits = [run.claim_wait_s() for _ in range(500)]
    wait = run.config.claim_wait_s
    assert all(0.9 * wait <= w <= 1.1 * wait for w in waits)
    assert max(waits) - min(waits) > wait / 10
    assert max(waits) < HttpSettings().max_claim_wait_s, "the platform honours no more"


def test_jittered_is_within_its_spread_and_refuses_a_wrong_one() -> None:
    assert jittered(10, 0.1, lambda: 0.0) == pytest.approx(9.0)
    assert jittered(10, 0.1, lambda: 0.5) == pytest.approx(10.0)
    assert jittered(10, 0.1, lambda: 0.999999) == pytest.approx(11.0, abs=1e-4)
    with pytest.raises(ValueError, match="spread"):
        jittered(10, 1.5)


def test_the_platform_keeps_a_connection_alive_longer_than_the_heartbeat_interval() -> None:
    settings = ServeSettings()
    beat = SchedulingSettings().heartbeat_interval_s
    assert settings.keep_alive_s > beat * 1.1
    config = server_config(lambda *_: None, "127.0.0.1", 0, settings)
    assert config.timeout_keep_alive == settings.keep_alive_s
    assert config.http.edge.limits.idle_s == settings.keep_alive_s  # type: ignore[attr-defined]


def test_a_kept_connection_may_stay_idle_for_the_keep_alive_before_its_head_deadline() -> None:
    edge = Edge(header_timeout_s=5, idle_s=20)
    edge.config.timeout_keep_alive = 20  # as `server_config` sets both
    sock = edge.connect()
    edge.send(sock, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\nok")
    edge.answer(sock)
    edge.loop.advance(19)  # idle, under the keep-alive: the next heartbeat's head begins
    assert not sock.closed
    edge.send(sock, b"POST /run/v1/heartbeat HTTP/1.1\r\n")
    edge.loop.advance(5.9)  # its head then has its own deadline, from the end of the idle time
    assert not sock.closed
    edge.loop.advance(0.2)
    assert sock.closed
    idle = edge.connect()
    edge.send(idle, b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\nok")
    edge.answer(idle)
    edge.loop.advance(20.1)  # idle past the keep-alive: closed
    assert idle.closed
    fresh = edge.connect()  # a fresh connection has no idle allowance
    edge.loop.advance(5.1)
    assert fresh.closed
