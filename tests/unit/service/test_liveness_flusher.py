"""The liveness flusher (`service/liveness.py`): the heartbeats a platform process answered are
written by one store write per pass, however many Runs beat, never moving a session's
`last_seen_at` back; a failed write keeps its beats for the next pass. Counted in store calls
and FileStore commits on a manual clock: nothing here asserts a duration."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from moonrun.errors import StoreUnavailable
from moonrun.scheduling.time import Instant
from moonrun.service.liveness import LivenessFlusher
from moonrun.store.file import FileStore
from tests.support.harness import SETTINGS, World
from tests.support.stores import file_factory, memory_factory

SECOND = 1000


async def run_inline(work: Any, *args: Any) -> Any:
    return work(*args)


class Recorder:
    """The flusher's `record`: counts its calls, and fails the first `failures` of them."""

    def __init__(self, world: World, failures: int = 0) -> None:
        self.world, self.failures, self.calls = world, failures, 0

    def __call__(self, beats: Mapping[str, Instant]) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("the store is down")
        self.world.service.record_beats(beats)


def file_world(tmp_path: Path) -> World:
    counter = iter(range(1000))

    def make_dir() -> Path:
        directory = tmp_path / f"s{next(counter)}"
        directory.mkdir()
        return directory

    return World(file_factory(make_dir))


def fleet(world: World, size: int) -> list[str]:
    """`size` Runs registered now, each on its own endpoint: their session ids."""
    sessions = []
    for n in range(size):
        endpoint = world.join(f"fleet-{n}", 10 + n)
        registration = world.service.register_session(
            endpoint.id, boot_id="boot-1", run_version="0.1.0", capacity=1
        )
        sessions.append(registration.session.id)
    return sessions


def beat(world: World, session_ids: list[str]) -> None:
    """Each session heartbeats once, through the route's path (`heartbeat_shared`)."""

    async def beats() -> None:
        for session_id in session_ids:
            await world.service.heartbeat_shared(session_id, run_inline)

    asyncio.run(beats())


def test_the_beats_of_a_pass_are_written_in_one_store_write(tmp_path: Path) -> None:
    """120 Runs heartbeat (none of their expiries due for rewriting): nothing is written until
    the pass, which writes them all in one commit."""
    world = file_world(tmp_path)
    store = world.store
    assert isinstance(store, FileStore)
    sessions = fleet(world, 120)
    world.clock.advance(10 * SECOND)
    recorder = Recorder(world)
    flusher = LivenessFlusher(world.service.beats, recorder, run_inline, interval_s=2)

    before = store.groups_committed
    beat(world, sessions)
    by_heartbeats = store.groups_committed - before
    written = asyncio.run(flusher.flush())
    by_pass = store.groups_committed - before - by_heartbeats

    assert (by_heartbeats, written, recorder.calls, by_pass) == (0, 120, 1, 1)
    now = world.clock.now()
    seen = {store.get_session(sid).last_seen_at for sid in sessions}  # type: ignore[union-attr]
    assert seen == {now}


def idle_minute(size: int) -> tuple[int, int, int, int]:
    """A minute of `size` idle Runs registered together, heartbeating every 10 s spread over
    the interval, with a flusher's pass every 2 s: (liveness writes, beats they held, session
    extensions written, heartbeats)."""
    world = World(memory_factory())
    sessions = fleet(world, size)
    flusher = LivenessFlusher(world.service.beats, Recorder(world), run_inline, interval_s=2)
    beat_ms = round(SETTINGS.heartbeat_interval_s * 1000)
    start, beats = world.clock.now(), 0
    due = {sid: start + (n * beat_ms) // size for n, sid in enumerate(sessions)}
    for _ in range(60 * SECOND // 100):  # 0.1 s steps
        now = world.clock.advance(100)
        beating = [sid for sid, at in due.items() if at <= now]
        beat(world, beating)
        beats += len(beating)
        due = {sid: at + beat_ms if at <= now else at for sid, at in due.items()}
        if (now - start) % (2 * SECOND) == 0:
            asyncio.run(flusher.flush())
    return flusher.writes, flusher.recorded, world.service.extensions.extended, beats


def test_an_idle_fleet_costs_one_liveness_write_per_pass_whatever_its_size() -> None:
    """10 Runs and 200 Runs: at most one liveness write per pass (30 in the minute; fewer when
    every beat of a pass was written by its session's extension), and every beat is written by
    one or the other; a session's expiry is still rewritten at most twice a minute per Run."""
    small, large = idle_minute(10), idle_minute(200)
    assert (small[0] <= 30, large[0] <= 30) == (True, True)
    assert (small[1] + small[2], large[1] + large[2]) == (small[3], large[3])
    assert large[3] >= 200 * 6
    assert (small[2] <= 10 * 2, large[2] <= 200 * 2) == (True, True)


def test_a_beat_older_than_the_stored_one_never_moves_it_back() -> None:
    """A beat noted at this process that is older than what the store holds (another process
    wrote a later one, or an extension did) leaves the stored `last_seen_at` as it is."""
    world = World(memory_factory())
    run = world.run().start()
    noted_at = world.clock.now() + 5 * SECOND
    world.clock.advance(30 * SECOND)
    run.heartbeat()  # its extension is due: it writes last_seen_at itself
    later = world.clock.now()
    world.service.beats.beat(run.session_id, noted_at)  # an older beat, noted late
    flusher = LivenessFlusher(world.service.beats, Recorder(world), run_inline, interval_s=2)

    asyncio.run(flusher.flush())

    stored = world.store.get_session(run.session_id)
    assert stored is not None
    assert stored.last_seen_at == later


def test_a_failed_write_keeps_its_beats_for_the_next_pass() -> None:
    world = World(memory_factory())
    sessions = fleet(world, 3)
    world.clock.advance(10 * SECOND)
    beat(world, sessions)
    recorder = Recorder(world, failures=1)
    flusher = LivenessFlusher(world.service.beats, recorder, run_inline, interval_s=2)

    with pytest.raises(StoreUnavailable):
        asyncio.run(flusher.flush())
    written = asyncio.run(flusher.flush())

    assert (recorder.calls, written, flusher.writes) == (2, 3, 1)
    now = world.clock.now()
    assert {world.store.get_session(sid).last_seen_at for sid in sessions} == {now}  # type: ignore[union-attr]


def test_a_pass_with_no_beats_writes_nothing() -> None:
    world = World(memory_factory())
    recorder = Recorder(world)
    flusher = LivenessFlusher(world.service.beats, recorder, run_inline, interval_s=2)
    assert (asyncio.run(flusher.flush()), recorder.calls) == (0, 0)
