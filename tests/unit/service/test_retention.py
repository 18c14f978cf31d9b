"""Retention as use cases, over every store: the sweeper's `prune` deletes finished jobs older
than `retain_finished_s` (with their data beside the store, attempts and idempotency keys),
a bounded batch at a time and never a job that has not ended; `delete_job` deletes a finished
job now for whoever may manage it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from moonrun.errors import JobNotFinished, NotFound
from moonrun.scheduling.jobs import Job, JobState
from tests.support.harness import SETTINGS, World
from tests.support.stores import StoreFactory

DAY_S = 24 * 3600
DAY_MS = DAY_S * 1000


@pytest.fixture
def world(store_factory: StoreFactory) -> Iterator[World]:
    world = World(store_factory, settings=replace(SETTINGS, retain_finished_s=DAY_S))
    yield world
    world.store.close()


class Forgotten(list[tuple[str, int]]):
    """A `forget` that records which job's data it was asked to delete (id, attempts)."""

    def __call__(self, job: Job) -> None:
        self.append((job.id, job.attempt))


def succeed(world: World, job: Job) -> Job:
    run = world.run().start()
    attempt = run.run_to_running(job.id)
    run.result(job.id, attempt)
    return world.job(job.id)


def cancelled(world: World, job: Job) -> Job:
    world.service.cancel_job(world.owner, job.id)
    return world.job(job.id)


def test_pruning_deletes_finished_jobs_past_retention_with_their_data_and_keys(
    world: World,
) -> None:
    done = succeed(world, world.submit(idempotency_key="key-done"))
    gone = cancelled(world, world.submit(idempotency_key="key-gone"))
    waiting = world.submit()
    world.clock.advance(DAY_MS)
    forget = Forgotten()

    deleted = world.service.prune(forget)
    again = world.service.create_job(
        world.owner, world.server.id, kind="noop", idempotency_key="key-done"
    )

    assert sorted(job.id for job in deleted) == sorted([done.id, gone.id])
    assert sorted(forget) == sorted([(done.id, 1), (gone.id, 0)])
    assert world.store.get_jobs([done.id, gone.id]) == {}
    assert world.job(waiting.id).state is JobState.QUEUED
    assert again.id != done.id  # the key went with its job: the same request makes a new one
    assert world.store.job_counts() == {JobState.QUEUED: 2}


def test_pruning_keeps_a_finished_job_until_its_retention_has_passed(world: World) -> None:
    done = succeed(world, world.submit())
    world.clock.advance(DAY_MS - 1 - 1)  # the result came a millisecond after the submit

    assert world.service.prune(Forgotten()) == []
    assert world.job(done.id).state is JobState.SUCCEEDED


def test_pruning_never_deletes_a_job_that_has_not_ended(world: World) -> None:
    queued = world.submit()
    running = world.submit()
    world.run().start().run_to_running(queued.id)
    world.clock.advance(1000 * DAY_MS)
    forget = Forgotten()

    assert world.service.prune(forget) == []
    assert forget == []
    assert {world.job(queued.id).state, world.job(running.id).state} == {
        JobState.RUNNING,
        JobState.QUEUED,
    }


def test_pruning_deletes_at_most_one_bounded_batch_per_call(store_factory: StoreFactory) -> None:
    settings = replace(SETTINGS, retain_finished_s=DAY_S, prune_batch=3)
    world = World(store_factory, settings=settings)
    try:
        for _ in range(7):
            cancelled(world, world.submit())
        world.clock.advance(DAY_MS)

        sizes = [len(world.service.prune(Forgotten())) for _ in range(4)]
        capped = world.service.prune(Forgotten(), limit=5000)
    finally:
        world.store.close()

    assert sizes == [3, 3, 1, 0]
    assert capped == []


def test_retention_zero_keeps_finished_jobs_forever(store_factory: StoreFactory) -> None:
    world = World(store_factory, settings=replace(SETTINGS, retain_finished_s=0))
    try:
        job = cancelled(world, world.submit())
        world.clock.advance(10_000 * DAY_MS)
        deleted = world.service.prune(Forgotten())
        kept = world.job(job.id)
    finally:
        world.store.close()

    assert (deleted, kept.state) == ([], JobState.CANCELLED)


