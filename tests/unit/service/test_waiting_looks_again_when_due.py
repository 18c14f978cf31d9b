"""A waiting claim looks again when the endpoint's next job becomes claimable (in seconds from
the platform's clock), not only when woken; and a read over the waiting bound is told which
bound it met."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from moonrun.errors import TooManyWaiting
from moonrun.service.scheduling import Claim
from tests.support.harness import World
from tests.support.stores import memory_factory
from tests.unit.service.test_waiting import LONG_S, Lent, claim, read, started


@pytest.fixture
def world() -> World:
    built = World(memory_factory())
    built.service.waiters.recheck_s = LONG_S
    return built


def test_a_waiting_claim_looks_again_when_the_next_job_is_due(world: World) -> None:
    """Due 2.5 s from now on the platform's clock: look again in 2.5 s; nothing due: only
    when woken (or at the recheck)."""
    claim = Claim([], world.endpoint.id, None)
    due = replace(claim, next_claimable_at=world.clock.now() + 2500)
    assert (world.service._due_s(due), world.service._due_s(claim)) == (2.5, None)


def test_a_read_over_the_bound_of_all_reads_is_told_so(world: World) -> None:
    async def scenario() -> str:
        watch = world.service.waiters
        watch.limits = replace(watch.limits, reads=1)
        lent = Lent()
        job = world.submit()
        first = await started(watch, read(world, world.owner, job, lent), "reads")
        try:
            with pytest.raises(TooManyWaiting) as raised:
                await read(world, world.helper, job)
        finally:
            lent.left.set()
            await asyncio.wait_for(first, LONG_S)
        return raised.value.message

    assert asyncio.run(scenario()) == "1 job reads are waiting already"


HANG_GUARD_S = 10.0
"""Only a guard against a hang: the claim below is due 50 ms after it starts waiting."""


def test_a_waiting_claim_is_granted_a_job_that_becomes_due_without_a_wake_up(
    world: World,
) -> None:
    """A job not before 50 ms from now: nothing writes it when it becomes claimable, so no
    change wakes the claim; the claim looks again by itself when it is due."""

    async def scenario() -> tuple[list[str], int]:
        watch = world.service.waiters
        run = world.run().start()
        job = world.submit(not_before=world.clock.now() + 50)
        waiting = await started(watch, claim(world, run.session_id), "claims")
        woken = watch.wakeups
        world.clock.advance(50)
        granted = await asyncio.wait_for(waiting, HANG_GUARD_S)
        assert [g.job_id for g in granted.jobs] == [job.id]
        return [g.job_id for g in granted.jobs], watch.wakeups - woken

    assert asyncio.run(scenario())[1] == 0


def test_a_read_until_the_job_ends_is_not_woken_by_the_steps_between(world: World) -> None:
    async def scenario() -> int:
        watch, lent = world.service.waiters, Lent()
        run = world.run().start()
        job = world.submit()
        waiting = await started(watch, read(world, world.owner, job, lent), "reads")
        before = watch.wakeups
        run.run_to_running(job.id)
        await asyncio.sleep(0)
        woken = watch.wakeups - before
        lent.left.set()
        await asyncio.wait_for(waiting, HANG_GUARD_S)
        return woken

    assert asyncio.run(scenario()) == 0
