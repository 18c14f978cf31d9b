"""The sweeper paces a retention backlog: after a whole prune batch it rests PRUNE_PACE times
as long as the batch took (pruning holds the store a fifth of the time at most, serving the
rest), where whole batches of passed deadlines come back at once and an idle sweeper waits its
interval (docs/operations.md, "Retention")."""

from __future__ import annotations

import itertools
from dataclasses import replace

import anyio
import pytest

from moonrun.service import sweeper as sweeping
from moonrun.service.sweeper import PRUNE_PACE, Sweeper, rest_s
from tests.support.harness import SETTINGS, World
from tests.support.stores import memory_factory
from tests.unit.service.test_sweeper import StopAfterSweeps

DAY_S = 24 * 3600


def test_passed_deadlines_come_back_at_once_and_a_backlog_is_paced() -> None:
    assert rest_s(True, True, 0.2, 60) == 0.0
    assert rest_s(False, True, 0.2, 60) == pytest.approx(PRUNE_PACE * 0.2)
    assert rest_s(False, True, 100, 60) == 60  # never longer than the interval
    assert rest_s(False, False, 0.2, 60) == 60


@pytest.mark.anyio
async def test_the_sweeper_rests_after_each_whole_prune_batch_in_proportion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(
        memory_factory(), settings=replace(SETTINGS, retain_finished_s=DAY_S, prune_batch=2)
    )
    for _ in range(5):
        world.service.cancel_job(world.owner, world.submit().id)
    world.clock.advance(DAY_S * 1000)
    rests: list[float] = []

    def recorded(*args: object) -> float:
        rest = rest_s(*args)  # type: ignore[arg-type]
        rests.append(rest)
        return rest

    monkeypatch.setattr(sweeping, "rest_s", recorded)
    ticks = itertools.count()
    stop = anyio.Event()
    sweeper = Sweeper(
        world.service,
        StopAfterSweeps(stop, 3),
        interval_s=3600,
        monotonic=lambda: next(ticks) * 0.01,  # each look at the clock 10 ms later
    )

    with anyio.fail_after(10):  # a hang guard: the interval alone would take an hour
        await sweeper.run(stop)

    assert sweeper.pruned == 5
    paced, last = rests[:2], rests[2]
    assert all(0 < rest <= PRUNE_PACE * 0.01 + 1e-9 for rest in paced), rests
    assert last == 3600  # the backlog is gone: the interval again
