"""A blocking job read that has nothing to wait for answers at once, without taking a place in
a room (so a full room cannot refuse it): the job already is as asked, or the read asks for
no wait. Any wait longer than none waits, however short. And a read over a bound is told
which bound it met."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from moonrun.errors import TooManyWaiting
from moonrun.scheduling.jobs import Job
from moonrun.scheduling.records import User
from moonrun.service import waiting as waiting_module
from tests.support.harness import World
from tests.support.stores import memory_factory
from tests.unit.service.test_waiting import LONG_S, Lent, read, started


@pytest.fixture
def world() -> World:
    built = World(memory_factory())
    built.service.waiters.recheck_s = LONG_S
    return built


def read_for(world: World, user: User, job: Job, wait_s: float, lent: Lent | None = None) -> Any:
    return world.service.wait_for_job(
        lambda: user,
        job.id,
        lambda job: job.state.is_terminal,
        wait_s=wait_s,
        waiting=(lent or Lent()).waiting(),
    )


def with_every_read_room_full(world: World, ask: Any) -> Any:
    """What `ask()` (a read) answers while the one place for reads is taken."""

    async def scenario() -> Any:
        watch, lent = world.service.waiters, Lent()
        watch.limits = replace(watch.limits, reads=1)
        waiting = await started(watch, read(world, world.owner, world.submit(), lent), "reads")
        try:
            return await ask()
        finally:
            lent.left.set()
            await asyncio.wait_for(waiting, LONG_S)

    return asyncio.run(scenario())


def test_a_read_of_a_job_already_as_asked_answers_it_even_with_the_rooms_full(
    world: World,
) -> None:
    job = world.submit()
    world.service.cancel_job(world.owner, job.id)
    answer = with_every_read_room_full(world, lambda: read_for(world, world.owner, job, LONG_S))
    assert (answer.id, answer.state.value) == (job.id, "cancelled")


def test_a_read_that_asks_for_no_wait_answers_at_once_even_with_the_rooms_full(
    world: World,
) -> None:
    job = world.submit()
    answer = with_every_read_room_full(world, lambda: read_for(world, world.owner, job, 0.0))
    assert (answer.id, answer.state.value) == (job.id, "queued")


class FrozenTime:
    """A monotonic clock that does not move: a wait's deadline never passes."""

    @staticmethod
    def monotonic() -> float:
        return 1000.0


def test_a_read_of_half_a_second_waits_for_the_change(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half a second, on a clock that does not move: the read waits (a shorter wait is no
    reason to answer at once) and answers the job once it is cancelled."""
    from moonrun.service import scheduling as scheduling_module

    monkeypatch.setattr(scheduling_module, "time", FrozenTime)
    monkeypatch.setattr(waiting_module, "time", FrozenTime)

    async def scenario() -> str:
        job = world.submit()
        waiting = await started(
            world.service.waiters, read_for(world, world.owner, job, 0.5), "reads"
        )
        world.service.cancel_job(world.owner, job.id)
        answered: Job = await asyncio.wait_for(waiting, LONG_S)
        return answered.state.value

    assert asyncio.run(scenario()) == "cancelled"


@pytest.mark.parametrize(
    ("limits", "users", "words"),
    [
        ({"reads_per_user": 1}, ("owner", "owner"), "1 job reads of this user are waiting already"),
        (
            {"reads_per_address": 1},
            ("owner", "helper"),
            "1 job reads from here are waiting already",
        ),
    ],
)
def test_a_read_over_a_bound_is_told_which(
    world: World, limits: dict[str, int], users: tuple[str, str], words: str
) -> None:
    async def scenario() -> str:
        watch, lent = world.service.waiters, Lent()
        watch.limits = replace(watch.limits, **limits)
        job = world.submit()
        first, second = (getattr(world, name) for name in users)
        waiting = await started(watch, read(world, first, job, lent), "reads")
        try:
            with pytest.raises(TooManyWaiting) as raised:
                await read(world, second, job)
        finally:
            lent.left.set()
            await asyncio.wait_for(waiting, LONG_S)
        return raised.value.message

    assert asyncio.run(scenario()) == words
