"""The sweeper applies passed deadlines with no message from anyone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest

from moonrun.platform.channels import Channel
from moonrun.platform.sweeper import Sweeper
from moonrun.scheduling.jobs import JobState
from tests.harness import SETTINGS, World
from tests.stores import StoreFactory


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
