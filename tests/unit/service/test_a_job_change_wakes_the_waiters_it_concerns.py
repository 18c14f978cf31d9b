"""Whom a committed job change wakes (`Watch.job_changed`), beside the job's own readers:

- its endpoint's waiting claims when the job became claimable or left an active state (a
  place of the endpoint's capacity freed), not when it moved between active states;
- its endpoint's cancel watchers when a cancel was first asked of it while active, not when
  an active job that already had one changes again, nor a job that is not active;
- its group's readers when it changed state (or was made), not at any other change.

The records are made from one submitted job, in the states a change would leave it in; the
watch is told of them directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from moonrun.scheduling.jobs import CancelState, Job, JobState
from moonrun.service.waiting import CANCELS, ENDPOINT, GROUP, Watch
from tests.support.harness import World
from tests.support.stores import memory_factory

CANCEL = CancelState(requested_at=1, requested_by="usr_owner")


def job() -> Job:
    """A queued job on an endpoint (claimable)."""
    return World(memory_factory()).submit()


def test_claims_are_woken_by_work_made_claimable_and_by_a_place_freed_only() -> None:
    queued = job()
    accepted = replace(queued, state=JobState.ACCEPTED)
    running = replace(queued, state=JobState.RUNNING)
    succeeded = replace(queued, state=JobState.SUCCEEDED)
    assert (queued.claimable_at is not None, succeeded.claimable_at) == (True, None)
    seen: list[bool] = []

    async def scenario() -> None:
        watch = Watch()
        claims = watch.register(ENDPOINT, queued.endpoint_id)
        for after, before in [
            (queued, None),  # made claimable
            (accepted, queued),  # claimed
            (running, accepted),  # acked: still holds its place
            (succeeded, running),  # ended: its place is free
            (succeeded, None),  # not claimable, and no place was held
        ]:
            claims.event.clear()
            watch.job_changed(after, before)
            await asyncio.sleep(0)
            seen.append(claims.event.is_set())

    asyncio.run(scenario())
    assert seen == [True, False, False, True, False]


def test_cancel_watchers_are_woken_by_a_cancel_first_asked_of_an_active_job_only() -> None:
    queued = job()
    running = replace(queued, state=JobState.RUNNING)
    cancelling = replace(running, cancel=CANCEL)
    other_endpoint = replace(cancelling, endpoint_id="end_elsewhere")
    seen: list[bool] = []

    async def scenario() -> None:
        watch = Watch()
        cancels = watch.register(CANCELS, queued.endpoint_id)
        for after, before in [
            (running, queued),  # claimed and acked, no cancel asked
            (cancelling, running),  # a cancel asked of it: Run must learn it
            (cancelling, None),  # a record first seen with its cancel (reconciled)
            (replace(cancelling, progress=None, version=9), cancelling),  # changed again
            (replace(queued, state=JobState.CANCELLED, cancel=CANCEL), queued),  # not active
            (other_endpoint, running),  # another endpoint's, whose watchers nobody is
        ]:
            cancels.event.clear()
            watch.job_changed(after, before)
            await asyncio.sleep(0)
            seen.append(cancels.event.is_set())

    asyncio.run(scenario())
    assert seen == [False, True, True, False, False, False]


def test_group_readers_are_woken_when_one_of_its_jobs_changes_state_only() -> None:
    queued = replace(job(), group_id="grp_1")
    running = replace(queued, state=JobState.RUNNING)
    ungrouped = replace(running, group_id=None)
    seen: list[bool] = []

    async def scenario() -> None:
        watch = Watch()
        readers = watch.register(GROUP, "grp_1")
        for after, before in [
            (queued, None),  # made in the group
            (running, queued),  # a change of state
            (replace(running, cancel=CANCEL), running),  # a change that keeps its state
            (ungrouped, replace(ungrouped, state=JobState.QUEUED)),  # in no group
            (replace(running, group_id="grp_2"), queued),  # another group's
        ]:
            readers.event.clear()
            watch.job_changed(after, before)
            await asyncio.sleep(0)
            seen.append(readers.event.is_set())

    asyncio.run(scenario())
    assert seen == [True, True, False, False, False]
