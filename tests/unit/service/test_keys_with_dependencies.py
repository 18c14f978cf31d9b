"""Concurrency keys and dependencies together, over every store: a job with a key that waits on
others is released by its dependencies first, then by its key (never stranded between the
two), and a waiter its dependency cancelled takes no place of its key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moonrun.scheduling.jobs import JobState
from tests.support.harness import Run, World
from tests.support.stores import StoreFactory

KEY = {"key": "deploy", "limit": 1}


@pytest.fixture
def world(store_factory: StoreFactory) -> Iterator[World]:
    made = World(store_factory)
    yield made
    made.store.close()


def finish(run: Run, job_id: str, outcome: str = "succeeded") -> None:
    attempt = run.run_to_running(job_id)
    run.result(job_id, attempt, outcome)


def claimable(world: World) -> list[str]:
    return [job.id for job in world.store.claimable_jobs(world.endpoint.id, world.clock.now(), 50)]


def test_a_keyed_job_released_by_its_dependencies_waits_for_its_key_then_runs(
    world: World,
) -> None:
    run = world.run().start(8)
    dependency = world.submit()
    first = world.submit(concurrency=KEY)
    waiting = world.submit(after=[dependency.id], concurrency=KEY)
    assert waiting.held
    assert waiting.key_held
    assert claimable(world) == [dependency.id, first.id]
    finish(run, dependency.id)
    # Free of its dependencies, but its key's one place is taken: its key holds it.
    released = world.job(waiting.id)
    assert not released.held
    assert released.key_held
    assert claimable(world) == [first.id]
    finish(run, first.id)
    assert not world.job(waiting.id).key_held
    assert claimable(world) == [waiting.id]


def test_a_keyed_job_released_by_its_dependencies_with_a_free_place_is_claimable_at_once(
    world: World,
) -> None:
    run = world.run().start(8)
    dependency = world.submit()
    waiting = world.submit(after=[dependency.id], concurrency=KEY)
    assert claimable(world) == [dependency.id]
    finish(run, dependency.id)
    now = world.job(waiting.id)
    assert not now.held
    assert not now.key_held
    assert claimable(world) == [waiting.id]


def test_a_keyed_job_naming_a_job_already_succeeded_goes_straight_to_its_key(
    world: World,
) -> None:
    run = world.run().start(8)
    dependency = world.submit()
    finish(run, dependency.id)
    waiting = world.submit(after=[dependency.id], concurrency=KEY)
    assert not waiting.held
    assert not waiting.key_held
    assert claimable(world) == [waiting.id]


def test_a_keyed_waiter_its_dependency_cancelled_takes_no_place_of_its_key(
    world: World,
) -> None:
    run = world.run().start(8)
    first = world.submit(concurrency=KEY)
    dependency = world.submit()
    waiting = world.submit(after=[dependency.id], concurrency=KEY)
    later = world.submit(concurrency=KEY)
    world.service.cancel_job(world.owner, dependency.id)
    assert world.job(waiting.id).state is JobState.CANCELLED
    finish(run, first.id)
    assert claimable(world) == [later.id]
