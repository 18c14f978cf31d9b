"""A wait that ends, however it ends (answered, its client gone, refused, cancelled), leaves
the watch: no place held in a room, and no waiter left in the table for a later change to
wake. A waiter left in the table would only be woken in vain, so nothing else shows it: here
another request keeps waiting (the watch wakes nobody while nobody waits) and the wake-ups
are counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from moonrun.errors import Forbidden
from moonrun.scheduling.jobs import Job
from moonrun.service.waiting import Watch
from tests.support.harness import World
from tests.support.stores import memory_factory
from tests.unit.service.test_waiting import LONG_S, Lent, claim, read, started, steps_until


@pytest.fixture
def world() -> World:
    built = World(memory_factory())
    built.service.waiters.recheck_s = LONG_S  # only a wake-up or a departure ends a wait early
    return built


async def wakeups_of_a_change(watch: Watch, change: Callable[[], object]) -> int:
    before = watch.wakeups
    change()
    await asyncio.sleep(0)
    return watch.wakeups - before


def test_a_read_whose_client_left_is_not_woken_by_a_later_change(world: World) -> None:
    async def scenario() -> None:
        watch, gone, staying = world.service.waiters, Lent(), Lent()
        job, other = world.submit(), world.submit()
        left = await started(watch, read(world, world.owner, job, gone), "reads")
        stays = await started(watch, read(world, world.owner, other, staying), "reads")
        gone.left.set()
        await steps_until(left.done)
        woken = await wakeups_of_a_change(
            watch, lambda: world.service.cancel_job(world.owner, job.id)
        )
        assert (woken, watch.waiting, watch.held("reads")) == (0, 1, 1)
        staying.left.set()
        await steps_until(stays.done)
        assert (watch.waiting, watch.held("reads")) == (0, 0)

    asyncio.run(scenario())


def test_a_refused_read_leaves_no_waiter_and_no_place(world: World) -> None:
    """The reader lost its right while waiting for the job to leave `queued`: woken by the
    claim, refused; the ack after wakes nobody."""

    async def scenario() -> None:
        watch, staying = world.service.waiters, Lent()
        run = world.run().start()
        job = world.submit()
        leaves_queued = world.service.wait_for_job(
            lambda: world.helper,
            job.id,
            lambda job: job.state.value != "queued",
            wait_s=LONG_S,
            waiting=Lent().waiting(),
        )
        refused = await started(watch, leaves_queued, "reads")
        other = world.submit()
        stays = await started(watch, read(world, world.owner, other, staying), "reads")
        world.directory.remove_server_admin(world.owner, world.server.id, world.helper.id)
        (granted,) = run.claim(1)
        with pytest.raises(Forbidden):
            await asyncio.wait_for(refused, LONG_S)
        held = (watch.waiting, watch.held("reads"), watch.held(f"reads:user:{world.helper.id}"))
        woken = await wakeups_of_a_change(watch, lambda: run.ack(job.id, granted.attempt))
        assert (granted.job_id, held, woken) == (job.id, (1, 1, 0), 0)
        staying.left.set()
        await steps_until(stays.done)

    asyncio.run(scenario())


def test_a_cancelled_claim_leaves_the_watch_and_its_rooms(world: World) -> None:
    """A request task cancelled while it waits (its server stopping) gives back every place."""

    async def scenario() -> None:
        watch = world.service.waiters
        run = world.run().start()
        endpoint_room = f"claims:{run.endpoint_id}"
        waiting = await started(watch, claim(world, run.session_id), "claims")
        holding = (watch.waiting, watch.held("claims"), watch.held(endpoint_room))
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert holding == (1, 1, 1)
        assert (watch.waiting, watch.held("claims"), watch.held(endpoint_room)) == (0, 0, 0)

    asyncio.run(scenario())


def test_an_answered_claim_is_not_woken_by_the_next_job(world: World) -> None:
    async def scenario() -> None:
        watch, staying = world.service.waiters, Lent()
        run = world.run().start()
        answered = await started(watch, claim(world, run.session_id), "claims")
        job: Job = world.submit()
        await asyncio.wait_for(answered, LONG_S)
        other = world.submit()
        stays = await started(watch, read(world, world.owner, other, staying), "reads")
        woken = await wakeups_of_a_change(watch, world.submit)
        assert ([j.job_id for j in answered.result().jobs], woken) == ([job.id], 0)
        staying.left.set()
        await steps_until(stays.done)

    asyncio.run(scenario())
