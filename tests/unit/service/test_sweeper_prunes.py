"""The sweeper prunes finished jobs past their retention: one bounded batch per transaction,
passes following at once while batches come back whole, each batch reported (the metric's
count) and each job's data forgotten; a batch never passes 1,000 jobs whatever the settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import anyio
import pytest

from moonrun.scheduling.jobs import Job
from moonrun.service.sweeper import Sweeper
from moonrun.store.memory import MemoryStore
from tests.support.harness import SETTINGS, World
from tests.support.stores import StoreFactory, memory_factory
from tests.unit.service.test_sweeper import StopAfterSweeps

DAY_S = 24 * 3600


class CountingStore:
    """A MemoryStore that records how many jobs each `delete_jobs` call (one transaction in
    the SQL stores) was asked to delete."""

    def __init__(self) -> None:
        self._store = MemoryStore()
        self.deletes: list[int] = []

    def delete_jobs(self, job_ids: Any, deletable: Any) -> list[Job]:
        self.deletes.append(len(job_ids))
        return self._store.delete_jobs(job_ids, deletable)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def world_with(store: CountingStore, **settings: Any) -> World:
    factory = StoreFactory("counting", lambda: store, lambda s: s, lambda: "memory://")
    return World(factory, settings=replace(SETTINGS, retain_finished_s=DAY_S, **settings))  # type: ignore[arg-type]


def finish(world: World, count: int) -> list[str]:
    ids = [world.submit().id for _ in range(count)]
    for job_id in ids:
        world.service.cancel_job(world.owner, job_id)
    return ids


@pytest.mark.anyio
async def test_the_sweeper_prunes_in_bounded_batches_and_reports_each_one() -> None:
    store = CountingStore()
    world = world_with(store, prune_batch=2)
    ids = finish(world, 5)
    world.clock.advance(DAY_S * 1000)
    batches: list[int] = []
    forgotten: list[str] = []
    stop = anyio.Event()
    sweeper = Sweeper(
        world.service,
        StopAfterSweeps(stop, 3),
        interval_s=3600,
        forget=lambda job: forgotten.append(job.id),
        on_pruned=batches.append,
    )

    with anyio.fail_after(10):  # a hang guard: the interval alone would take an hour
        await sweeper.run(stop)

    assert (batches, store.deletes, sweeper.pruned) == ([2, 2, 1], [2, 2, 1], 5)
    assert sorted(forgotten) == sorted(ids)
    assert world.store.get_jobs(ids) == {}


def test_a_prune_batch_never_passes_a_thousand_jobs() -> None:
    store = CountingStore()
    world = world_with(store, prune_batch=5000)
    finish(world, 1001)
    world.clock.advance(DAY_S * 1000)

    first = world.service.prune(lambda job: None)

    assert (len(first), store.deletes) == (1000, [1000])


@pytest.mark.anyio
async def test_the_sweeper_prunes_nothing_when_retention_is_off() -> None:
    world = World(memory_factory(), settings=replace(SETTINGS, retain_finished_s=0))
    ids = finish(world, 2)
    world.clock.advance(10_000 * DAY_S * 1000)
    stop = anyio.Event()
    sweeper = Sweeper(world.service, StopAfterSweeps(stop, 1), interval_s=3600)

    with anyio.fail_after(10):
        await sweeper.run(stop)

    assert (sweeper.pruned, len(world.store.get_jobs(ids))) == (0, 2)
