"""A selector schedule's firings are groups (scheduling/schedules): a firing names the group its
(schedule, time) derives, never a job; the group's and its jobs' ids are the same wherever and
however often they are derived, and differ between times and servers; the overlap policy reads
the previous group; a firing that matched no server is recorded and counted."""

from __future__ import annotations

import dataclasses

from moonrun.scheduling import schedules as domain
from moonrun.scheduling.schedules import Overlap, Schedule
from moonrun.scheduling.time import parse_instant
from tests.unit.scheduling.test_schedules import decide, schedule

DUE = parse_instant("2026-12-03T10:00:00Z")


def fleet(**fields: object) -> Schedule:
    return schedule(DUE, server_id=None, selector="role=web", **fields)


def test_a_selector_firing_names_its_derived_group_and_no_job() -> None:
    firing = decide(fleet(last_job_id=None), DUE + 300)

    assert firing.scheduled_for == DUE
    assert firing.schedule.last_group_id == domain.firing_group_id("sch_1", DUE)
    assert firing.schedule.last_job_id is None
    assert firing.schedule.last_scheduled_for == DUE


def test_firing_ids_are_shaped_like_ids_and_derive_from_schedule_time_and_server() -> None:
    group = domain.firing_group_id("sch_1", DUE)
    job = domain.group_job_id("sch_1", DUE, "srv_a")

    assert (group[:4], len(group)) == ("grp_", 20)
    assert (job[:4], len(job)) == ("job_", 20)
    assert group == domain.firing_group_id("sch_1", DUE)  # on every platform, after restarts
    assert job == domain.group_job_id("sch_1", DUE, "srv_a")
    assert (
        len(
            {
                job,
                domain.group_job_id("sch_1", DUE, "srv_b"),
                domain.group_job_id("sch_1", DUE + 60_000, "srv_a"),
                domain.group_job_id("sch_2", DUE, "srv_a"),
                domain.firing_job_id("sch_1", DUE),
            }
        )
        == 5
    )
    assert group != domain.firing_group_id("sch_1", DUE + 60_000)


def test_a_previous_group_not_ended_skips_the_time_under_overlap_skip() -> None:
    previous = domain.firing_group_id("sch_1", DUE - 60_000)

    firing = decide(fleet(last_group_id=previous), DUE + 300, running=True)

    assert firing.scheduled_for is None
    assert (firing.schedule.skipped, firing.schedule.last_group_id) == (1, previous)


def test_cancel_previous_fires_and_asks_the_previous_group_to_cancel() -> None:
    previous = domain.firing_group_id("sch_1", DUE - 60_000)
    s = fleet(last_group_id=previous, overlap=Overlap.CANCEL_PREVIOUS)

    firing = decide(s, DUE + 300, running=True)

    assert firing.cancel_previous
    assert firing.schedule.last_group_id == domain.firing_group_id("sch_1", DUE)


def test_a_firing_that_matched_nothing_is_recorded_without_a_group_and_counted() -> None:
    previous = domain.firing_group_id("sch_1", DUE - 60_000)
    s = fleet(last_group_id=previous, overlap=Overlap.CANCEL_PREVIOUS, unmatched=2)
    fired = decide(s, DUE + 300, running=True)

    recorded = domain.nothing_matched(fired)

    assert recorded.scheduled_for is None
    assert recorded.cancel_previous  # a firing all the same: the previous group is cancelled
    assert recorded.schedule == dataclasses.replace(fired.schedule, last_group_id=None, unmatched=3)
    assert recorded.schedule.last_scheduled_for == DUE
    assert recorded.schedule.next_at == fired.schedule.next_at  # never fired again


def test_a_servers_schedule_still_fires_a_job() -> None:
    firing = decide(schedule(DUE), DUE + 300)

    assert firing.schedule.last_job_id == domain.firing_job_id("sch_1", DUE)
    assert firing.schedule.last_group_id is None
    assert not firing.schedule.fans_out
