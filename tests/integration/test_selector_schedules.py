"""Selector schedules over HTTP, on every store (docs/protocol.md, "Schedules"): a schedule names
a label selector instead of a server, and each firing is a group with one job per server its
creator may submit to whose labels match at the firing time; exactly one of server and
selector; the overlap policy looks at the previous firing's group; a firing matching nothing is
recorded; the schedule is its creator's, as a group is.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`, administered by
`helper`; db-1 on host-b, owned by `stranger`. `label_fleet` adds the owner's web-2 and web-3,
and labels all four (db-1 too) role=web.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moonrun.scheduling.time import format_instant
from tests.integration.test_fanout_groups import label_fleet
from tests.support.http_harness import Cast, http_world
from tests.support.stores import StoreFactory

MINUTE = 60_000


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        label_fleet(cast)
        yield cast


def create(cast: Cast, token: str | None = None, **body: Any) -> Any:
    body.setdefault("name", "every minute")
    body.setdefault("cron", "* * * * *")
    body.setdefault("job", {"kind": "noop", "payload": {"secret": "s3cr3t"}})
    if "server_id" not in body:
        body.setdefault("selector", "role=web,env=prod")
    return cast.world.api("POST", "/api/v1/schedules", token=token or cast.owner[1], json=body)


def made(cast: Cast, **body: Any) -> dict[str, Any]:
    response = create(cast, **body)
    assert response.status_code == 201, response.text
    view: dict[str, Any] = response.json()
    return view


def fire(cast: Cast) -> int:
    decided: int = cast.world.platform.service.schedules.fire_due()
    return decided


def to_next_minute(cast: Cast, extra_ms: int = 200) -> int:
    now = cast.world.clock.now()
    minute = (now // MINUTE + 1) * MINUTE
    cast.world.clock.advance(minute - now + extra_ms)
    return minute


def view_of(cast: Cast, schedule_id: str) -> dict[str, Any]:
    """The schedule as a platform admin reads it."""
    response = cast.world.api("GET", f"/api/v1/schedules/{schedule_id}")
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def group_jobs(cast: Cast, group_id: str) -> list[dict[str, Any]]:
    listed = cast.world.api("GET", "/api/v1/jobs", params={"group": group_id}, token=cast.owner[1])
    assert listed.status_code == 200, listed.text
    jobs: list[dict[str, Any]] = listed.json()["jobs"]
    return jobs


def test_a_selector_schedule_is_created_without_a_server_and_shows_its_selector(
    cast: Cast,
) -> None:
    view = made(cast, max_parallel=2, stop_on_failure=True)

    assert (view["server_id"], view["selector"]) == (None, "role=web,env=prod")
    assert (view["max_parallel"], view["stop_on_failure"], view["unmatched"]) == (2, True, 0)
    assert view["last_firing"] is None
    assert len(view["next_times"]) == 5
    assert "s3cr3t" not in str(view)


def test_each_firing_makes_one_group_with_a_job_per_matching_server_of_the_creator(
    cast: Cast,
) -> None:
    schedule = made(cast, job={"kind": "noop", "priority": 7, "max_attempts": 2})
    first = to_next_minute(cast)

    fire(cast)
    fire(cast)  # deciding again makes nothing more

    view = view_of(cast, schedule["id"])
    group_id = view["last_firing"]["group_id"]
    assert group_id.startswith("grp_")
    assert view["last_firing"] == {
        "scheduled_for": format_instant(first),
        "job_id": None,
        "job_state": None,
        "group_id": group_id,
        "group_done": False,
    }
    group = cast.world.api("GET", f"/api/v1/groups/{group_id}", token=cast.owner[1]).json()
    assert (group["creator_id"], group["selector"], group["job_count"]) == (
        cast.owner[0],
        "role=web,env=prod",
        3,
    )
    jobs = group_jobs(cast, group_id)
    assert cast.other_server_id not in {job["server_id"] for job in jobs}  # the stranger's
    assert len({job["server_id"] for job in jobs}) == 3
    assert {(job["priority"], job["max_attempts"]) for job in jobs} == {(7, 2)}
    assert {job["schedule"]["id"] for job in jobs} == {schedule["id"]}
    assert {job["schedule"]["scheduled_for"] for job in jobs} == {format_instant(first)}
    # The group is the creator's: it shows among their groups.
    mine = cast.world.api("GET", "/api/v1/groups", token=cast.owner[1]).json()["groups"]
    assert [g["id"] for g in mine] == [group_id]


def test_the_servers_are_matched_at_each_firing_not_at_creation(cast: Cast) -> None:
    schedule = made(cast, selector="tier=edge")
    world = cast.world
    assert world.api(
        "PUT", f"/api/v1/servers/{cast.server_id}/labels", json={"labels": {"tier": "edge"}}
    ).is_success
    to_next_minute(cast)

    fire(cast)

    group_id = view_of(cast, schedule["id"])["last_firing"]["group_id"]
    assert [job["server_id"] for job in group_jobs(cast, group_id)] == [cast.server_id]


def test_max_parallel_carries_over_to_each_firings_group(cast: Cast) -> None:
    schedule = made(cast, max_parallel=1)
    to_next_minute(cast)

    fire(cast)

    group_id = view_of(cast, schedule["id"])["last_firing"]["group_id"]
    jobs = group_jobs(cast, group_id)
    assert sorted(job["group"]["held"] for job in jobs) == [False, True, True]


def test_a_firing_matching_no_server_is_recorded_and_counted_without_a_group(
    cast: Cast,
) -> None:
    schedule = made(cast, selector="role=nothing")
    first = to_next_minute(cast)

    fire(cast)

    view = view_of(cast, schedule["id"])
    assert view["unmatched"] == 1
    assert (view["missed"], view["skipped"]) == (0, 0)
    assert view["last_firing"] == {
        "scheduled_for": format_instant(first),
        "job_id": None,
        "job_state": None,
        "group_id": None,
        "group_done": None,
    }
    assert cast.world.api("GET", "/api/v1/groups", token=cast.owner[1]).json()["groups"] == []


def test_overlap_skip_counts_a_time_while_the_previous_group_has_a_job_not_ended(
    cast: Cast,
) -> None:
    schedule = made(cast)
    to_next_minute(cast)
    fire(cast)
    first_group = view_of(cast, schedule["id"])["last_firing"]["group_id"]
    to_next_minute(cast)

    fire(cast)

    view = view_of(cast, schedule["id"])
    assert (view["skipped"], view["last_firing"]["group_id"]) == (1, first_group)
    # Once every job of the group has ended, the next time fires.
    cancelled = cast.world.api("POST", f"/api/v1/groups/{first_group}/cancel", token=cast.owner[1])
    assert cancelled.json()["done"] is True
    to_next_minute(cast)
    fire(cast)
    assert view_of(cast, schedule["id"])["last_firing"]["group_id"] not in (None, first_group)


def test_overlap_cancel_previous_cancels_the_previous_groups_jobs_then_fires(
    cast: Cast,
) -> None:
    schedule = made(cast, overlap="cancel_previous")
    to_next_minute(cast)
    fire(cast)
    first_group = view_of(cast, schedule["id"])["last_firing"]["group_id"]
    to_next_minute(cast)

    fire(cast)

    assert {job["state"] for job in group_jobs(cast, first_group)} == {"cancelled"}
    second = view_of(cast, schedule["id"])["last_firing"]["group_id"]
    assert second != first_group
    assert {job["state"] for job in group_jobs(cast, second)} == {"queued"}


def test_a_trigger_fires_a_group_now_and_answers_its_id(cast: Cast) -> None:
    schedule = made(cast, overlap="allow")

    answer = cast.world.api(
        "POST", f"/api/v1/schedules/{schedule['id']}/trigger", token=cast.owner[1]
    )

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["job_id"] is None
    assert body["group_id"] == body["schedule"]["last_firing"]["group_id"]
    assert len(group_jobs(cast, body["group_id"])) == 3


def test_a_selector_schedule_is_its_creators_and_platform_admins(cast: Cast) -> None:
    schedule = made(cast)
    path = f"/api/v1/schedules/{schedule['id']}"
    world = cast.world

    # The helper administers web-1, which the selector reaches: still not theirs.
    for token in (cast.helper[1], cast.stranger[1]):
        assert world.api("GET", path, token=token).status_code == 403
        assert world.api("POST", f"{path}/trigger", token=token).status_code == 403
        assert world.api("DELETE", path, token=token).status_code == 403
        listed = world.api("GET", "/api/v1/schedules", token=token).json()["schedules"]
        assert schedule["id"] not in [s["id"] for s in listed]
    assert world.api("GET", path).status_code == 200  # a platform admin
    listed = world.api("GET", "/api/v1/schedules", token=cast.owner[1]).json()["schedules"]
    assert [s["id"] for s in listed] == [schedule["id"]]
    # The stranger's own selector schedule reaches only the stranger's servers.
    theirs = made(cast, token=cast.stranger[1])
    to_next_minute(cast)
    fire(cast)
    group_id = view_of(cast, theirs["id"])["last_firing"]["group_id"]
    jobs = world.api("GET", "/api/v1/jobs", params={"group": group_id}).json()["jobs"]
    assert [job["server_id"] for job in jobs] == [cast.other_server_id]


def test_post_schedules_with_a_server_id_makes_that_servers_schedule(cast: Cast) -> None:
    view = made(cast, server_id=cast.server_id)

    assert (view["server_id"], view["selector"]) == (cast.server_id, None)
    assert create(cast, token=cast.stranger[1], server_id=cast.server_id).status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        {"selector": "role=web"},
        {"selector": None},
    ],
    ids=["both", "neither"],
)
def test_a_schedule_naming_both_or_neither_of_server_and_selector_is_a_422(
    cast: Cast, body: dict[str, Any]
) -> None:
    if body["selector"] is not None:
        body["server_id"] = cast.server_id
    else:
        body = {"server_id": None}

    response = create(cast, **body)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "exactly one of server_id and selector" in error["message"]


def test_a_selector_that_does_not_parse_is_a_422_with_its_position(cast: Cast) -> None:
    response = create(cast, selector="role=web,,env")

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_selector"
    assert "at position 9" in error["message"]
    assert [problem["field"] for problem in error["fields"]] == ["selector"]


def test_the_empty_selector_is_a_422_naming_selector(cast: Cast) -> None:
    response = create(cast, selector="  ")

    assert response.status_code == 422
    assert [p["field"] for p in response.json()["error"]["fields"]] == ["selector"]


def test_group_options_on_a_servers_schedule_are_a_422(cast: Cast) -> None:
    assert create(cast, server_id=cast.server_id, max_parallel=2).status_code == 422
    schedule = made(cast, server_id=cast.server_id)
    changed = cast.world.api(
        "PATCH", f"/api/v1/schedules/{schedule['id']}", json={"selector": "role=web"}
    )
    assert changed.status_code == 422
    assert [p["field"] for p in changed.json()["error"]["fields"]] == ["selector"]


def test_a_patch_changes_a_selector_schedules_selector_and_options(cast: Cast) -> None:
    schedule = made(cast)

    changed = cast.world.api(
        "PATCH",
        f"/api/v1/schedules/{schedule['id']}",
        token=cast.owner[1],
        json={"selector": "role=web,env=prod,!canary", "max_parallel": 3},
    )

    assert changed.status_code == 200, changed.text
    assert (changed.json()["selector"], changed.json()["max_parallel"]) == (
        "role=web,env=prod,!canary",
        3,
    )


def test_a_kind_a_matching_servers_run_refuses_is_a_422_at_create_naming_the_server(
    cast: Cast,
) -> None:
    cast.run.start(kinds={"noop": {}})

    response = create(cast, job={"kind": "unheard-of"})

    assert response.status_code == 422, response.text
    assert "server web-" in response.json()["error"]["message"]


def test_removing_a_matched_server_leaves_the_selector_schedule(cast: Cast) -> None:
    schedule = made(cast)
    assert cast.world.api("DELETE", f"/api/v1/servers/{cast.server_id}").status_code == 200

    assert view_of(cast, schedule["id"])["selector"] == "role=web,env=prod"
