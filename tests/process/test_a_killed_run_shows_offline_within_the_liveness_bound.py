"""A Run killed with SIGKILL shows offline within the liveness bound (15 s after its last
heartbeat, with the default 10 s heartbeat interval), not when its session would expire; and,
offline, its endpoint still shows when it was last seen, its capacity and its Run version
(docs/protocol.md, "Liveness").

Real `moonrun platform serve` (FileStore) and `moonrun run start` processes; only the user API
is read. No tight timing: the endpoint must be offline by 25 s after the kill (the bound, plus
the time between the last heartbeat and the kill is at most 11 s: so 15 + a margin), where
before it stayed online until its session expired, 49 s or more after the kill here.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.faults import Platform, RunAgent, processes
from tests.support.launcher import Timings, wait_for

# Real platform and Run processes: the real-process lane of `make test` (docs/testing.md).
pytestmark = [pytest.mark.processes, pytest.mark.alone]

TIMINGS = Timings(lease_ttl_s=40, ack_timeout_s=30, heartbeat_interval_s=10, session_ttl_s=120)
"""The default heartbeat interval (so the bound is the documented 15 s) and a session TTL that
outlives it by far: a session's expiry is rewritten only once it would move by half the TTL, so
after any heartbeat it has 60 to 120 s left, and the old rule (online until the session
expires) kept a killed Run online for at least 49 s after the kill. With the default TTL
(50 s) that was 20 to 50 s: too close to 25 s to tell the rules apart every time."""

OFFLINE_BY_S = 25.0


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_killed_run_shows_offline_within_the_bound_and_keeps_its_last_facts(
    tmp_path: Path,
) -> None:
    platform = Platform(tmp_path, TIMINGS)
    run = RunAgent(tmp_path, capacity=3)
    with processes(platform, run):
        platform.start()
        endpoint_id, join_token, _ = platform.host("host-1")
        run.join(platform.url, join_token)
        run.start(platform.url)
        wait_for(
            lambda: platform.endpoint(endpoint_id)["online"], "Run to come online", timeout_s=30
        )
        # Killed whenever: the last beat (its registration, or a heartbeat) is before the kill.
        before = platform.endpoint(endpoint_id)
        run.kill()
        killed = time.monotonic()

        def offline() -> dict[str, Any] | None:
            view = platform.endpoint(endpoint_id)
            return None if view["online"] else view

        after = wait_for(
            offline, "the killed Run's endpoint offline", timeout_s=OFFLINE_BY_S, every_s=0.5
        )
        took_s = time.monotonic() - killed
        later = platform.endpoint(endpoint_id)

    assert before["online"] is True
    assert took_s <= OFFLINE_BY_S
    # Offline, it still shows what it offered and when it was last seen (no earlier than the
    # last beat seen before the kill), and goes on showing it.
    assert (after["capacity"], after["run_version"]) == (3, before["run_version"])
    assert after["run_version"] is not None
    assert instant(after["last_seen_at"]) >= instant(before["last_seen_at"])
    assert (later["online"], later["last_seen_at"], later["capacity"]) == (
        False,
        after["last_seen_at"],
        3,
    )