def test_delete_job_deletes_a_finished_job_now_with_its_data_and_key(world: World) -> None:
    job = succeed(world, world.submit(idempotency_key="key"))
    forget = Forgotten()

    answer = world.service.delete_job(world.helper, job.id, forget)

    assert answer == job
    assert forget == [(job.id, 1)]
    assert world.store.get_job(job.id) is None
    assert world.store.idempotency_record(world.owner.id, "key") is None
    with pytest.raises(NotFound):
        world.service.delete_job(world.owner, job.id, forget)


def test_delete_job_refuses_a_job_that_has_not_ended_and_keeps_it(world: World) -> None:
    job = world.submit()
    forget = Forgotten()

    with pytest.raises(JobNotFinished) as refused:
        world.service.delete_job(world.owner, job.id, forget)

    assert (refused.value.status, refused.value.code) == (409, "job_not_finished")
    assert forget == []
    assert world.job(job.id) == job


def test_delete_job_of_another_owners_job_is_not_found_and_keeps_it(world: World) -> None:
    job = cancelled(world, world.submit())
    forget = Forgotten()

    with pytest.raises(NotFound) as refused:
        world.service.delete_job(world.stranger, job.id, forget)

    assert (refused.value.status, refused.value.code) == (404, "not_found")
    assert str(refused.value) == "no such job"
    assert forget == []
    assert world.job(job.id) == job


def test_a_platform_admin_may_delete_any_finished_job(world: World) -> None:
    job = cancelled(world, world.submit())

    world.service.delete_job(world.admin, job.id, Forgotten())

    assert world.store.get_job(job.id) is None


def test_a_batch_replayed_after_one_of_its_later_jobs_was_deleted_answers_those_left(
    world: World,
) -> None:
    """A deleted job is never made again by its key's replay."""
    from moonrun.service.scheduling import JobSpec

    specs = [JobSpec(kind="noop")] * 2
    first, second = world.service.create_jobs(
        world.owner, world.server.id, specs, idempotency_key="batch"
    )
    world.service.cancel_job(world.owner, second.id)
    world.service.delete_job(world.owner, second.id, Forgotten())

    replayed = world.service.create_jobs(
        world.owner, world.server.id, specs, idempotency_key="batch"
    )

    assert [job.id for job in replayed] == [first.id]
    assert world.store.get_job(second.id) is None


def test_a_retention_shorter_than_the_transfer_grace_waits_for_the_grace(
    store_factory: StoreFactory,
) -> None:
    """Run may send an attempt's logs and artifacts for `transfer_grace_s` after it ended: no
    job is pruned before, so no file lands for a job that is gone."""
    settings = replace(SETTINGS, retain_finished_s=1, transfer_grace_s=60)
    world = World(store_factory, settings=settings)
    try:
        job = cancelled(world, world.submit())
        world.clock.advance(60_000)
        early = world.service.prune(Forgotten())
        world.clock.advance(1)
        late = world.service.prune(Forgotten())
    finally:
        world.store.close()

    assert (early, [gone.id for gone in late]) == ([], [job.id])


def test_a_groups_finished_jobs_stay_until_every_job_of_the_group_has_ended(
    world: World,
) -> None:
    """An unfinished group still reads its finished jobs (its counts, whether it is done):
    neither pruning nor a delete takes them before the group's last job has ended."""
    from tests.unit.service.test_groups import SPEC, web_servers

    web_servers(world, 2)
    first, second = world.service.groups.fanout(world.owner, "role=web", SPEC).jobs
    world.service.cancel_job(world.owner, first.id)
    world.clock.advance(DAY_MS)

    kept = world.service.prune(Forgotten())
    with pytest.raises(JobNotFinished) as refused:
        world.service.delete_job(world.owner, first.id, Forgotten())
    world.service.cancel_job(world.owner, second.id)
    world.clock.advance(DAY_MS)
    pruned = world.service.prune(Forgotten())

    assert kept == []
    assert "group has not ended" in refused.value.message
    assert sorted(job.id for job in pruned) == sorted([first.id, second.id])
