"""Dependencies over every store (docs/protocol.md, "Dependencies"): a job naming `after` jobs
or an `after_group` waits, visibly, until each succeeded; one that did not cancels it with
`dependency_failed` naming it; one named already succeeded is claimable at once; what it may
name is checked (422 naming the field, another owner's job read as a missing one); and the
sweeper settles what a lost write left waiting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from moonrun.errors import InvalidRequest
from moonrun.scheduling.dependencies import DEPENDENCY_FAILED, MAX_AFTER
from moonrun.scheduling.jobs import Job, JobState
from moonrun.scheduling.views import job_view
from moonrun.service.specs import JobSpec
from tests.support.harness import Run, World
from tests.support.stores import StoreFactory


@pytest.fixture
def world(store_factory: StoreFactory) -> Iterator[World]:
    made = World(store_factory)
    yield made
    made.store.close()


def finish(run: Run, job_id: str, outcome: str = "succeeded") -> None:
    """Claim the job (it must be the next claimable), ack it and send its result."""
    attempt = run.run_to_running(job_id)
    run.result(job_id, attempt, outcome)


def claimable(world: World) -> list[str]:
    return [job.id for job in world.store.claimable_jobs(world.endpoint.id, world.clock.now(), 50)]


def test_a_job_waits_visibly_until_every_job_it_names_succeeded(world: World) -> None:
    run = world.run().start(8)
    first, second = world.submit(), world.submit()
    waiting = world.submit(after=[first.id, second.id])
    assert waiting.held
    assert waiting.claimable_at is None
    assert job_view(waiting)["waiting_for"] == {"jobs": [first.id, second.id], "group": None}
    assert claimable(world) == [first.id, second.id]
    finish(run, first.id)
    assert world.job(waiting.id).held
    assert claimable(world) == [second.id]
    finish(run, second.id)
    released = world.job(waiting.id)
    assert not released.held
    assert released.state is JobState.QUEUED
    assert job_view(released)["waiting_for"] is None
    assert claimable(world) == [waiting.id]


@pytest.mark.parametrize("how", ["failed", "cancelled"])
def test_a_dependency_that_did_not_succeed_cancels_the_job_naming_it(
    world: World, how: str
) -> None:
    run = world.run().start(8)
    first, second = world.submit(), world.submit()
    waiting = world.submit(after=[first.id, second.id])
    if how == "failed":
        finish(run, first.id, "failed")
    else:
        world.service.cancel_job(world.owner, first.id)
    ended = world.job(waiting.id)
    assert ended.state is JobState.CANCELLED
    assert ended.terminal is not None
    assert ended.terminal.error is not None
    assert ended.terminal.error.code == DEPENDENCY_FAILED
    assert first.id in ended.terminal.error.message
    terminal = job_view(ended)["terminal"]
    assert terminal is not None
    assert terminal["error"] == {
        "code": DEPENDENCY_FAILED,
        "message": ended.terminal.error.message,
    }
    assert claimable(world) == [second.id]


def test_a_cancelled_dependency_cancels_a_chain_of_waiters(world: World) -> None:
    root = world.submit()
    middle = world.submit(after=[root.id])
    last = world.submit(after=[middle.id])
    world.service.cancel_job(world.owner, root.id)
    assert world.job(middle.id).state is JobState.CANCELLED
    ended = world.job(last.id)
    assert ended.state is JobState.CANCELLED
    assert ended.terminal is not None
    assert ended.terminal.error is not None
    assert middle.id in ended.terminal.error.message


def test_a_job_naming_jobs_already_succeeded_is_claimable_at_once(world: World) -> None:
    run = world.run().start(8)
    done = world.submit()
    finish(run, done.id)
    job = world.submit(after=[done.id])
    assert not job.held
    assert job.state is JobState.QUEUED
    assert job_view(job)["waiting_for"] is None
    assert claimable(world) == [job.id]


def test_a_job_naming_a_job_already_failed_ends_cancelled_at_once(world: World) -> None:
    run = world.run().start(8)
    failed = world.submit()
    finish(run, failed.id, "failed")
    job = world.submit(after=[failed.id])
    assert job.state is JobState.CANCELLED
    assert job.terminal is not None
    assert job.terminal.error is not None
    assert job.terminal.error.code == DEPENDENCY_FAILED


def test_another_owners_job_and_a_missing_job_are_refused_alike_naming_the_field(
    world: World,
) -> None:
    theirs = world.submit(world.other_server, world.stranger)
    mine = world.submit()
    messages = []
    for named in (theirs.id, "job_nosuchjob"):
        with pytest.raises(InvalidRequest) as refused:
            world.submit(after=[mine.id, named])
        assert refused.value.fields == (("after[1]", "no such job"),)
        messages.append(refused.value.message)
    assert messages[0] == messages[1] == "after[1]: no such job"
    assert world.store.job_counts() == {JobState.QUEUED: 2}


def test_more_than_100_jobs_named_is_refused_naming_the_field(world: World) -> None:
    ids = [f"job_{n:04d}xyz" for n in range(MAX_AFTER + 1)]
    with pytest.raises(InvalidRequest) as refused:
        world.submit(after=ids)
    assert refused.value.fields[0][0] == "after"


def test_a_group_another_user_made_or_none_is_refused_naming_the_field(world: World) -> None:
    with pytest.raises(InvalidRequest) as refused:
        world.submit(after_group="grp_nosuchgroup")
    assert refused.value.fields == (("after_group", "no such group"),)


def test_a_batch_refusal_names_the_job_and_the_field(world: World) -> None:
    specs = [JobSpec("noop"), JobSpec("noop", after=("job_nosuchjob",))]
    with pytest.raises(InvalidRequest) as refused:
        world.service.create_jobs(world.owner, world.server.id, specs)
    assert refused.value.fields == (("jobs[1].after[0]", "no such job"),)


def _group(world: World, count: int) -> tuple[str, list[Job]]:
    for n in range(count):
        world.directory.create_server(
            world.admin,
            f"web-{n}",
            endpoint_id=world.endpoint.id,
            owner_id=world.owner.id,
            labels={"role": "web"},
        )
    made = world.service.groups.fanout(world.owner, "role=web", JobSpec("noop"))
    return made.group.id, made.jobs


def test_a_job_after_a_group_waits_until_every_job_of_it_succeeded(world: World) -> None:
    run = world.run().start(8)
    group_id, members = _group(world, 2)
    waiting = world.submit(after_group=group_id)
    assert job_view(waiting)["waiting_for"] == {"jobs": [], "group": group_id}
    finish(run, members[0].id)
    assert world.job(waiting.id).held
    finish(run, members[1].id)
    assert not world.job(waiting.id).held
    assert claimable(world) == [waiting.id]


def test_a_job_after_a_group_is_cancelled_once_a_job_of_it_failed(world: World) -> None:
    run = world.run().start(8)
    group_id, members = _group(world, 2)
    waiting = world.submit(after_group=group_id)
    finish(run, members[0].id, "failed")
    ended = world.job(waiting.id)
    assert ended.state is JobState.CANCELLED
    assert ended.terminal is not None
    assert ended.terminal.error is not None
    assert ended.terminal.error.code == DEPENDENCY_FAILED
    assert group_id in ended.terminal.error.message


def test_the_sweeper_settles_what_a_lost_write_left_waiting(world: World) -> None:
    run = world.run().start(8)
    first = world.submit()
    waiting = world.submit(after=[first.id])
    doomed_first = world.submit()
    doomed = world.submit(after=[doomed_first.id])
    # The dependencies end behind the service's back (as if the platform died before
    # settling their waiters).
    attempt = run.run_to_running(first.id)
    from moonrun.scheduling import jobs as domain

    def succeed(job: Job) -> Job:
        return domain.finish(job, domain.Event.RESULT, domain.Outcome.SUCCEEDED, world.clock.now())

    def cancel(job: Job) -> Job:
        return domain.request_cancel(job, user_id="x", now=world.clock.now())

    assert attempt == 1
    world.store.update_jobs([first.id], succeed)
    world.store.update_jobs([doomed_first.id], cancel)
    assert world.job(waiting.id).held
    assert world.job(doomed.id).held
    world.service.sweep()
    assert not world.job(waiting.id).held
    assert world.job(doomed.id).state is JobState.CANCELLED
    assert claimable(world) == [waiting.id]
    # Settling again changes nothing.
    before = world.job(waiting.id)
    world.service.sweep()
    assert world.job(waiting.id) == before


def test_a_finished_job_a_held_job_waits_on_is_not_deleted_until_it_is_released(
    world: World,
) -> None:
    from moonrun.errors import JobNotEnded

    run = world.run().start(8)
    first, second = world.submit(), world.submit()
    waiting = world.submit(after=[first.id, second.id])
    finish(run, first.id)
    with pytest.raises(JobNotEnded):
        world.service.delete_job(world.owner, first.id, lambda job: None)
    finish(run, second.id)
    assert not world.job(waiting.id).held
    assert world.service.delete_job(world.owner, first.id, lambda job: None).id == first.id
    assert world.store.waiters([first.id]) == []
