"""Priorities over HTTP, on every store (docs/protocol.md, "Priorities"): a job carries
`priority` 0..9 (5 by default) in its view; among an endpoint's claimable jobs Run is granted a
higher priority first, first in first out within one; creates, batches, fan-outs, schedules and
reruns all take it; anything but an integer from 0 to 9 is a 422 naming `priority`.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`; db-1 on host-b,
owned by `stranger`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_harness import Cast, http_world
from tests.support.stores import StoreFactory

MINUTE = 60_000


@pytest.fixture
def cast(store_factory: StoreFactory, tmp_path: Path) -> Iterator[Cast]:
    with http_world(store_factory, tmp_path) as cast:
        yield cast


def submit(cast: Cast, **body: Any) -> dict[str, Any]:
    return cast.world.submit(cast.server_id, cast.owner[1], **body)


def test_run_is_granted_a_higher_priority_first_and_fifo_within_one(cast: Cast) -> None:
    plain = submit(cast)
    low = submit(cast, priority=1)
    urgent = submit(cast, priority=9)
    also_plain = submit(cast, priority=5)
    also_urgent = submit(cast, priority=9)
    assert [job["priority"] for job in (plain, low, urgent)] == [5, 1, 9]
    run = cast.run.start()
    granted = []
    for _ in range(5):
        (grant,) = run.claim(1)
        run.ack(grant["job_id"], grant["attempt"])
        run.result(grant["job_id"], grant["attempt"], "succeeded")
        granted.append(grant["job_id"])
    assert granted == [
        urgent["id"],
        also_urgent["id"],
        plain["id"],
        also_plain["id"],
        low["id"],
    ]


def test_batches_fanouts_and_reruns_carry_the_priority(cast: Cast) -> None:
    world, token = cast.world, cast.owner[1]
    batch = world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/jobs/batch",
        token=token,
        json={"jobs": [{"kind": "noop", "priority": 2}, {"kind": "noop"}]},
    )
    assert batch.status_code == 201, batch.text
    assert [job["priority"] for job in batch.json()["jobs"]] == [2, 5]

    labelled = world.api(
        "PUT", f"/api/v1/servers/{cast.server_id}/labels", token=token, json={"labels": {"r": "w"}}
    )
    assert labelled.status_code == 200, labelled.text
    fanout = world.api(
        "POST",
        "/api/v1/jobs/fanout",
        token=token,
        json={"selector": "r=w", "kind": "noop", "priority": 8},
    )
    assert fanout.status_code == 201, fanout.text
    assert [job["priority"] for job in fanout.json()["jobs"]] == [8]

    run = cast.run.start()
    (grant,) = run.claim(1)
    assert grant["job_id"] == fanout.json()["jobs"][0]["id"]
    run.ack(grant["job_id"], grant["attempt"])
    run.result(grant["job_id"], grant["attempt"], "succeeded")
    rerun = world.api("POST", f"/api/v1/jobs/{grant['job_id']}/rerun", token=token)
    assert rerun.status_code == 201, rerun.text
    assert rerun.json()["priority"] == 8


def test_a_schedules_jobs_carry_its_priority(cast: Cast) -> None:
    world = cast.world
    created = world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        token=cast.owner[1],
        json={"name": "urgent", "cron": "* * * * *", "job": {"kind": "noop", "priority": 7}},
    )
    assert created.status_code == 201, created.text
    assert created.json()["job"]["priority"] == 7
    plain = world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        token=cast.owner[1],
        json={"name": "plain", "cron": "* * * * *", "job": {"kind": "noop"}},
    )
    assert plain.json()["job"]["priority"] == 5
    now = world.clock.now()
    world.clock.advance((now // MINUTE + 1) * MINUTE - now + 100)
    world.platform.service.schedules.fire_due()
    listed = world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    by_schedule = {job["schedule"]["id"]: job["priority"] for job in listed if job["schedule"]}
    assert by_schedule == {created.json()["id"]: 7, plain.json()["id"]: 5}


@pytest.mark.parametrize("priority", [-1, 10, "5", 5.0, True, None])
def test_a_priority_that_is_not_an_integer_from_0_to_9_is_a_422_naming_it(
    cast: Cast, priority: Any
) -> None:
    token = cast.owner[1]
    for path, body in (
        (f"/api/v1/servers/{cast.server_id}/jobs", {"kind": "noop"}),
        (f"/api/v1/servers/{cast.server_id}/jobs/batch", {"jobs": [{"kind": "noop"}]}),
        ("/api/v1/jobs/fanout", {"selector": "a=b", "kind": "noop"}),
        (
            f"/api/v1/servers/{cast.server_id}/schedules",
            {"name": "s", "cron": "* * * * *", "job": {"kind": "noop"}},
        ),
    ):
        target = body["jobs"][0] if "jobs" in body else body.get("job", body)
        target["priority"] = priority
        answer = cast.world.api("POST", path, token=token, json=body)
        if priority is None:  # null is the default
            assert answer.status_code != 422 or "priority" not in answer.text, answer.text
            continue
        assert answer.status_code == 422, (path, answer.text)
        assert "priority" in answer.text, (path, answer.text)
