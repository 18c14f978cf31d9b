"""Concurrency keys' use cases on every store (docs/protocol.md, "Concurrency keys"): whatever
happens in between (claims, acks, results, retries, cancels, lapsed leases), never more than
the key's limit of an owner's jobs with the key under way, and every job ends in the end; a
release lost to a crash is made by the sweeper; a fan-out's job waits for its group, then its
key."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from moonrun.errors import InvalidRequest
from moonrun.scheduling.jobs import Job, JobState, request_cancel
from moonrun.service.scheduling import JobSpec, SchedulingService
from tests.support.harness import Run, World
from tests.support.stores import StoreFactory

KEY = {"key": "backup", "limit": 2}


@pytest.fixture
def world(store_factory: StoreFactory) -> Iterator[World]:
    world = World(store_factory)
    yield world
    world.store.close()


def submit(world: World, *, concurrency: object = None, max_attempts: int = 2) -> Job:
    job = world.service.create_job(
        world.owner,
        world.server.id,
        kind="noop",
        max_attempts=max_attempts,
        concurrency=concurrency if concurrency is not None else KEY,
    )
    world.clock.advance(1)
    return job


def under_way(world: World, jobs: list[Job]) -> int:
    return sum(1 for job in jobs if world.job(job.id).state.is_active)


@pytest.mark.parametrize("seed", range(3))
def test_a_keys_limit_is_never_exceeded_whatever_happens_in_between(
    world: World, seed: int
) -> None:
    draw = random.Random(seed)
    limit = draw.randint(1, 3)
    jobs = [submit(world, concurrency={"key": "backup", "limit": limit}) for _ in range(8)]
    run = world.run(world.endpoint).start(8)
    holding: list[tuple[Run, str, int]] = []
    for _ in range(100):
        action = draw.random()
        if action < 0.35:
            holding += [(run, job.job_id, job.attempt) for job in run.claim(draw.randint(1, 4))]
        elif action < 0.75 and holding:
            held_by, job_id, attempt = holding.pop(draw.randrange(len(holding)))
            if world.job(job_id).state is JobState.ACCEPTED:
                held_by.ack(job_id, attempt)
            outcome = draw.choice(["succeeded", "failed", "failed"])
            held_by.result(job_id, attempt, outcome, retryable=draw.random() < 0.5)
        elif action < 0.82:
            world.service.cancel_job(world.owner, draw.choice(jobs).id)
        elif action < 0.9:
            world.clock.advance(60_000)  # leases lapse: the sweeper ends them
            world.service.sweep()
            run.start(8)
        else:
            world.clock.advance(draw.randint(1, 5_000))
            run.heartbeat()
        holding = [h for h in holding if world.job(h[1]).state.is_active]
        assert under_way(world, jobs) <= limit
    for _ in range(200):
        if all(world.job(job.id).state.is_terminal for job in jobs):
            break
        world.clock.advance(120_000)
        world.service.sweep()
        run.start(8)
        for job in run.claim(8):
            run.ack(job.job_id, job.attempt)
            run.result(job.job_id, job.attempt)
        assert under_way(world, jobs) <= limit
    assert all(world.job(job.id).state.is_terminal for job in jobs)


def test_the_sweeper_releases_what_a_lost_key_release_left_held(world: World) -> None:
    first, second = submit(world), submit(world)
    third = submit(world)
    assert world.job(third.id).key_held
    # Two end behind the service's back (as if the platform died before releasing).
    for job in (first, second):
        world.store.update_jobs([job.id], lambda job: request_cancel(job, user_id="x", now=1))
    assert world.store.claimable_jobs(world.endpoint.id, world.clock.now(), 10) == []
    world.service.sweep()
    assert [
        job.id for job in world.store.claimable_jobs(world.endpoint.id, world.clock.now(), 10)
    ] == [third.id]


def test_a_fanout_job_waits_for_its_group_then_its_key(world: World) -> None:
    for n in range(3):
        world.directory.create_server(
            world.admin,
            f"web-{n}",
            endpoint_id=(world.endpoint, world.other_endpoint)[n % 2].id,
            owner_id=world.owner.id,
            labels={"role": "web"},
        )
    blocker = submit(world, concurrency={"key": "deploy", "limit": 1})
    made = world.service.groups.fanout(
        world.owner,
        "role=web",
        JobSpec("noop", concurrency={"key": "deploy", "limit": 1}),
        max_parallel=2,
    )
    runs = [world.run(world.endpoint).start(8), world.run(world.other_endpoint).start(8)]
    granted = [job for run in runs for job in run.claim(8)]
    assert [job.job_id for job in granted] == [blocker.id]
    runs[0].ack(blocker.id, 1)
    runs[0].result(blocker.id, 1)
    for _ in made.jobs:
        granted = [(run, job) for run in runs for job in run.claim(8)]
        assert len(granted) == 1
        run, job = granted[0]
        run.ack(job.job_id, job.attempt)
        run.result(job.job_id, job.attempt)
    assert all(world.job(job.id).state is JobState.SUCCEEDED for job in made.jobs)


def test_a_bad_limit_is_refused_naming_the_field(world: World) -> None:
    for limit in (0, 1001, True, "2"):
        with pytest.raises(InvalidRequest) as refused:
            submit(world, concurrency={"key": "k", "limit": limit})
        assert refused.value.fields[0][0] == "concurrency.limit"
    with pytest.raises(InvalidRequest) as refused:
        submit(world, concurrency={"key": "\x00"})
    assert refused.value.fields[0][0] == "concurrency.key"


def test_a_rerun_keeps_its_jobs_concurrency_key(world: World) -> None:
    first = submit(world, concurrency={"key": "deploy", "limit": 1})
    world.service.cancel_job(world.owner, first.id)
    blocker = submit(world, concurrency={"key": "deploy", "limit": 1})
    again = world.service.rerun_job(world.owner, first.id)
    assert again.concurrency == first.concurrency
    assert again.key_held
    world.service.cancel_job(world.owner, blocker.id)
    assert not world.job(again.id).key_held


def test_creates_and_cancels_racing_on_two_platforms_keep_a_key_exactly_at_its_limit(
    world: World, store_factory: StoreFactory
) -> None:
    """Two platforms on one database (one store object elsewhere), four threads each,
    creating keyed jobs and cancelling some at once: in the end exactly the limit of the
    key's jobs are released (never more, and no release lost under contention)."""
    shared = store_factory.name in ("mysql", "postgres")
    second = type(world.store)(store_factory.url()) if shared else world.store  # type: ignore[call-arg]
    other = SchedulingService(second, world.clock, world.tokens, world.settings)
    platforms = [world.service, other] * 4
    barrier = threading.Barrier(len(platforms))
    key = {"key": "race", "limit": 2}

    def work(service: SchedulingService) -> None:
        barrier.wait()
        made = [
            service.create_job(world.owner, world.server.id, kind="noop", concurrency=key)
            for _ in range(3)
        ]
        service.cancel_job(world.owner, made[0].id)

    try:
        with ThreadPoolExecutor(len(platforms)) as pool:
            list(pool.map(work, platforms))
        jobs = world.store.list_jobs(server_ids=None, state=JobState.QUEUED, limit=100)
        assert len(jobs) == 16
        assert sum(1 for job in jobs if not job.key_held) == 2
    finally:
        if second is not world.store:
            second.close()
