"""A claim that asks for no wait and is granted nothing looks once: one store read, no place
taken in a room, no second look. Any wait longer than none waits, however short: a claim of
half a second is granted the job submitted meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from moonrun.service import scheduling as scheduling_module
from moonrun.service import waiting as waiting_module
from moonrun.service.scheduling import Claim
from tests.support.harness import World
from tests.support.stores import memory_factory
from tests.unit.service.test_waiting import LONG_S, Lent, started
from tests.unit.service.test_waiting_reads_answer_at_once_with_nothing_to_wait_for import (
    FrozenTime,
)

T = TypeVar("T")


class Counted(Lent):
    """A request's loan that counts the store work run for it."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        self.runs += 1
        return work(*args)


@pytest.fixture
def world() -> World:
    built = World(memory_factory())
    built.service.waiters.recheck_s = LONG_S
    return built


def test_a_claim_that_asks_for_no_wait_looks_once(world: World) -> None:
    run, lent = world.run().start(), Counted()

    async def scenario() -> Claim:
        return await world.service.wait_for_claim(
            run.session_id, 1, wait_s=0.0, waiting=lent.waiting()
        )

    claim = asyncio.run(scenario())
    watch = world.service.waiters
    assert (claim.jobs, lent.runs, lent.held) == ([], 1, True)
    assert (watch.waiting, watch.held("claims")) == (0, 0)


def test_a_claim_of_half_a_second_waits_for_the_job_submitted_meanwhile(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock that does not move: the claim waits (a short wait is no reason to answer
    at once) and is granted the job once it is submitted."""
    monkeypatch.setattr(scheduling_module, "time", FrozenTime)
    monkeypatch.setattr(waiting_module, "time", FrozenTime)
    run = world.run().start()

    async def scenario() -> tuple[list[str], str]:
        claim = world.service.wait_for_claim(
            run.session_id, 1, wait_s=0.5, waiting=Lent().waiting()
        )
        waiting = await started(world.service.waiters, claim, "claims")
        job = world.submit()
        granted: Claim = await asyncio.wait_for(waiting, LONG_S)
        return [claimed.job_id for claimed in granted.jobs], job.id

    granted, submitted = asyncio.run(scenario())
    assert granted == [submitted]
