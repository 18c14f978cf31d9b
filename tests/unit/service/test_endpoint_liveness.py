"""Endpoints' liveness through the use cases, over every store, on a manual clock
(docs/protocol.md, "Liveness"): a Run that stops heartbeating shows offline 15 s after its last
heartbeat (the heartbeat interval plus 5 s), not when its session would expire; an offline
endpoint still shows when it was last seen and what it offered; and another platform process
over the same store sees the same once the beats' flusher has written them."""

from __future__ import annotations

import asyncio
from typing import Any

from moonrun.scheduling.time import format_instant
from moonrun.service.liveness import LivenessFlusher
from moonrun.service.scheduling import SchedulingService
from tests.support.harness import World

SECOND = 1000
BOUND_MS = 15_000


def view_of(service: SchedulingService, world: World) -> dict[str, Any]:
    views = {view["id"]: view for view in service.endpoint_views(world.admin)}
    return dict(views[world.endpoint.id])


def shown(view: dict[str, Any]) -> tuple[Any, ...]:
    return (view["online"], view["last_seen_at"], view["capacity"], view["run_version"])


def test_a_silent_run_shows_offline_15_s_after_its_last_heartbeat_with_what_it_offered(
    world: World,
) -> None:
    """Online up to 15 s after the last heartbeat (its session still has 35 s to live), then
    offline, still showing that heartbeat's time, its capacity and Run version; the servers
    it hosts say the same."""
    run = world.run().start(capacity=3)
    world.clock.advance(8 * SECOND)
    run.heartbeat()
    beat = format_instant(world.clock.now())
    world.clock.advance(BOUND_MS)
    at_bound = view_of(world.service, world)
    hosted_at_bound = world.service.endpoints_online([world.endpoint.id])
    world.clock.advance(1)
    past = view_of(world.service, world)
    hosted_past = world.service.endpoints_online([world.endpoint.id])

    assert (shown(at_bound), hosted_at_bound) == (
        (True, beat, 3, "0.1.0"),
        {world.endpoint.id: True},
    )
    assert (shown(past), hosted_past) == ((False, beat, 3, "0.1.0"), {world.endpoint.id: False})
    # Fencing is unchanged: the session itself is still valid (a late heartbeat is accepted,
    # and the endpoint is online again).
    run.heartbeat()
    assert view_of(world.service, world)["online"] is True


def test_a_cleanly_stopped_run_still_shows_when_it_was_last_seen_and_what_it_offered(
    world: World,
) -> None:
    """After `sessions/end` the endpoint is offline at once, seen at its end, with what its
    last session offered, also for a platform process started afterwards (from the store)."""
    run = world.run().start(capacity=5)
    world.clock.advance(3 * SECOND)
    world.service.end_session(run.session_id)
    ended = format_instant(world.clock.now())
    world.clock.advance(60 * SECOND)
    here = shown(view_of(world.service, world))
    world.restart()
    elsewhere = shown(view_of(world.service, world))

    assert (here, elsewhere) == ((False, ended, 5, "0.1.0"), (False, ended, 5, "0.1.0"))


def test_another_platform_sees_a_heartbeat_once_the_flusher_wrote_it(world: World) -> None:
    """A heartbeat answered by one process (its expiry not due for rewriting) reaches another
    process's view with the flusher's next pass: before it, the other sees the registration's
    time only and, 15 s past that, offline; after it, online again."""
    run = world.run().start(capacity=2)
    other = SchedulingService(world.store, world.clock, world.tokens, world.settings)
    world.clock.advance(12 * SECOND)
    run.heartbeat()  # answered by world.service: noted, not written
    beat = format_instant(world.clock.now())
    world.clock.advance(4 * SECOND)  # 16 s after registering, 4 s after the beat
    flusher = LivenessFlusher(
        world.service.beats, world.service.record_beats, run_inline, interval_s=2
    )
    before = (shown(view_of(world.service, world)), view_of(other, world)["online"])
    asyncio.run(flusher.flush())
    after = shown(view_of(other, world))

    assert before == ((True, beat, 2, "0.1.0"), False)
    assert after == (True, beat, 2, "0.1.0")


async def run_inline(work: Any, *args: Any) -> Any:
    return work(*args)
