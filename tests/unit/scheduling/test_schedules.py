"""Schedules decide their due times: one firing per time, one catch-up at most, no bursts, the
overlap policy, and a job id that makes each (schedule, time) one job (scheduling/schedules)."""

from __future__ import annotations

import dataclasses
from datetime import UTC

import pytest

from moonrun.errors import InvalidRequest
from moonrun.scheduling import cron
from moonrun.scheduling import schedules as domain
from moonrun.scheduling.schedules import Overlap, Schedule
from moonrun.scheduling.time import Instant, format_instant, parse_instant

MINUTE = 60_000
EVERY_MINUTE = cron.parse("* * * * *")
BERLIN = domain.zone("Europe/Berlin")


def at(text: str) -> Instant:
    return parse_instant(text)


def schedule(next_at: Instant | None, **fields: object) -> Schedule:
    base = Schedule(
        id="sch_1",
        server_id="srv_1",
        owner_id="usr_1",
        name="nightly",
        cron="* * * * *",
        timezone="UTC",
        job_json='{"kind":"noop"}',
        overlap=Overlap.SKIP,
        catchup_window_s=60,
        paused=False,
        created_at=0,
        next_at=next_at,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def decide(s: Schedule, now: Instant, *, running: bool = False, enabled: bool = True):  # type: ignore[no-untyped-def]
    return domain.decide(s, EVERY_MINUTE, UTC, now, previous_running=running, owner_enabled=enabled)


def test_a_time_not_yet_due_decides_nothing() -> None:
    s = schedule(at("2026-12-03T10:00:00Z"))

    firing = decide(s, at("2026-12-03T09:59:59.999Z"))

    assert firing == domain.Firing(s, None)


def test_a_due_time_fires_once_and_the_cursor_moves_past_now() -> None:
    due = at("2026-12-03T10:00:00Z")

    firing = decide(schedule(due), due + 300)

    assert firing.scheduled_for == due
    assert firing.schedule.next_at == due + MINUTE
    assert firing.schedule.last_job_id == domain.firing_job_id("sch_1", due)
    assert (firing.schedule.missed, firing.schedule.skipped) == (0, 0)
    assert firing.schedule.version == 2


def test_after_an_outage_only_the_latest_missed_time_fires_and_the_rest_are_counted() -> None:
    due = at("2026-12-03T10:00:00Z")

    firing = decide(schedule(due), due + 10 * MINUTE + 30_000)  # 10:10:30, window 60 s

    assert firing.scheduled_for == due + 10 * MINUTE
    assert firing.schedule.missed == 10
    assert firing.schedule.next_at == due + 11 * MINUTE


def test_a_latest_time_outside_the_catch_up_window_is_missed_too() -> None:
    due = at("2026-12-03T10:00:00Z")
    hourly = schedule(due, catchup_window_s=60)

    firing = domain.decide(
        hourly,
        cron.parse("0 * * * *"),
        UTC,
        due + 30 * MINUTE,
        previous_running=False,
        owner_enabled=True,
    )

    assert firing.scheduled_for is None
    assert firing.schedule.missed == 1
    assert firing.schedule.next_at == due + 60 * MINUTE


def test_a_window_of_zero_still_fires_a_time_decided_a_little_late() -> None:
    due = at("2026-12-03T10:00:00Z")

    firing = decide(schedule(due, catchup_window_s=0), due + 2_000)

    assert firing.scheduled_for == due


def test_a_very_long_gap_is_counted_in_bounded_work_and_fires_no_burst() -> None:
    due = at("2026-01-01T00:00:00Z")
    now = due + 200_000 * MINUTE + 10_000  # about 139 days of a minutely schedule

    firing = decide(schedule(due), now)

    assert firing.scheduled_for == due + 200_000 * MINUTE
    assert firing.schedule.missed >= domain.MAX_COUNTED
    assert firing.schedule.next_at == due + 200_001 * MINUTE


@pytest.mark.parametrize(
    ("overlap", "fires", "cancels", "skipped"),
    [
        (Overlap.SKIP, False, False, 1),
        (Overlap.ALLOW, True, False, 0),
        (Overlap.CANCEL_PREVIOUS, True, True, 0),
    ],
)
def test_overlap_decides_a_time_that_comes_while_the_previous_job_runs(
    overlap: Overlap, fires: bool, cancels: bool, skipped: int
) -> None:
    due = at("2026-12-03T10:00:00Z")

    firing = decide(schedule(due, overlap=overlap), due + 100, running=True)

    assert (firing.scheduled_for is not None, firing.cancel_previous) == (fires, cancels)
    assert firing.schedule.skipped == skipped
    assert firing.schedule.next_at == due + MINUTE


def test_a_disabled_owners_time_is_missed_not_fired() -> None:
    due = at("2026-12-03T10:00:00Z")

    firing = decide(schedule(due), due + 100, enabled=False)

    assert (firing.scheduled_for, firing.schedule.missed) == (None, 1)


def test_a_firing_job_id_is_the_same_for_the_same_schedule_and_time_only() -> None:
    one = domain.firing_job_id("sch_1", 1000)

    assert one == domain.firing_job_id("sch_1", 1000)
    assert one != domain.firing_job_id("sch_1", 1001)
    assert one != domain.firing_job_id("sch_2", 1000)
    assert one.startswith("job_")
    assert len(one) == 20


def test_next_times_start_at_the_cursor_while_it_is_ahead() -> None:
    s = schedule(at("2026-03-29T01:00:00Z"), cron="30 2 * * *", timezone="Europe/Berlin")

    times = domain.next_times(s, cron.parse("30 2 * * *"), BERLIN, at("2026-03-28T12:00:00Z"))

    # 02:30 does not exist in Berlin on 29 March 2026: it fires at 03:00 CEST (01:00Z).
    assert [format_instant(t) for t in times[:2]] == [
        "2026-03-29T01:00:00.000Z",
        "2026-03-30T00:30:00.000Z",
    ]
    assert len(times) == domain.NEXT_TIMES


def test_an_unknown_time_zone_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequest, match="timezone"):
        domain.zone("Mars/Olympus_Mons")
    with pytest.raises(InvalidRequest, match="timezone"):
        domain.zone("../../etc/passwd")
