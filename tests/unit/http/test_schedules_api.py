"""Schedules over the user API: created, fired exactly once per time by the firing pass,
caught up at most once, paused, resumed, triggered under the overlap policy, changed, deleted;
bad input is a 422 naming the field, and another owner's schedules are not found or forbidden."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.scheduling.time import format_instant, parse_instant
from tests.support.http_harness import Cast, http_world
from tests.support.stores import file_factory, memory_factory

MINUTE = 60_000


@pytest.fixture(params=["memory", "file"])
def cast(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cast]:
    factory = memory_factory() if request.param == "memory" else file_factory(lambda: tmp_path)
    with http_world(factory, tmp_path) as cast:
        yield cast


def create(cast: Cast, token: str | None = None, **body: Any) -> Any:
    body.setdefault("name", "every minute")
    body.setdefault("cron", "* * * * *")
    body.setdefault("job", {"kind": "noop", "payload": {"secret": "s3cr3t"}})
    return cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        token=token or cast.owner[1],
        json=body,
    )


def fire(cast: Cast) -> int:
    decided: int = cast.world.platform.service.schedules.fire_due()
    return decided


def jobs_of(cast: Cast, schedule_id: str) -> list[dict[str, Any]]:
    listed = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    return [job for job in listed if (job["schedule"] or {}).get("id") == schedule_id]


def to_next_minute(cast: Cast, extra_ms: int = 0) -> int:
    """Move the clock to the next whole minute (plus `extra_ms`); that minute, as an instant."""
    now = cast.world.clock.now()
    minute = (now // MINUTE + 1) * MINUTE
    cast.world.clock.advance(minute - now + extra_ms)
    return minute


def test_a_created_schedule_shows_its_next_five_times_and_never_its_payload(cast: Cast) -> None:
    response = create(cast, cron="0 3 * * *", timezone="Europe/Berlin")

    assert response.status_code == 201, response.text
    view = response.json()
    assert view["job"] == {
        "kind": "noop",
        "max_attempts": None,
        "backoff": None,
        "priority": 5,
        "concurrency": None,
    }
    assert "s3cr3t" not in response.text
    assert len(view["next_times"]) == 5
    assert all(t.endswith(("T02:00:00.000Z", "T01:00:00.000Z")) for t in view["next_times"])
    assert (view["paused"], view["skipped"], view["missed"], view["last_firing"]) == (
        False,
        0,
        0,
        None,
    )


def test_each_due_time_fires_one_job_carrying_its_schedule_and_time(cast: Cast) -> None:
    schedule = create(cast).json()
    first = to_next_minute(cast, 200)

    fire(cast)
    fire(cast)  # deciding again makes nothing more

    jobs = jobs_of(cast, schedule["id"])
    assert [job["schedule"]["scheduled_for"] for job in jobs] == [format_instant(first)]
    view = cast.world.api("GET", f"/api/v1/schedules/{schedule['id']}").json()
    assert view["last_firing"] == {
        "scheduled_for": format_instant(first),
        "job_id": jobs[0]["id"],
        "job_state": "queued",
        "group_id": None,
        "group_done": None,
    }


def test_a_platform_that_was_down_fires_one_catch_up_and_counts_the_rest_missed(
    cast: Cast,
) -> None:
    schedule = create(cast, overlap="allow").json()
    first = to_next_minute(cast)
    cast.world.clock.advance(9 * MINUTE + 30_000)  # down from before `first` to 9.5 min after

    fire(cast)

    jobs = jobs_of(cast, schedule["id"])
    assert [job["schedule"]["scheduled_for"] for job in jobs] == [
        format_instant(first + 9 * MINUTE)
    ]
    assert cast.world.api("GET", f"/api/v1/schedules/{schedule['id']}").json()["missed"] == 9


def test_overlap_skip_counts_a_time_whose_previous_job_still_waits(cast: Cast) -> None:
    schedule = create(cast).json()
    to_next_minute(cast, 100)
    fire(cast)
    to_next_minute(cast, 100)

    fire(cast)

    assert len(jobs_of(cast, schedule["id"])) == 1
    assert cast.world.api("GET", f"/api/v1/schedules/{schedule['id']}").json()["skipped"] == 1


def test_cancel_previous_asks_the_previous_job_to_cancel_then_fires(cast: Cast) -> None:
    schedule = create(cast, overlap="cancel_previous").json()
    to_next_minute(cast, 100)
    fire(cast)
    to_next_minute(cast, 100)

    fire(cast)

    states = sorted(job["state"] for job in jobs_of(cast, schedule["id"]))
    assert states == ["cancelled", "queued"]


def test_a_paused_schedule_does_not_fire_and_resuming_catches_up_once(cast: Cast) -> None:
    schedule = create(cast, overlap="allow", catchup_window_s=600).json()
    path = f"/api/v1/schedules/{schedule['id']}"
    assert cast.world.api("POST", f"{path}/pause", token=cast.owner[1]).json()["paused"]
    to_next_minute(cast)
    cast.world.clock.advance(3 * MINUTE + 1000)
    fire(cast)
    assert jobs_of(cast, schedule["id"]) == []

    resumed = cast.world.api("POST", f"{path}/resume", token=cast.owner[1]).json()
    fire(cast)

    assert resumed["paused"] is False
    assert len(jobs_of(cast, schedule["id"])) == 1
    assert cast.world.api("GET", path).json()["missed"] == 3


def test_trigger_fires_now_under_the_overlap_policy(cast: Cast) -> None:
    schedule = create(cast).json()
    path = f"/api/v1/schedules/{schedule['id']}/trigger"

    first = cast.world.api("POST", path, token=cast.owner[1])
    cast.world.clock.advance(5)
    second = cast.world.api("POST", path, token=cast.owner[1])

    assert first.status_code == 200, first.text
    assert first.json()["job_id"] is not None
    assert second.json()["job_id"] is None  # skip: the first trigger's job still waits
    assert second.json()["schedule"]["skipped"] == 1
    assert len(jobs_of(cast, schedule["id"])) == 1


def test_a_changed_calendar_starts_after_now_and_a_deleted_schedule_fires_no_more(
    cast: Cast,
) -> None:
    schedule = create(cast).json()
    path = f"/api/v1/schedules/{schedule['id']}"

    changed = cast.world.api("PATCH", path, token=cast.owner[1], json={"cron": "@daily"})
    deleted = cast.world.api("DELETE", path, token=cast.owner[1])
    to_next_minute(cast, 100)
    fire(cast)

    assert changed.status_code == 200, changed.text
    assert changed.json()["cron"] == "@daily"
    assert parse_instant(changed.json()["next_times"][0]) % (24 * 3600_000) == 0
    assert deleted.status_code == 200
    assert cast.world.api("GET", path).status_code == 404
    assert jobs_of(cast, schedule["id"]) == []


def test_a_disabled_owners_schedule_does_not_fire_and_says_so(cast: Cast) -> None:
    schedule = create(cast).json()
    assert cast.world.api("POST", f"/api/v1/users/{cast.owner[0]}/disable").status_code == 200
    to_next_minute(cast, 100)

    fire(cast)

    view = cast.world.api("GET", f"/api/v1/schedules/{schedule['id']}").json()
    assert view["owner_disabled"] is True
    assert view["missed"] == 1
    assert cast.world.store.list_jobs(server_ids=None, state=None, limit=5) == []


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"cron": "61 * * * *"}, "cron minute: '61'"),
        ({"cron": "* * * *"}, "cron needs 5 fields"),
        ({"timezone": "Mars/Base"}, "timezone"),
        ({"overlap": "queue"}, "overlap"),
        ({"catchup_window_s": -1}, "catchup_window_s"),
        ({"name": ""}, "name"),
        ({"job": {"kind": "noop", "not_before": "2026-01-01T00:00:00Z"}}, "job.not_before"),
        ({"job": {"kind": "Bad Kind"}}, "job.kind"),
        ({"every": "1h"}, "every"),
    ],
)
def test_bad_schedules_are_a_422_naming_the_field(
    cast: Cast, body: dict[str, Any], problem: str
) -> None:
    response = create(cast, **body)

    assert response.status_code == 422, response.text
    assert problem in response.json()["error"]["message"]
    assert cast.world.api("GET", "/api/v1/schedules").json()["schedules"] == []


def test_another_owners_schedules_are_out_of_reach(cast: Cast) -> None:
    schedule = create(cast).json()
    stranger = cast.stranger[1]

    listed = cast.world.api("GET", "/api/v1/schedules", token=stranger).json()["schedules"]
    read = cast.world.api("GET", f"/api/v1/schedules/{schedule['id']}", token=stranger)
    made = create(cast, token=stranger)
    helper = cast.world.api("GET", "/api/v1/schedules", token=cast.helper[1]).json()["schedules"]

    assert listed == []
    assert read.status_code == 403
    assert made.status_code == 403
    assert [s["id"] for s in helper] == [schedule["id"]]  # a server admin manages its jobs


def test_removing_a_server_removes_its_schedules(cast: Cast) -> None:
    schedule = create(cast).json()

    removed = cast.world.api("DELETE", f"/api/v1/servers/{cast.server_id}")

    assert removed.status_code == 200, removed.text
    assert cast.world.api("GET", f"/api/v1/schedules/{schedule['id']}").status_code == 404
