"""The sweeper applies passed deadlines with no message from anyone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from moonrun.errors import StoreUnavailable
from moonrun.http.channels import Channel
from moonrun.http.platform import HttpSettings
from moonrun.scheduling.jobs import JobState
from moonrun.service.sweeper import Sweeper
from moonrun.store.memory import MemoryStore
from moonrun.wiring.app import create_app
from tests.support.harness import SETTINGS, World
from tests.support.http_harness import HttpWorld
from tests.support.launcher import wait_for
from tests.support.stores import StoreFactory, memory_factory


class StopAfterSweeps(Channel):
    """An ops channel that stops the sweeper after a number of sweeps."""

    def __init__(self, stop: anyio.Event, sweeps: int) -> None:
        super().__init__("ops", 1)
        self.stop = stop
        self.left = sweeps

    async def run(self, work: Any, *args: Any, **kwargs: Any) -> Any:
        result = await super().run(work, *args, **kwargs)
        self.left -= 1
        if self.left == 0:
            self.stop.set()
        return result


@pytest.mark.anyio
async def test_the_sweeper_applies_passed_deadlines_without_any_message(world: World) -> None:
    """A claimed job whose ack deadline passed goes to retrying on the sweeper's own."""
    job = world.submit()
    world.run().start().claim()
    world.clock.advance(world.settings.ack_timeout_ms)
    stop = anyio.Event()
    sweeper = Sweeper(world.service, StopAfterSweeps(stop, 1), interval_s=60)

    await sweeper.run(stop)

    assert (
        sweeper.swept,
        world.job(job.id).state,
        sweeper.running,
    ) == (1, JobState.RETRYING, False)


@pytest.mark.anyio
async def test_the_sweeper_keeps_going_while_whole_batches_come_back(
    store_factory: StoreFactory,
) -> None:
    """A full batch is followed by another sweep at once, not after the interval."""
    world = World(store_factory, settings=replace(SETTINGS, sweep_batch=2))
    for _ in range(3):
        world.submit()
    world.run().start(capacity=3).claim(3)
    world.clock.advance(world.settings.ack_timeout_ms)
    stop = anyio.Event()
    sweeper = Sweeper(world.service, StopAfterSweeps(stop, 2), interval_s=3600)

    with anyio.fail_after(10):  # a hang guard only: the interval alone would take an hour
        await sweeper.run(stop)

    world.store.close()
    assert sweeper.swept == 3


class FlakyStore:
    """A store that can be taken down: while `down`, every call raises StoreUnavailable."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable("store memory:// failed: taken down by the test")
            return attribute(*args, **kwargs)

        return call


class FirstPassFindsTheStoreDown(Channel):
    """An ops channel whose first sweep finds the store down; it records what the sweeper said
    about the store before each pass, and stops the sweeper after the third."""

    def __init__(self, stop: anyio.Event, store: FlakyStore) -> None:
        super().__init__("ops", 1)
        self.stop = stop
        self.store = store
        self.sweeper: Sweeper | None = None
        self.seen: list[str | None] = []

    async def run(self, work: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.sweeper is not None
        self.seen.append(self.sweeper.store_failure)
        self.store.down = len(self.seen) == 1
        if len(self.seen) == 3:
            self.stop.set()
        return await super().run(work, *args, **kwargs)


@pytest.mark.anyio
async def test_a_sweep_that_cannot_reach_the_store_reports_it_until_one_can() -> None:
    """store_failure holds the error of a pass that found the store down, None after the next."""
    store = FlakyStore(MemoryStore())
    world = World(StoreFactory("flaky", lambda: store, lambda s: s, lambda: "memory://"))
    stop = anyio.Event()
    channel = FirstPassFindsTheStoreDown(stop, store)
    channel.sweeper = sweeper = Sweeper(world.service, channel, interval_s=0)

    with anyio.fail_after(10):
        await sweeper.run(stop)

    failure = "store memory:// failed: taken down by the test"
    assert [None, failure, None] == channel.seen
    assert sweeper.store_failure is None


def test_healthz_is_store_unavailable_while_the_store_is_down_and_ok_after(
    tmp_path: Path,
) -> None:
    """/healthz: 503 store_unavailable, naming the store's error, while sweeps fail; then 200."""
    store = FlakyStore(MemoryStore())
    world = HttpWorld(
        StoreFactory("flaky", lambda: store, lambda s: s, lambda: "memory://"), Path()
    )
    platform = replace(world.platform, http=HttpSettings(sweep_interval_s=0.01))
    answers = []
    with TestClient(create_app(platform, sweep=True)) as client:

        def health_is(status: int) -> Any:
            response = client.get("/healthz")
            return response if response.status_code == status else None

        answers.append(wait_for(lambda: health_is(200), "/healthz 200", timeout_s=10))
        store.down = True
        answers.append(wait_for(lambda: health_is(503), "/healthz 503", timeout_s=10))
        store.down = False
        answers.append(wait_for(lambda: health_is(200), "/healthz 200 again", timeout_s=10))
    world.close()

    failure = {
        "code": "store_unavailable",
        "message": "store memory:// failed: taken down by the test",
    }
    expected = [{"status": "ok"}, {"error": failure}, {"status": "ok"}]
    assert expected == [answer.json() for answer in answers]
    assert answers[1].headers["retry-after"] == "1"


class HangsUntilReleased(Channel):
    """An ops channel whose first pass waits, like a query to a hung database server."""

    def __init__(self) -> None:
        super().__init__("ops", 1)
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def run(self, work: Any, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await super().run(work, *args, **kwargs)


@pytest.mark.anyio
async def test_a_sweep_that_does_not_come_back_reports_the_store_after_ten_seconds() -> None:
    """A pass that hangs: None at 9.9 s, a store failure from 10 s, None once it returns."""
    world = World(memory_factory())
    now = [100.0]
    channel = HangsUntilReleased()
    sweeper = Sweeper(world.service, channel, interval_s=0, monotonic=lambda: now[0])
    stop = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sweeper.run, stop)
            await channel.entered.wait()
            now[0] = 109.9
            early = sweeper.store_failure
            now[0] = 110.0
            stalled = sweeper.store_failure
            stop.set()
            channel.release.set()

    seen = [early, stalled, sweeper.store_failure]
    assert seen == [None, "the store has not answered for 10 s", None]
