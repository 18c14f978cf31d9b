"""The platform's lifespan runs the liveness flusher: the heartbeats it answered reach the
store (each session's `last_seen_at`) with its next pass, where every other platform process
over the store reads them (docs/protocol.md, "Liveness"). In process: the real ASGI app, a Run
that signs its requests, a manual clock for the platform's instants."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fastapi.testclient import TestClient

from moonrun.wiring.app import create_app
from tests.support.http_harness import SETTINGS, HttpWorld
from tests.support.launcher import wait_for
from tests.support.stores import memory_factory


def test_a_heartbeat_reaches_the_store_with_the_flushers_next_pass(tmp_path: Path) -> None:
    """The heartbeat (its expiry not due for rewriting) writes nothing itself, and an app that
    leaves the flusher to its caller (`sweep=False`) never writes it; the app that runs the
    flusher writes it with a pass (polled: no duration is asserted)."""
    world = HttpWorld(memory_factory(), tmp_path, settings=replace(SETTINGS, liveness_flush_s=0.01))
    run = world.create_endpoint("host-a").start()
    world.clock.advance(12_000)
    assert run.heartbeat().status_code == 200
    beat = world.clock.now()

    def stored_last_seen() -> int:
        session = world.store.latest_session(run.endpoint_id)
        assert session is not None
        return session.last_seen_at

    unwritten = stored_last_seen()
    with TestClient(create_app(world.platform, sweep=True)):
        written = wait_for(
            lambda: stored_last_seen() == beat, "the beat in the store", timeout_s=30, every_s=0.01
        )
    world.close()

    assert (unwritten < beat, written) == (True, True)
