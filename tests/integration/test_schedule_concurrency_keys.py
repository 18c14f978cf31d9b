"""A schedule's job takes a concurrency key like a create (docs/protocol.md, "Schedules",
"Concurrency keys"): its view shows the key and limit; each firing's job carries them, is
released by its key at once when a place is free and held while its key's limit is under way;
a bad key or limit is a 422 naming the field.

The cast (tests/support/http_harness.py): web-1 on host-a, owned by `owner`.
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


def create(cast: Cast, **job: Any) -> Any:
    return cast.world.api(
        "POST",
        f"/api/v1/servers/{cast.server_id}/schedules",
        token=cast.owner[1],
        json={
            "name": "backup",
            "cron": "* * * * *",
            "overlap": "allow",
            "job": {"kind": "noop", **job},
        },
    )


def fire_next_minute(cast: Cast) -> None:
    now = cast.world.clock.now()
    cast.world.clock.advance((now // MINUTE + 1) * MINUTE - now + 100)
    cast.world.platform.service.schedules.fire_due()


def jobs_of(cast: Cast, schedule_id: str) -> list[dict[str, Any]]:
    listed = cast.world.api("GET", "/api/v1/jobs", token=cast.owner[1]).json()["jobs"]
    mine = [job for job in listed if (job["schedule"] or {}).get("id") == schedule_id]
    return sorted(mine, key=lambda job: job["schedule"]["scheduled_for"])


def test_each_firing_carries_the_key_and_waits_for_a_place_of_its_limit(cast: Cast) -> None:
    created = create(cast, concurrency={"key": "nightly-backup"})
    assert created.status_code == 201, created.text
    assert created.json()["job"]["concurrency"] == {"key": "nightly-backup", "limit": 1}
    schedule_id = created.json()["id"]

    fire_next_minute(cast)
    (first,) = jobs_of(cast, schedule_id)
    assert first["concurrency"] == {"key": "nightly-backup", "limit": 1, "held": False}
    fire_next_minute(cast)  # the first has not ended: the second waits for its key
    second = jobs_of(cast, schedule_id)[1]
    assert second["concurrency"]["held"] is True

    run = cast.run.start()
    (grant,) = run.claim(1)
    assert grant["job_id"] == first["id"]
    assert run.claim(1) == []
    run.ack(grant["job_id"], grant["attempt"])
    run.result(grant["job_id"], grant["attempt"], "succeeded")
    (next_grant,) = run.claim(1)
    assert next_grant["job_id"] == second["id"]


def test_a_bad_concurrency_key_of_a_schedules_job_is_a_422_naming_it(cast: Cast) -> None:
    for concurrency, field in (
        ({"key": "k", "limit": 0}, "limit"),
        ({"key": ""}, "key"),
        ({"limit": 2}, "key"),
    ):
        answer = create(cast, concurrency=concurrency)
        assert answer.status_code == 422, answer.text
        assert field in answer.text, answer.text
