"""The pure rules of fan-out groups (scheduling/groups.py): which jobs start held, how many a
release may take, that a held job is never claimable, when a group stops, and their views."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moonrun.errors import InvalidRequest
from moonrun.scheduling import groups as domain
from moonrun.scheduling.groups import Group
from moonrun.scheduling.jobs import Job, JobState, create_job, is_claimable, request_cancel
from moonrun.scheduling.views import group_view, job_view
from tests.support.jobkit import POLICY, T0


def member(held: bool, *, not_before: int | None = None) -> Job:
    return create_job(
        job_id="job-1",
        server_id="srv-1",
        endpoint_id="ep-1",
        owner_id="usr-1",
        kind="noop",
        payload={},
        policy=POLICY,
        now=T0,
        not_before=not_before,
        group_id="grp_1",
        held=held,
    )


def test_only_the_jobs_past_max_parallel_start_held() -> None:
    assert [domain.starts_held(n, 2) for n in range(4)] == [False, False, True, True]
    assert not any(domain.starts_held(n, None) for n in range(4))


@pytest.mark.parametrize(
    ("max_parallel", "live", "held", "released"),
    [(2, 0, 5, 2), (2, 1, 5, 1), (2, 2, 5, 0), (3, 0, 1, 1), (1, 3, 2, 0), (None, 9, 4, 4)],
)
def test_a_release_fills_the_places_max_parallel_leaves_and_no_more(
    max_parallel: int | None, live: int, held: int, released: int
) -> None:
    assert domain.to_release(max_parallel, live, held) == released


def test_a_held_job_is_not_claimable_until_released_and_a_second_release_changes_nothing() -> None:
    held = member(True)
    assert held.claimable_at is None
    assert held.held_group_id == "grp_1"
    assert not is_claimable(held, T0 + 10**9)
    released = domain.release(held, T0 + 50)
    assert (released.held, released.claimable_at, released.version) == (False, T0 + 50, 2)
    assert domain.release(released, T0 + 60) is released
    # A not_before still in the future stays the time it may start.
    assert domain.release(member(True, not_before=T0 + 999), T0 + 50).eligible_at == T0 + 999


def test_a_cancelled_held_job_is_no_longer_held_for_its_group() -> None:
    cancelled = request_cancel(member(True), user_id="usr-1", now=T0 + 1)
    assert cancelled.state is JobState.CANCELLED
    assert cancelled.held_group_id is None
    assert domain.release(cancelled, T0 + 2) is cancelled


def test_a_stop_on_failure_group_stops_on_a_failed_end_only() -> None:
    group = Group("grp_1", "usr-1", "role=web", "noop", T0, 3, None, True)
    cancelled = request_cancel(member(False), user_id="usr-1", now=T0)
    failed = replace(member(False), state=JobState.FAILED)
    assert not domain.stops(group, [cancelled])
    assert domain.stops(group, [cancelled, failed])
    assert not domain.stops(replace(group, stop_on_failure=False), [failed])
    stopped = domain.stop(member(True), "grp_1", T0 + 5)
    assert stopped.state is JobState.CANCELLED
    assert stopped.cancel is not None
    assert stopped.cancel.requested_by == "grp_1"


def test_bad_options_name_their_field() -> None:
    for bad in (0, 1001, True, "2"):
        with pytest.raises(InvalidRequest) as refused:
            domain.check_options(bad, False)
        assert refused.value.fields[0][0] == "max_parallel"
    with pytest.raises(InvalidRequest):
        domain.check_options(None, "yes")


def test_a_groups_view_counts_every_state_and_is_done_once_all_ended() -> None:
    group = Group("grp_1", "usr-1", "role=web", "noop", T0, 3, 2, False)
    view = group_view(group, {JobState.RUNNING: 1, JobState.SUCCEEDED: 2})
    assert view["counts"] == {
        "queued": 0,
        "accepted": 0,
        "running": 1,
        "retrying": 0,
        "succeeded": 2,
        "failed": 0,
        "cancelled": 0,
    }
    assert view["done"] is False
    assert group_view(group, {JobState.SUCCEEDED: 2, JobState.FAILED: 1})["done"] is True
    assert job_view(member(True))["group"] == {"id": "grp_1", "held": True}
