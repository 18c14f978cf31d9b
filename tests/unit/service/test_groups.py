"""Fan-out groups over every store (docs/protocol.md, "Groups"): one job per matching server the
caller may submit to, in one write; counts and done; cancel; idempotency; max_parallel never
exceeded (also over random interleavings); stop_on_failure; and the sweeper's repair."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from moonrun.errors import Forbidden, IdempotencyConflict, InvalidRequest, NoMatch
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.records import Server, User
from moonrun.service.groups import FanOut
from moonrun.service.scheduling import JobSpec
from tests.support.harness import Run, World
from tests.support.stores import StoreFactory

SPEC = JobSpec("noop", {"n": 1})


def web_servers(world: World, count: int, owner: User | None = None) -> list[Server]:
    """`count` servers labelled role=web, spread over both endpoints."""
    owner = owner or world.owner
    endpoints = (world.endpoint, world.other_endpoint)
    return [
        world.directory.create_server(
            world.admin,
            f"web-{owner.name}-{n}",
            endpoint_id=endpoints[n % 2].id,
            owner_id=owner.id,
            labels={"role": "web", "n": str(n)},
        )
        for n in range(count)
    ]


@pytest.fixture
def groups_world(store_factory: StoreFactory) -> Iterator[World]:
    world = World(store_factory)
    yield world
    world.store.close()


def fan(world: World, actor: User | None = None, spec: JobSpec = SPEC, **options: object) -> FanOut:
    return world.service.groups.fanout(actor or world.owner, "role=web", spec, **options)  # type: ignore[arg-type]


def group_jobs(world: World, group_id: str) -> list[Job]:
    return world.store.list_jobs(server_ids=None, state=None, limit=2000, group_id=group_id)


def live(world: World, group_id: str) -> int:
    return sum(1 for job in group_jobs(world, group_id) if job.state.is_active)


def test_a_fanout_makes_one_job_on_each_matching_server_as_one_group(groups_world: World) -> None:
    world = groups_world
    servers = web_servers(world, 5)
    made = fan(world)
    assert made.group.job_count == 5
    assert made.group.creator_id == world.owner.id
    assert sorted(job.server_id for job in made.jobs) == sorted(s.id for s in servers)
    assert all(job.group_id == made.group.id and job.kind == "noop" for job in made.jobs)
    assert world.service.groups.get(world.owner, made.group.id).counts == {JobState.QUEUED: 5}
    page = world.service.list_jobs(world.owner, group_id=made.group.id, limit=10)
    assert {job.id for job in page.jobs} == {job.id for job in made.jobs}


def test_a_fanout_matching_no_server_is_no_match_and_makes_nothing(groups_world: World) -> None:
    world = groups_world
    web_servers(world, 2)
    with pytest.raises(NoMatch):
        world.service.groups.fanout(world.owner, "role=db", SPEC)
    assert world.store.job_counts() == {}


def test_another_owners_matching_servers_get_no_job_and_never_count(groups_world: World) -> None:
    world = groups_world
    mine = web_servers(world, 3)
    web_servers(world, 4, owner=world.stranger)
    made = fan(world)
    assert {job.server_id for job in made.jobs} == {server.id for server in mine}
    state = world.service.groups.get(world.owner, made.group.id)
    assert state.group.job_count == 3
    assert sum(state.counts.values()) == 3
    # Nor may the stranger read the group; and their own fan-out reaches only theirs.
    with pytest.raises(Forbidden):
        world.service.groups.get(world.stranger, made.group.id)
    theirs = fan(world, world.stranger)
    assert theirs.group.job_count == 4


def test_a_server_admin_reaches_the_servers_they_administer(groups_world: World) -> None:
    world = groups_world
    servers = web_servers(world, 2)
    world.directory.add_server_admin(world.owner, servers[0].id, world.helper.id)
    made = fan(world, world.helper)
    assert [job.server_id for job in made.jobs] == [servers[0].id]


def test_the_same_key_and_request_give_the_same_group_and_another_request_conflicts(
    groups_world: World,
) -> None:
    world = groups_world
    web_servers(world, 3)
    first = fan(world, idempotency_key="roll-1")
    web_servers(world, 1, owner=world.owner)[0]  # a new match since: the key still answers
    again = fan(world, idempotency_key="roll-1")
    assert again.group == first.group
    assert [job.id for job in again.jobs] == [job.id for job in first.jobs]
    with pytest.raises(IdempotencyConflict):
        fan(world, idempotency_key="roll-1", max_parallel=1)
    assert len(group_jobs(world, first.group.id)) == 3


def test_counts_follow_the_jobs_and_the_group_is_done_once_every_job_ended(
    groups_world: World,
) -> None:
    world = groups_world
    web_servers(world, 2)
    made = fan(world)
    runs = [world.run(world.endpoint).start(), world.run(world.other_endpoint).start()]
    for run in runs:
        (granted,) = run.claim(1)
        run.ack(granted.job_id, 1)
    state = world.service.groups.get(world.owner, made.group.id)
    assert state.counts == {JobState.RUNNING: 2}
    assert not state.done
    runs[0].result(next(iter(runs[0].leases))[0], 1)
    runs[1].result(next(iter(runs[1].leases))[0], 1, outcome="failed")
    state = world.service.groups.get(world.owner, made.group.id)
    assert state.counts == {JobState.SUCCEEDED: 1, JobState.FAILED: 1}
    assert state.done


def test_cancelling_a_group_ends_its_waiting_jobs_and_asks_running_ones(
    groups_world: World,
) -> None:
    world = groups_world
    web_servers(world, 3)
    made = fan(world)
    run = world.run(world.endpoint).start()
    (granted,) = run.claim(1)
    run.ack(granted.job_id, 1)
    state = world.service.groups.cancel(world.owner, made.group.id)
    assert state.counts == {JobState.CANCELLED: 2, JobState.RUNNING: 1}
    assert world.job(granted.job_id).cancel is not None
    with pytest.raises(Forbidden):
        world.service.groups.cancel(world.stranger, made.group.id)


def test_max_parallel_holds_jobs_back_until_one_of_the_group_ends(groups_world: World) -> None:
    world = groups_world
    web_servers(world, 6)
    made = fan(world, max_parallel=2)
    assert sum(1 for job in made.jobs if job.held) == 4
    runs = [world.run(world.endpoint).start(8), world.run(world.other_endpoint).start(8)]
    granted = [job for run in runs for job in run.claim(8)]
    assert len(granted) == 2
    finisher = next(run for run in runs if any(k[0] == granted[0].job_id for k in run.leases))
    finisher.ack(granted[0].job_id, 1)
    finisher.result(granted[0].job_id, 1)
    more = [job for run in runs for job in run.claim(8)]
    assert len(more) == 1
    assert live(world, made.group.id) == 2


def test_a_stop_on_failure_group_cancels_its_queued_jobs_when_one_fails(
    groups_world: World,
) -> None:
    world = groups_world
    web_servers(world, 5)
    made = fan(world, max_parallel=2, stop_on_failure=True)
    run = world.run(world.endpoint).start(8)
    other = world.run(world.other_endpoint).start(8)
    claimed = [(run, job) for job in run.claim(8)] + [(other, job) for job in other.claim(8)]
    assert len(claimed) == 2
    (failing_run, failing), (running_run, running) = claimed
    failing_run.ack(failing.job_id, 1)
    running_run.ack(running.job_id, 1)
    failing_run.result(failing.job_id, 1, outcome="failed")
    state = world.service.groups.get(world.owner, made.group.id)
    assert state.counts == {JobState.FAILED: 1, JobState.RUNNING: 1, JobState.CANCELLED: 3}
    running_run.result(running.job_id, 1)
    assert world.service.groups.get(world.owner, made.group.id).done


def test_the_sweeper_releases_what_a_lost_release_left_held(groups_world: World) -> None:
    world = groups_world
    web_servers(world, 3)
    made = fan(world, max_parallel=1)
    first = next(job for job in made.jobs if not job.held)
    # The job ends behind the service's back (as if the platform died before releasing).
    from moonrun.scheduling.jobs import request_cancel

    world.store.update_jobs([first.id], lambda job: request_cancel(job, user_id="x", now=1))
    assert world.store.claimable_jobs(world.endpoint.id, world.clock.now(), 10) == []
    assert world.store.claimable_jobs(world.other_endpoint.id, world.clock.now(), 10) == []
    world.service.sweep()
    released = [job for job in group_jobs(world, made.group.id) if job.claimable_at is not None]
    assert len(released) == 1


def test_bad_group_options_are_refused_naming_the_field(groups_world: World) -> None:
    world = groups_world
    web_servers(world, 1)
    with pytest.raises(InvalidRequest) as refused:
        fan(world, max_parallel=0)
    assert refused.value.fields[0][0] == "max_parallel"
    with pytest.raises(InvalidRequest) as refused:
        world.service.groups.fanout(world.owner, "", SPEC)
    assert refused.value.fields[0][0] == "selector"


@pytest.mark.parametrize("seed", range(4))
def test_max_parallel_is_never_exceeded_whatever_happens_in_between(
    groups_world: World, seed: int
) -> None:
    """Random claims, acks, successes, retryable and final failures, cancels and lapsed
    leases: never more than max_parallel of the group claimed or running, and every job
    ends in the end (nothing stays held)."""
    world = groups_world
    draw = random.Random(seed)
    limit = draw.randint(1, 3)
    web_servers(world, 8)
    made = fan(world, spec=JobSpec("noop", max_attempts=2), max_parallel=limit)
    runs = [world.run(world.endpoint).start(8), world.run(world.other_endpoint).start(8)]
    holding: list[tuple[Run, str, int]] = []  # (run, job, attempt) accepted or running
    for _ in range(120):
        action = draw.random()
        run = draw.choice(runs)
        if action < 0.35:
            holding += [(run, job.job_id, job.attempt) for job in run.claim(draw.randint(1, 4))]
        elif action < 0.75 and holding:
            held_by, job_id, attempt = holding.pop(draw.randrange(len(holding)))
            if world.job(job_id).state is JobState.ACCEPTED:
                held_by.ack(job_id, attempt)
            outcome = draw.choice(["succeeded", "failed", "failed"])
            held_by.result(job_id, attempt, outcome, retryable=draw.random() < 0.5)
        elif action < 0.82:
            victim = draw.choice(made.jobs).id
            world.service.cancel_job(world.owner, victim)
        elif action < 0.9:
            world.clock.advance(60_000)  # leases lapse: the sweeper ends them
            world.service.sweep()
            for each in runs:  # and the Runs, whose sessions lapsed too, start again
                each.start(8)
        else:
            world.clock.advance(draw.randint(1, 5_000))
            for each in runs:
                each.heartbeat()
        holding = [h for h in holding if world.job(h[1]).state.is_active]
        assert live(world, made.group.id) <= limit
    # Then run everything to its end: nothing may stay held for ever.
    for _ in range(200):
        if world.service.groups.get(world.owner, made.group.id).done:
            break
        world.clock.advance(120_000)
        world.service.sweep()
        for run in runs:
            run.start(8)
            for job in run.claim(8):
                run.ack(job.job_id, job.attempt)
                run.result(job.job_id, job.attempt)
            assert live(world, made.group.id) <= limit
    assert world.service.groups.get(world.owner, made.group.id).done


def test_a_fanout_to_1000_servers_is_one_request_and_one_store_write(
    groups_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = groups_world
    for n in range(1000):
        world.store.insert_server(
            Server(
                f"srv_fleet{n:04d}",
                f"fleet-{n}",
                (world.endpoint, world.other_endpoint)[n % 2].id,
                world.owner.id,
                world.clock.now(),
                labels=(("role", "web"),),
            )
        )
    inserts: list[int] = []
    insert_jobs = world.store.insert_jobs

    def counted(jobs: Any, idempotency: Any = None, group: Any = None) -> None:
        inserts.append(len(jobs))
        insert_jobs(jobs, idempotency, group)

    monkeypatch.setattr(world.store, "insert_jobs", counted)
    made = fan(world, max_parallel=10)
    assert inserts == [1000]
    assert made.group.job_count == 1000
    assert world.store.group_counts(made.group.id) == {JobState.QUEUED: 1000}
    assert sum(1 for job in made.jobs if not job.held) == 10
